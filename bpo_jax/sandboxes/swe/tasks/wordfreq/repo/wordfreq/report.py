"""Frequency reports."""
from wordfreq.count import count_words


def top_words(text, k):
    if k < 1:
        raise ValueError("k must be at least 1")
    counts = count_words(text)
    return sorted(counts.items(), key=lambda item: -item[1])[:k]


def format_report(text, k=3):
    return "\n".join(f"{word}: {n}" for word, n in top_words(text, k))
