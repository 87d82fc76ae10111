"""Theano 1.0.5 (legacy environment) or PyTensor (modern): compiled functions, MPI all-reduce.

adapter.py is the registered framework (`theano`, backend `mpi`); library.py picks Theano or
PyTensor and sets its flags before importing it; layers.py builds every zoo model as
graphs, split layer by layer so that forward and backward are timed apart."""

from hpcbench.frameworks.theano.adapter import TheanoFramework

__all__ = ["TheanoFramework"]
