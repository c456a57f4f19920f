"""Spread and summaries."""
from stats.center import mean, median


def iqr(values):
    """Interquartile range by medians of the lower and upper halves (Tukey's hinges)."""
    ordered = sorted(values)
    if len(ordered) < 2:
        raise ValueError("iqr needs at least two values")
    half = len(ordered) // 2
    lower, upper = ordered[:half], ordered[-half:]
    return median(upper) - median(lower)


def describe(values):
    values = list(values)
    return {"n": len(values), "mean": mean(values), "median": median(values),
            "min": min(values), "max": max(values)}
