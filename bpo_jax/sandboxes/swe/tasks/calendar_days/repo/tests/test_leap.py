from caldays import is_leap


def test_ordinary_years():
    assert is_leap(2024) and not is_leap(2023)


def test_400_year_centuries():
    assert is_leap(2000) and is_leap(1600)
