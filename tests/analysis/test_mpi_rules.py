"""The all-reduce algorithm an MPI library picks per message and rank count, and the model that
follows it: Open MPI's rules on known sizes, the algorithms' step counts worked out by hand,
and a sweep whose 4-rank exchange ran Rabenseifner's algorithm predicted exactly from 1 and 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbench.analysis import pipeline
from hpcbench.analysis.model import mpi_rules
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.analysis.model.mpi_rules import DOUBLING, RABENSEIFNER, REDUCE_BCAST, RING
from hpcbench.testing.arrays import ALPHA, BETA, TB, hand_schedule, model_point

OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
KiB, MiB = 1024, 1024 * 1024


@pytest.mark.parametrize(
    ("n", "p", "expected"),
    [
        (4, 2, RING), (2 * KiB, 2, DOUBLING), (6 * KiB, 2, RING), (12 * KiB, 2, DOUBLING), (32 * KiB, 2, RING),
        (128 * KiB, 2, RING), (256 * KiB, 2, RABENSEIFNER), (MiB, 3, RABENSEIFNER),
        (8, 4, RING), (4 * KiB, 4, DOUBLING), (8 * KiB, 4, RABENSEIFNER), (MiB, 7, RABENSEIFNER),
        (4 * KiB, 8, DOUBLING), (MiB, 8, RABENSEIFNER), (100 * KiB, 100, DOUBLING), (64 * KiB, 200, REDUCE_BCAST),
        (8 * KiB, 1000, DOUBLING), (MiB, 1000, RABENSEIFNER),
    ],
)  # fmt: skip
def test_open_mpi_4_1_picks_as_its_fixed_rules_do(n: int, p: int, expected: str) -> None:
    assert mpi_rules.algorithm("open-mpi-4.1", n, p) == expected


def test_older_open_mpi_mpich_and_unknown_libraries() -> None:
    assert mpi_rules.algorithm("open-mpi", 9_999, 4) == DOUBLING
    assert mpi_rules.algorithm("open-mpi", 10_000, 4) == RING
    assert mpi_rules.algorithm("mpich", 2048, 4) == DOUBLING
    assert mpi_rules.algorithm("mpich", 2049, 4) == RABENSEIFNER
    assert mpi_rules.algorithm("", 100, 4) == RING


def test_the_library_is_read_from_its_version_string_and_a_forced_algorithm_wins() -> None:
    assert mpi_rules.library(OPEN_MPI) == "open-mpi-4.1"
    assert mpi_rules.library("Open MPI v5.0.3, package: Open MPI") == "open-mpi-4.1"
    assert mpi_rules.library("Open MPI v4.0.7, package: Open MPI") == "open-mpi"
    assert mpi_rules.library("MPICH Version:      4.1.2") == "mpich"
    assert mpi_rules.library("Intel(R) MPI Library 2021.6 for Linux* OS") == ""
    assert mpi_rules.library(None) == ""
    ring = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}
    assert mpi_rules.library(OPEN_MPI, ring) == mpi_rules.FORCED + RING
    assert mpi_rules.algorithm(mpi_rules.library(OPEN_MPI, ring), 100, 4) == RING
    # the algorithm alone, without dynamic rules, is ignored by Open MPI
    assert mpi_rules.library(OPEN_MPI, {"OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}) == "open-mpi-4.1"


@pytest.mark.parametrize(
    ("name", "p", "expected"),
    [
        (RING, 4, (6, 1.5, 0.75)), (DOUBLING, 2, (1, 1, 1)), (DOUBLING, 4, (2, 2, 2)), (RABENSEIFNER, 2, (2, 1, 0.5)),
        (RABENSEIFNER, 8, (6, 1.75, 0.875)), (REDUCE_BCAST, 8, (6, 6, 3)),
        # 3 ranks: one extra rank hands its n bytes to a partner and gets the result back
        (DOUBLING, 3, (1 + 2, 1 + 2, 1 + 1)), (RABENSEIFNER, 3, (2 + 2, 1 + 2, 0.5 + 1)),
        (RING, 1, (0, 0, 0)),
    ],
)  # fmt: skip
def test_steps_of_each_algorithm(name: str, p: int, expected: tuple[float, float, float]) -> None:
    assert mpi_rules.steps(name, p) == pytest.approx(expected)


def test_cost_follows_the_chosen_algorithm() -> None:
    link = LinkCost(1e-5, 1e-9, 1e-10)
    # 1 KiB on 4 ranks: recursive doubling, 2 steps of 1 KiB each sent and reduced
    assert mpi_rules.cost("open-mpi-4.1", KiB, 4, link) == pytest.approx(2e-5 + KiB * (2e-9 + 2e-10))
    # 1 MiB on 4 ranks: Rabenseifner's, 4 steps, 1.5 MiB sent, 0.75 MiB reduced
    assert mpi_rules.cost("open-mpi-4.1", MiB, 4, link) == pytest.approx(4e-5 + MiB * (1.5e-9 + 0.75e-10))


def _sweep(directory: Path, mpi: str) -> dict[int, float]:
    """An MPI backend's points on 1, 2 and 4 ranks whose all-reduces (gradients of 0.4 and 1 MB)
    ran as Open MPI 4.1 runs them: Rabenseifner's algorithm, which on 2 ranks costs what a ring
    does (2 α + M β) and on 4 ranks 4 α + 1.5 M β where a ring takes 6 α."""
    directory.mkdir()
    return {n: model_point(directory, n, backend="mpi", steps=4 if n == 4 else None, mpi=mpi)[1] for n in (1, 2, 4)}


def test_an_open_mpi_exchange_is_predicted_with_the_librarys_algorithm(tmp_path: Path) -> None:
    truth = _sweep(tmp_path / "open-mpi", OPEN_MPI)
    pred = pipeline.analyse(tmp_path / "open-mpi").predictions.set_index("ranks")
    assert pred.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    assert pred.loc[4, "pred_comm_total_s"] == pytest.approx(hand_schedule(4, steps=4)[1], rel=1e-6)
    # the link fitted on 2 ranks' messages is the one the points were made with
    assert pred.loc[4, "alpha_s"] == pytest.approx(ALPHA)
    assert pred.loc[4, "beta_s_per_byte"] == pytest.approx(BETA)
    assert "open-mpi-4.1 all-reduce rules" in str(pred.loc[4, "comm_source"])


def test_a_library_without_known_rules_is_predicted_as_a_ring(tmp_path: Path) -> None:
    truth = _sweep(tmp_path / "other", "Intel(R) MPI Library 2021.6 for Linux* OS")
    pred = pipeline.analyse(tmp_path / "other").predictions.set_index("ranks")
    ring = hand_schedule(4)[1]
    assert pred.loc[4, "pred_comm_total_s"] == pytest.approx(ring, rel=1e-6)
    # a ring's 6 α steps per message where the points took 4: slower than measured
    assert pred["predicted_t_iter_s"].to_dict()[4] > truth[4]


def test_an_exchange_through_mpi_allreduce_is_served_after_backward(tmp_path: Path) -> None:
    # torch `mpi` hands each gradient to a non-blocking MPI all-reduce during backward, but
    # Open MPI progresses it only inside MPI calls: it is served in the wait after backward
    # (benchmarks/mpi_progress.py), and predicted so, with or without wait-free back-propagation
    truth = _sweep(tmp_path / "mpi", OPEN_MPI)
    pred = pipeline.analyse(tmp_path / "mpi").predictions.set_index("ranks")
    assert pred.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    assert pred["predicted_t_iter_s"].tolist() == pred["predicted_no_overlap_s"].tolist()
    # served beside backward, the first message would have hidden behind layer 1's backward
    exposed = pred["pred_comm_exposed_s"].to_dict()[4]
    assert exposed - hand_schedule(4, steps=4)[0] == pytest.approx(TB[0], rel=1e-6)
    # a gloo ring's messages are served beside backward: wait-free back-propagation hides some
    (tmp_path / "gloo").mkdir()
    for n in (1, 2):
        model_point(tmp_path / "gloo", n)
    ring = pipeline.analyse(tmp_path / "gloo").predictions.set_index("ranks")
    assert ring["predicted_t_iter_s"].to_dict()[2] < ring["predicted_no_overlap_s"].to_dict()[2]
