def is_leap(year):
    """Whether `year` has a 29 February in the Gregorian calendar."""
    return year % 4 == 0
