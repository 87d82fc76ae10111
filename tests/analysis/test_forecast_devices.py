"""One process driving several devices (`devices_per_rank`, `host` in a prediction file): the
host work per device is done in turn while the devices compute in parallel, (d − 1)·h on top of
one device's step; the devices exchange over the intra-node level as ranks do. Hand-worked."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from hpcbench.analysis.model import forecast, forecast_spec
from hpcbench.analysis.model.collectives import ModelError
from hpcbench.analysis.model.iteration import HostWork, serialised_host
from hpcbench.errors import SpecError

ALPHA, BETA = 1e-5, 1e-10
BASE: dict[str, Any] = {
    "layers": [[4e6, 0.010], [1e6, 0.020]],  # input side first: 1 MB ready first (at 20 ms), then 4 MB (at 30 ms)
    "batch_size": 32,
    "single_rank": {"phases": {"forward": 0.015, "backward": 0.030, "update": 0.005}},  # one device: 50 ms
    "nodes": [1],
    "links": {"intra": {"alpha_s": ALPHA, "beta_s_per_byte": BETA}},
    "exchange": {"overlap": True, "fusion_bytes": 0, "algorithm": "ring"},
}


def run(**keys: Any) -> dict[str, Any]:
    row = forecast.forecast(forecast_spec.parse(yaml.safe_dump({**BASE, **keys}))).iloc[0]
    return {str(k): v for k, v in row.items()}


def ring(n: float, p: int) -> float:
    return 2 * (p - 1) * ALPHA + 2 * n * (p - 1) / p * BETA


def test_serialised_host_work_by_hand() -> None:
    assert serialised_host(0.002, 1) == 0.0  # one device: its own host work is inside its step
    assert serialised_host(0.002, 4) == pytest.approx(0.006)
    # h from each form, one device's step 50 ms of 32 samples
    assert HostWork(seconds=0.002).per_device(0.050, 32) == pytest.approx(0.002)
    assert HostWork(fraction=0.1).per_device(0.050, 32) == pytest.approx(0.005)
    assert HostWork(per_sample_s=21e-6).per_device(0.050, 32) == pytest.approx(0.000672)
    with pytest.raises(ModelError):
        serialised_host(0.002, 0)
    with pytest.raises(ModelError):
        HostWork(fraction=1.0)


def test_one_process_of_four_devices_by_hand() -> None:
    row = run(devices_per_rank=4, host={"seconds": 0.002})
    # 1 MB leaves at 20 ms and ends before the 4 MB is ready at 30 ms; the 4 MB's ring of 4 is exposed
    assert ring(1e6, 4) < 0.010
    exposed = ring(4e6, 4)
    t = 0.015 + 0.030 + 0.005 + exposed + 3 * 0.002  # the last device starts 3 host works after the first
    assert row["t_iter_s"] == pytest.approx(t)
    assert row["exposed_comm_s"] == pytest.approx(exposed)
    assert row["host_serial_s"] == pytest.approx(0.006)
    assert (row["ranks"], row["devices"]) == (1, 4)
    assert row["throughput"] == pytest.approx(4 * 32 / t)  # batch_size is per device
    assert row["efficiency"] == pytest.approx((4 * 32 / t) / (4 * 32 / 0.050))  # against one device alone
    t_serial = 0.050 + ring(1e6, 4) + ring(4e6, 4) + 0.006
    assert row["t_iter_no_overlap_s"] == pytest.approx(t_serial)


def test_the_host_forms_give_the_same_h() -> None:
    by_seconds = run(devices_per_rank=8, host={"seconds": 0.005})
    assert run(devices_per_rank=8, host={"fraction": 0.1})["t_iter_s"] == pytest.approx(by_seconds["t_iter_s"])
    per_sample = run(devices_per_rank=8, host={"per_sample_us": 21})
    assert per_sample["host_serial_s"] == pytest.approx(7 * 21e-6 * 32)


def test_devices_of_one_process_exchange_as_ranks_do() -> None:
    # without host work, one process of 8 devices is 8 ranks of one device: the same ring, the same table
    one_process = run(devices_per_rank=8)
    eight_ranks = run(ranks_per_node=8)
    for key in ("t_iter_s", "throughput", "efficiency", "exposed_comm_s", "t_iter_no_overlap_s", "comm_total_s"):
        assert one_process[key] == pytest.approx(eight_ranks[key]), key
    # across nodes: 2 nodes x 2 ranks x 2 devices is 2 nodes x 4 ranks (hierarchical: k = 4 per node)
    links = {"intra": {"alpha_s": ALPHA, "beta_s_per_byte": BETA}, "inter": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9}}
    ex = {"overlap": False, "fusion_bytes": 0, "algorithm": "hierarchical"}
    mixed = run(nodes=[2], ranks_per_node=2, devices_per_rank=2, links=links, exchange=ex)
    flat = run(nodes=[2], ranks_per_node=4, links=links, exchange=ex)
    assert mixed["t_iter_s"] == pytest.approx(flat["t_iter_s"])
    assert (mixed["ranks"], mixed["devices"]) == (4, 8)


def test_default_is_one_device_per_rank() -> None:
    spec = forecast_spec.parse(yaml.safe_dump(BASE))
    assert (spec.devices_per_rank, spec.host_s) == (1, 0.0)
    row = run(host={"seconds": 0.002})  # host work of a lone device is inside its step: nothing added
    assert row["t_iter_s"] == pytest.approx(0.050)
    assert row["host_serial_s"] == 0.0


@pytest.mark.parametrize(
    ("keys", "path"),
    [
        ({"devices_per_rank": 0}, "devices_per_rank"),
        ({"devices_per_rank": True}, "devices_per_rank"),
        ({"host": {"seconds": 0.001, "fraction": 0.1}}, "host"),
        ({"host": {}}, "host"),
        ({"host": {"fraction": 1.0}}, "host.fraction"),
        ({"host": {"per_sample_us": -1}}, "host.per_sample_us"),
        ({"host": {"milliseconds": 1}}, "host.milliseconds"),
        ({"host": 0.002}, "host"),
    ],
)
def test_bad_keys_are_named(keys: dict[str, Any], path: str) -> None:
    with pytest.raises(SpecError) as info:
        forecast_spec.parse(yaml.safe_dump({**BASE, **keys}))
    assert info.value.path == path
