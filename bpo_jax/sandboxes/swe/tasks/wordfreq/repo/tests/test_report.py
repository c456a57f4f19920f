import pytest

from wordfreq import format_report, top_words


def test_top_distinct_counts():
    assert top_words("x y y z z z", 2) == [("z", 3), ("y", 2)]


def test_bad_k():
    with pytest.raises(ValueError):
        top_words("a", 0)


def test_report():
    assert format_report("q q r", 1) == "q: 2"
