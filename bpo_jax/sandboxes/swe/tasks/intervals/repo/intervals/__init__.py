"""Closed integer intervals."""
from intervals.core import merge, total_length
from intervals.parse import parse_ranges, format_ranges
