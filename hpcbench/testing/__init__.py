"""Helpers shared by the tests and the benchmarks (never used by the product): fabricated point
files with known contents (fabricate.py), real MPI ranks on this host (mpi.py), small
dataset files in the real formats (datasets.py), what the kill-at-random and soak tests check
of a struck point (crash.py), and hpcbench installed as a user installs it (installed.py)."""
