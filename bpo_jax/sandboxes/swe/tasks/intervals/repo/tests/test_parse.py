from intervals import format_ranges, parse_ranges


def test_parse_single_points():
    assert parse_ranges("4, 2") == [(2, 2), (4, 4)]


def test_round_trip():
    assert format_ranges(parse_ranges("1-3,7-9,5")) == "1-3,5,7-9"
