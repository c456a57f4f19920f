"""Splitting one CSV line into fields."""


def split_line(line, sep=","):
    if len(sep) != 1:
        raise ValueError("sep must be one character")
    return [field.strip() for field in line.rstrip("\n").split(sep)]
