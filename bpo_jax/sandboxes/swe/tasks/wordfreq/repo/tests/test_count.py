from wordfreq import count_words


def test_plain_words():
    assert count_words("a b a") == {"a": 2, "b": 1}
