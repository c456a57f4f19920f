"""Test support: random trees, tabular MDPs with exact enumeration, NumPy references."""
