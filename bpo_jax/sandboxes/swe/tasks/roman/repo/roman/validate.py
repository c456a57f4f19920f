"""Canonical form checks."""
import re

from roman.convert import from_roman, to_roman

_CANONICAL = re.compile(r"^M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})$")


def is_canonical(text):
    """True if `text` is the standard spelling of its value."""
    return bool(text) and bool(_CANONICAL.match(text)) and to_roman(from_roman(text)) == text
