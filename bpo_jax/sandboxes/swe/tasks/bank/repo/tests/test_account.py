import pytest

from bank import Account, InsufficientFunds


def test_deposit_withdraw():
    a = Account("x", 100)
    a.deposit(50)
    a.withdraw(30)
    assert a.balance == 120


def test_overdraw():
    with pytest.raises(InsufficientFunds):
        Account("x", 10).withdraw(11)
