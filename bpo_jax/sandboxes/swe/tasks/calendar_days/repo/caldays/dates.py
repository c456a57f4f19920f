"""Day counting without the datetime module."""
from caldays.leap import is_leap

_MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError(f"month {month} is not in 1..12")
    return 29 if month == 2 and is_leap(year) else _MONTH_DAYS[month - 1]


def day_of_year(year, month, day):
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"day {day} is not in month {month} of {year}")
    return sum(days_in_month(year, m) for m in range(1, month)) + day


def _ordinal(year, month, day):
    return sum(366 if is_leap(y) else 365 for y in range(1, year)) + day_of_year(year, month, day)


def days_between(start, end):
    """Days from date tuple `start` to `end`."""
    return _ordinal(*end) - _ordinal(*start)
