"""Choosing versions."""
import functools

from semver.version import compare


def latest(versions):
    if not versions:
        raise ValueError("no versions given")
    return max(versions, key=functools.cmp_to_key(compare))


def satisfies(version, minimum):
    return compare(version, minimum) >= 0
