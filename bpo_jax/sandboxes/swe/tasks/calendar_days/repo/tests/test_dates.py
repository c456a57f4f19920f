import pytest

from caldays import day_of_year, days_between, days_in_month


def test_days_in_month():
    assert [days_in_month(2023, m) for m in (1, 2, 4)] == [31, 28, 30]


def test_day_of_year():
    assert day_of_year(2024, 3, 1) == 61


def test_days_between_recent():
    assert days_between((2020, 1, 1), (2021, 1, 1)) == 366


def test_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2020, 13)
