"""Parsing and ordering MAJOR.MINOR.PATCH[-PRERELEASE] versions."""
import re

_PATTERN = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.]+))?$")


def parse(text):
    match = _PATTERN.match(text.strip())
    if not match:
        raise ValueError(f"not a version: {text!r}")
    major, minor, patch, pre = match.groups()
    return major, minor, patch, pre


def _key(text):
    major, minor, patch, pre = parse(text)
    return (major, minor, patch, pre or "")


def compare(a, b):
    """-1, 0 or 1 as version `a` is older than, equal to or newer than `b`."""
    ka, kb = _key(a), _key(b)
    return (ka > kb) - (ka < kb)
