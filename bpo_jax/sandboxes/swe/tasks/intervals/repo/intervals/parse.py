"""Text form of interval lists: "1-3,7-9"."""
from intervals.core import merge


def parse_ranges(text):
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return merge(out)


def format_ranges(intervals):
    return ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in merge(intervals))
