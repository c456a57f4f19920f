"""Tokenising and counting words."""
from collections import Counter


def tokenize(text):
    return text.split()


def count_words(text):
    return dict(Counter(tokenize(text)))
