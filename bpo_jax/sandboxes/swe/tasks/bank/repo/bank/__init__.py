from bank.account import Account, InsufficientFunds
from bank.ledger import Ledger
