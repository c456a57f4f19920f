from lrucache import memoize


def test_memoizes():
    calls = []

    @memoize(4)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(2), square(2), square(3)] == [4, 4, 9]
    assert calls == [2, 3]
