"""Executors, one module each, found by name through `EXECUTORS`."""

from hpcbench.executors.base import EXECUTORS, Executor, catalog

__all__ = ["EXECUTORS", "Executor", "catalog"]
