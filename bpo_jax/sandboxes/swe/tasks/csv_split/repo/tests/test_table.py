import pytest

from csvlite import read_table


def test_rows():
    assert read_table("x,y\n1,2\n\n3,4\n") == [{"x": "1", "y": "2"}, {"x": "3", "y": "4"}]


def test_ragged():
    with pytest.raises(ValueError, match="line 2"):
        read_table("x,y\n1\n")
