"""The HDF5 point file: layout (schema), writers (parallel or gathered) and the reader."""

from hpcbench.store.schema import ITERATION_DTYPE, PHASES, RANK_DTYPE, SCHEMA_VERSION

__all__ = ["ITERATION_DTYPE", "PHASES", "RANK_DTYPE", "SCHEMA_VERSION"]
