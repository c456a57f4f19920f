import pytest

from stats import mean, median


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_empty():
    with pytest.raises(ValueError):
        median([])
