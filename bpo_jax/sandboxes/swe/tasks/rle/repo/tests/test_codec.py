import pytest

from rle import decode, encode


def test_encode():
    assert encode("aaabcc") == "3a1b2c"


def test_decode_short_runs():
    assert decode("3a1b2c") == "aaabcc"


def test_malformed():
    with pytest.raises(ValueError):
        decode("a3")
