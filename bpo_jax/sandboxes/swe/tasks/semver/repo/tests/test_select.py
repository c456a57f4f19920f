from semver import latest, satisfies


def test_latest_simple():
    assert latest(["0.1.0", "0.3.0", "0.2.0"]) == "0.3.0"


def test_satisfies():
    assert satisfies("1.4.0", "1.2.0") and not satisfies("1.1.0", "1.2.0")
