"""Helpers shared by the tests and the benchmarks (never used by the product): fabricated point
files with known contents (fabricate.py), real MPI ranks on this host (mpi.py), and small
dataset files in the real formats (datasets.py)."""
