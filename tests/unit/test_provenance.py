"""hpcbench.rank.provenance.recorded_environment: keep performance variables, mask secrets."""

from __future__ import annotations

import pytest

from hpcbench.rank.provenance import recorded_environment

ENV = {
    "OMP_NUM_THREADS": "4",
    "MKL_NUM_THREADS": "4",
    "NCCL_DEBUG": "INFO",
    "NCCL_IB_HCA": "mlx5_0",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "OMPI_MCA_btl": "^openib",
    "I_MPI_PIN": "1",
    "SLURM_JOB_ID": "12345",
    "HPCBENCH_WRITER": "gather",
    # secrets among recorded prefixes
    "HPCBENCH_API_TOKEN": "tok-123",
    "NCCL_SECRET": "s3cr3t",
    "TF_API_KEY": "k-1",
    "HOROVOD_PASSWORD": "hunter2",
    "UCX_PASS": "pw",
    "FI_CREDENTIAL_FILE": "/home/u/.cred",
    "HPCBENCH_db_password": "lower",
    # unrelated
    "HOME": "/root",
    "PATH": "/usr/bin",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "GITHUB_TOKEN": "gh",
    "SLURM_PROCID": "0",
    "XOMP_NUM_THREADS": "9",
    "LD_LIBRARY_PATH": "/opt/lib",
}
SECRET_VALUES = ("tok-123", "s3cr3t", "k-1", "hunter2", "pw", "/home/u/.cred", "lower", "aws", "gh")


def test_keeps_performance_variables_with_values() -> None:
    rec = recorded_environment(ENV)
    for name in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NCCL_DEBUG",
        "NCCL_IB_HCA",
        "CUDA_VISIBLE_DEVICES",
        "OMPI_MCA_btl",
        "I_MPI_PIN",
        "SLURM_JOB_ID",
        "HPCBENCH_WRITER",
    ):
        assert rec[name] == ENV[name], name


@pytest.mark.parametrize(
    "name",
    [
        "HPCBENCH_API_TOKEN",
        "NCCL_SECRET",
        "TF_API_KEY",
        "HOROVOD_PASSWORD",
        "UCX_PASS",
        "FI_CREDENTIAL_FILE",
        "HPCBENCH_db_password",
    ],
)
def test_masks_secret_looking_names(name: str) -> None:
    rec = recorded_environment(ENV)
    assert name in rec  # the name is kept: it tells that the variable was set
    assert rec[name] != ENV[name]
    assert ENV[name] not in rec[name]


def test_drops_unrelated_variables() -> None:
    rec = recorded_environment(ENV)
    for name in ("HOME", "PATH", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "SLURM_PROCID", "XOMP_NUM_THREADS"):
        assert name not in rec, name
    assert "LD_LIBRARY_PATH" not in rec


def test_no_secret_value_appears_anywhere() -> None:
    rec = recorded_environment(ENV)
    text = repr(rec)
    for value in SECRET_VALUES:
        assert value not in text


def test_empty_environment_and_default_source(monkeypatch: pytest.MonkeyPatch) -> None:
    assert recorded_environment({}) == {}
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("NCCL_AUTH_TOKEN", "zzz")
    monkeypatch.setenv("UNRELATED_HPCB_VAR", "x")
    rec = recorded_environment()
    assert rec["NCCL_ALGO"] == "Ring"
    assert rec["NCCL_AUTH_TOKEN"] != "zzz"
    assert "UNRELATED_HPCB_VAR" not in rec
