"""What a point ran on: hosts, versions, libraries and selected environment variables."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

import hpcbench
from hpcbench.rank import collectives as comm

# Variables that shape performance; recorded with their values (secrets masked).
RECORDED_PREFIXES = (
    "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "NCCL_", "UCX_", "OMPI_MCA_", "PMIX_MCA_",
    "I_MPI_", "FI_", "GLOO_", "HOROVOD_", "TF_", "MXNET_", "DMLC_", "CUDA_VISIBLE_DEVICES",
    "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION", "HPCBENCH_",
)  # fmt: skip
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "AUTH", "COOKIE", "PRIVATE")
MASK = "***"


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def recorded_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The performance-relevant variables of `env`; values of secret-looking names masked."""
    env = os.environ if env is None else env
    return {
        name: (MASK if is_secret(name) else value)
        for name, value in sorted(env.items())
        if name.startswith(RECORDED_PREFIXES)
    }


def blas_info() -> list[dict[str, Any]]:
    """BLAS / OpenMP libraries loaded in this process and their thread counts."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("user_api", "internal_api", "prefix", "version", "num_threads", "threading_layer")
    return [{k: info.get(k) for k in keep} for info in threadpool_info()]


def collect() -> dict[str, Any]:
    """Provenance of this process (call on one rank; it is broadcast to the others)."""
    return {
        "hpcbench": hpcbench.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count() or 0,
        "numpy": np.__version__,
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "mpi": comm.library_version() or "",
        "blas": blas_info(),
        "environment": recorded_environment(),
    }
