"""Helpers shared by the tests and the benchmarks (not used by the product): fabricated point
files with known contents (fabricate.py)."""
