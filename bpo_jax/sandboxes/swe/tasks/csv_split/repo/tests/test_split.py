import pytest

from csvlite import split_line


def test_plain():
    assert split_line("a, b,c\n") == ["a", "b", "c"]


def test_other_separator():
    assert split_line("1;2", sep=";") == ["1", "2"]


def test_bad_separator():
    with pytest.raises(ValueError):
        split_line("a", sep="::")
