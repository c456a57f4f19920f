from roman import is_canonical


def test_rejects_non_canonical():
    assert not is_canonical("IIII")
    assert not is_canonical("VX")
