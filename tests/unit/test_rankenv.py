"""hpcbench.rank.env: rank layout from each launcher's environment variables."""

from __future__ import annotations

import pytest

from hpcbench.launchers import detect
from hpcbench.rank.env import RankEnv, slurm_tasks_per_node

# What `srun` sets for task 4 of `srun -N 3 -n 7` with SLURM_TASKS_PER_NODE=3,2(x2):
# tasks 0-2 on node 0, 3-4 on node 1, 5-6 on node 2.
SLURM_TASK4 = {
    "SLURM_JOB_ID": "1234",
    "SLURM_PROCID": "4",
    "SLURM_NTASKS": "7",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "3,2(x2)",
    "SLURMD_NODENAME": "cn002",
}


def test_single_process() -> None:
    r = detect({}, hostname="box")
    assert r == RankEnv(0, 1, 0, 1, 0, "box", "single", mpi=False)
    assert r.is_root


def test_single_process_unrelated_variables_are_ignored() -> None:
    r = detect({"HOME": "/root", "RANKING": "3", "PMI_RANK": "2"}, hostname="box")  # PMI_RANK without PMI_SIZE
    assert r.source == "single"
    assert (r.rank, r.size) == (0, 1)


def test_hostname_comes_from_argument_then_slurmd_nodename() -> None:
    assert detect({"SLURMD_NODENAME": "cn042"}, hostname="given").hostname == "given"
    assert detect({"SLURMD_NODENAME": "cn042"}).hostname == "cn042"
    assert detect({}).hostname  # falls back to this host's name


def test_open_mpi() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_COMM_WORLD_NODE_RANK": "1",
    }
    r = detect(env, hostname="n1")
    assert (r.rank, r.size, r.local_rank, r.local_size, r.node_rank) == (3, 4, 1, 2, 1)
    assert (r.source, r.mpi, r.is_root) == ("openmpi", True, False)


def test_open_mpi_node_rank_is_the_nodes_index() -> None:
    # mpirun -n 4 --map-by ppr:2:node on two nodes; rank 2 is the first rank of the second node.
    # OMPI_COMM_WORLD_NODE_RANK is "the relative rank of this process on this node looking
    # across all jobs" (Open MPI docs), i.e. 0 here: it is not the index of the node.
    env = {
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_COMM_WORLD_NODE_RANK": "0",
    }
    r = detect(env, hostname="n1")
    assert (r.rank, r.local_rank, r.local_size) == (2, 0, 2)
    assert r.node_rank == 1


def test_open_mpi_wins_over_slurm_when_mpirun_runs_in_a_batch_job() -> None:
    env = {
        **SLURM_TASK4,
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    r = detect(env)
    assert (r.source, r.rank, r.size, r.local_rank, r.local_size) == ("openmpi", 5, 8, 1, 4)
    assert r.hostname == "cn002"


def test_torchrun_standalone() -> None:
    env = {
        "TORCHELASTIC_RUN_ID": "abc",
        "RANK": "2",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
    }
    r = detect(env, hostname="h")
    assert r == RankEnv(2, 4, 2, 4, 0, "h", "torchrun", mpi=False)


def test_torchrun_without_run_id_and_without_group_rank() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    r = detect(env, hostname="h")
    assert (r.source, r.rank, r.size, r.local_rank, r.local_size, r.node_rank) == ("torchrun", 5, 8, 1, 4, 1)


def test_torchrun_inside_slurm_wins() -> None:
    env = {
        **SLURM_TASK4,
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "0",
        "TORCHELASTIC_RUN_ID": "job",
        "RANK": "6",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
    }
    r = detect(env)
    assert r == RankEnv(6, 8, 2, 4, 1, "cn002", "torchrun", mpi=False)


def test_torchrun_wins_over_an_inherited_pmi_environment() -> None:
    env = {"PMI_RANK": "0", "PMI_SIZE": "1", "TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2"}
    assert detect(env, hostname="h").source == "torchrun"


def test_mpich_hydra() -> None:
    env = {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
    r = detect(env, hostname="h")
    assert r == RankEnv(5, 8, 1, 4, 1, "h", "pmi", mpi=True)


def test_mpich_without_local_variables() -> None:
    r = detect({"PMI_RANK": "2", "PMI_SIZE": "3"}, hostname="h")
    assert (r.source, r.rank, r.size, r.local_rank, r.local_size, r.mpi) == ("pmi", 2, 3, 0, 1, True)


def test_slurm_srun() -> None:
    r = detect(SLURM_TASK4)
    assert r == RankEnv(4, 7, 1, 2, 1, "cn002", "slurm", mpi=False)


def test_slurm_srun_with_pmix_is_mpi() -> None:
    r = detect({**SLURM_TASK4, "PMIX_RANK": "4"})
    assert (r.source, r.mpi) == ("slurm", True)


def test_slurm_local_size_of_last_node_and_malformed_list() -> None:
    env = {**SLURM_TASK4, "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"}
    assert detect(env).local_size == 3
    env = {**SLURM_TASK4, "SLURM_NODEID": "2", "SLURM_PROCID": "6"}
    assert detect(env).local_size == 2
    env = {**SLURM_TASK4, "SLURM_TASKS_PER_NODE": "garbage"}
    assert detect(env).local_size == 1
    env = {k: v for k, v in SLURM_TASK4.items() if k != "SLURM_TASKS_PER_NODE"}
    assert detect(env).local_size == 1


def test_slurm_job_without_step_variables_is_single() -> None:
    # a batch script's own process has SLURM_JOB_ID but is not a task of an srun step
    r = detect({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURMD_NODENAME": "cn001"})
    assert (r.source, r.rank, r.size, r.hostname) == ("single", 0, 1, "cn001")


def test_non_numeric_values_fall_back_to_defaults() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": " 3 ",
        "OMPI_COMM_WORLD_SIZE": "four",
        "OMPI_COMM_WORLD_LOCAL_RANK": "-1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "",
    }
    r = detect(env, hostname="h")
    assert (r.rank, r.size, r.local_rank, r.local_size) == (3, 1, 0, 1)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("4", [4]),
        ("1,2,3", [1, 2, 3]),
        ("3,2(x2)", [3, 2, 2]),
        ("16(x2)", [16, 16]),
        ("1(x1)", [1]),
        ("2(x2),1(x3),4", [2, 2, 1, 1, 1, 4]),
        (" 2(x2) , 1 ", [2, 2, 1]),
    ],
)
def test_slurm_tasks_per_node_expands_every_node(spec: str, expected: list[int]) -> None:
    assert [slurm_tasks_per_node(spec, i) for i in range(len(expected))] == expected
    assert slurm_tasks_per_node(spec, len(expected)) is None
    assert slurm_tasks_per_node(spec, -1) is None


@pytest.mark.parametrize("spec", ["", "x", "2(x)", "2(3)", "2(x3", "(x3)", "2x3", "2(x3),", "-1", "2;1", "1.5"])
def test_slurm_tasks_per_node_malformed_is_none(spec: str) -> None:
    assert slurm_tasks_per_node(spec, 0) is None


def test_horovodrun_gloo_ranks() -> None:
    env = {
        "HOROVOD_RANK": "3",
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "1",
    }
    r = detect(env, hostname="box")
    assert (r.rank, r.size, r.local_rank, r.local_size, r.node_rank) == (3, 4, 1, 2, 1)
    assert r.source == "horovod" and not r.mpi
    # horovodrun over MPI is mpirun: Open MPI's variables win and MPI_Init finds the peers
    r = detect({**env, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, hostname="box")
    assert r.source == "openmpi" and r.mpi
