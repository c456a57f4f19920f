import pytest

from intervals import merge, total_length


def test_merge_overlapping():
    assert merge([(5, 8), (1, 4), (2, 6)]) == [(1, 8)]


def test_merge_disjoint_sorted():
    assert merge([(7, 9), (1, 2)]) == [(1, 2), (7, 9)]


def test_rejects_reversed():
    with pytest.raises(ValueError):
        merge([(3, 1)])


def test_total_length():
    assert total_length([(0, 2), (1, 4), (10, 11)]) == 5
