import pytest

from roman import from_roman, to_roman


@pytest.mark.parametrize("number,text", [(1, "I"), (3, "III"), (8, "VIII"), (30, "XXX"),
                                         (2023 - 20, "MMIII")])
def test_additive(number, text):
    assert to_roman(number) == text


def test_from_roman_subtractive():
    assert from_roman("MCMXCIV") == 1994


def test_rejects_out_of_range():
    with pytest.raises(ValueError):
        to_roman(0)
