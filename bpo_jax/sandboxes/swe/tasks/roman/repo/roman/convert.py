"""Integers <-> Roman numerals (1..3999)."""

_VALUES = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]
_DIGITS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number):
    if not isinstance(number, int) or not 0 < number < 4000:
        raise ValueError(f"cannot write {number!r} in Roman numerals")
    out = []
    for value, letters in _VALUES:
        count, number = divmod(number, value)
        out.append(letters * count)
    return "".join(out)


def from_roman(text):
    if not text or any(c not in _DIGITS for c in text):
        raise ValueError(f"not a Roman numeral: {text!r}")
    total = 0
    for i, c in enumerate(text):
        value = _DIGITS[c]
        if i + 1 < len(text) and _DIGITS[text[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
