"""Merging closed intervals [lo, hi]."""


def _check(interval):
    lo, hi = interval
    if lo > hi:
        raise ValueError(f"interval {interval!r} has lo > hi")
    return lo, hi


def merge(intervals):
    """Sorted list of disjoint intervals covering the same points as `intervals`."""
    ordered = sorted(_check(i) for i in intervals)
    merged = []
    for lo, hi in ordered:
        if merged and lo < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def total_length(intervals):
    """Total length of the union of the intervals."""
    return sum(hi - lo for lo, hi in merge(intervals))
