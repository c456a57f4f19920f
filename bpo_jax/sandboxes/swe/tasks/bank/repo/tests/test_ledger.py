import pytest

from bank import InsufficientFunds, Ledger


def make():
    ledger = Ledger()
    ledger.open("alice", 100)
    ledger.open("bob", 5)
    return ledger


def test_transfer():
    ledger = make()
    ledger.transfer("alice", "bob", 40)
    assert (ledger.balance("alice"), ledger.balance("bob")) == (60, 45)
    assert ledger.history == [("alice", "bob", 40)]


def test_insufficient_leaves_balances():
    ledger = make()
    with pytest.raises(InsufficientFunds):
        ledger.transfer("bob", "alice", 6)
    assert ledger.total() == 105
