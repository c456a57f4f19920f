from stats import describe, iqr


def test_describe_odd():
    assert describe([3, 1, 2]) == {"n": 3, "mean": 2, "median": 2, "min": 1, "max": 3}


def test_iqr_odd_halves():
    assert iqr([1, 2, 3, 4, 5, 6, 7]) == 4
