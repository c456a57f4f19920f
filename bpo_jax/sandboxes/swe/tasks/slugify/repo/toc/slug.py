"""Heading anchors."""
import re


def slugify(text):
    text = text.strip().lower()
    return re.sub(r"\s+", "-", text)


def unique_slugs(headings):
    return [slugify(h) for h in headings]
