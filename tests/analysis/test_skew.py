"""The wait for the last rank: the expected largest of N normal draws, and a sweep whose
ranks wait for their last one, predicted at scales it was not calibrated on."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpcbench.analysis import pipeline
from hpcbench.analysis.model import skew
from hpcbench.testing.arrays import EXPECTED_MAX, model_point

# Expected largest of n standard normal draws, as the tables of normal order statistics give them.
PUBLISHED = {2: 1 / math.sqrt(math.pi), 3: 0.846284, 4: 1.029375, 5: 1.162964, 10: 1.538753, 100: 2.507594}


@pytest.mark.parametrize(("n", "expected"), PUBLISHED.items())
def test_expected_max_is_the_published_order_statistic(n: int, expected: float) -> None:
    assert skew.expected_max(n) == pytest.approx(expected, abs=1e-6)


def test_the_wait_grows_from_the_measured_ranks_and_one_rank_waits_for_no_one() -> None:
    assert skew.expected_max(1) == 0.0
    assert skew.growth(2, 4) == pytest.approx(1.029375 / 0.564190, rel=1e-5)
    assert skew.growth(4, 2) == pytest.approx(0.564190 / 1.029375, rel=1e-5)
    assert skew.growth(2, 1) == 0.0
    with pytest.raises(ValueError, match="n >= 1"):
        skew.expected_max(0)


LAST_RANK = 3e-3  # the wait for the last rank at 2 ranks (s)


def _sweep(directory: Path, last_rank: float, backend: str = "mpi") -> dict[int, float]:
    directory.mkdir()
    return {n: model_point(directory, n, backend=backend, last_rank=last_rank)[1] for n in (1, 2, 4)}


def test_the_wait_for_the_last_rank_is_measured_and_carried_to_other_scales(tmp_path: Path) -> None:
    truth = _sweep(tmp_path / "sweep", LAST_RANK)
    result = pipeline.analyse(tmp_path / "sweep")
    pred = result.predictions.set_index("ranks")
    # calibrated on 1 and 2 ranks, 4 ranks wait 3 ms × e(4) / e(2) = 5.47 ms for their last
    assert pred.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    assert bool(pred.loc[2, "calibration"]) and not bool(pred.loc[4, "calibration"])
    assert pred.loc[4, "pred_sync_wait_s"] == pytest.approx(LAST_RANK * EXPECTED_MAX[4] / EXPECTED_MAX[2], rel=1e-6)
    assert pred.loc[1, "pred_sync_wait_s"] == 0.0
    # held out, every scale: 2 ranks from the wait measured at 4, and 1 rank waits for no one
    held = result.held_out.set_index("ranks")
    assert held["rel_error"].abs().max() < 1e-6, held[["measured_t_iter_s", "predicted_t_iter_s"]]
    # without the wait, the 4 ranks would be predicted that much faster than they ran
    grown = LAST_RANK * EXPECTED_MAX[4] / EXPECTED_MAX[2]
    assert truth[4] - _sweep(tmp_path / "none", 0.0)[4] == pytest.approx(grown, rel=1e-9)
    assert grown / truth[4] > 0.1


def test_a_backend_whose_threads_sleep_while_they_wait_gets_the_schedulers_wait_instead(tmp_path: Path) -> None:
    # gloo's wait for its peers' threads is the scheduler's (contention.exchange_wait): the
    # excess its 2 ranks show is not carried to 4 by the order statistic.
    truth = _sweep(tmp_path / "gloo", LAST_RANK, backend="gloo")
    pred = pipeline.analyse(tmp_path / "gloo").predictions.set_index("ranks")
    assert (pred["pred_sync_wait_s"] == 0.0).all()
    assert pred["predicted_t_iter_s"].to_dict()[4] < truth[4] - LAST_RANK
