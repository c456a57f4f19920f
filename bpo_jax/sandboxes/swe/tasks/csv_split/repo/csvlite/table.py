"""Rows of dicts from CSV text."""
from csvlite.split import split_line


def read_table(text, sep=","):
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = split_line(lines[0], sep)
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        fields = split_line(line, sep)
        if len(fields) != len(header):
            raise ValueError(f"line {number} has {len(fields)} fields, expected {len(header)}")
        rows.append(dict(zip(header, fields)))
    return rows
