"""A set of accounts and the transfers between them."""
from bank.account import Account


class Ledger:
    def __init__(self):
        self.accounts = {}
        self.history = []

    def open(self, owner, balance=0):
        if owner in self.accounts:
            raise ValueError(f"{owner} already has an account")
        self.accounts[owner] = Account(owner, balance)

    def balance(self, owner):
        return self.accounts[owner].balance

    def transfer(self, source, target, amount):
        self.accounts[source].withdraw(amount)
        self.accounts[target].deposit(amount)
        self.history.append((source, target, amount))

    def total(self):
        return sum(a.balance for a in self.accounts.values())
