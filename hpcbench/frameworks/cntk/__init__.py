"""CNTK 2.7 (the `cntk` environment): CNTK computes, the rank all-reduces over MPI.

adapter.py is the registered framework (`cntk`, backend `mpi`); bridge.py starts CNTK's
Python 3.6 process beside the rank and shares the arrays with it; child.py is that process
(Python 3.6 code, run as a script, never imported by hpcbench)."""

from hpcbench.frameworks.cntk.adapter import CntkFramework

__all__ = ["CntkFramework"]
