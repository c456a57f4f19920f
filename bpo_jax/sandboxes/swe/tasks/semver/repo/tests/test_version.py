import pytest

from semver import compare, parse


def test_parse():
    assert parse("1.2.3-beta")[3] == "beta"


def test_parse_rejects():
    with pytest.raises(ValueError):
        parse("1.2")


def test_compare_simple():
    assert compare("1.2.3", "1.2.4") == -1
    assert compare("2.0.0", "2.0.0") == 0
