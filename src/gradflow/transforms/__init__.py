"""Canonicalization passes: rewrites that put a program in the forms reverse mode and the optimizer
expect, without changing what it computes. `NORMALIZE` and `OPTIMIZE` are both composed from them."""
