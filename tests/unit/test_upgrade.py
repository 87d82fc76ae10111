"""Point files of every older schema read in the current shape (hpcbench.store.upgrade): small
files written with h5py as each version's writer laid them out, read back with read_point."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from hpcbench.errors import SchemaError
from hpcbench.spec import Point
from hpcbench.store import schema, upgrade
from hpcbench.store.reader import read_point
from hpcbench.store.traits import Traits, legacy

N_RANKS, N_ITERS = 2, 3
# the /resources columns each schema added (the rest were there from schema 2)
ADDED = {5: schema.SCHED_COLUMNS, 6: ("cpu_steal", schema.CHILD_RUN), 7: (schema.WORK_WAIT,)}


def _dropped(dtype: np.dtype[Any], names: tuple[str, ...]) -> np.dtype[Any]:
    return np.dtype([(n, dtype[n]) for n in dtype.names or () if n not in names])


def resource_dtype(version: int) -> np.dtype[Any]:
    """RESOURCE_DTYPE as a writer of schema `version` (>= 2) wrote it."""
    later = tuple(name for v, names in ADDED.items() if v > version for name in names)
    return _dropped(schema.RESOURCE_DTYPE, later)


def iteration_dtype(version: int) -> np.dtype[Any]:
    """ITERATION_DTYPE as a writer of schema `version` wrote it: before 2, `warmup` a numpy bool."""
    if version >= 2:
        return schema.ITERATION_DTYPE
    return np.dtype(
        [(n, "?" if n == "warmup" else schema.ITERATION_DTYPE[n]) for n in schema.ITERATION_DTYPE.names or ()]
    )


def rows(dtype: np.dtype[Any], n: int) -> np.ndarray:
    """n rows of `dtype` with a distinct known value in every field (rank r % N_RANKS)."""
    out = np.zeros(n, dtype=dtype)
    for k, name in enumerate(dtype.names or ()):
        kind = dtype[name].kind
        if name == "rank":
            out[name] = np.arange(n) % N_RANKS
        elif name == "iteration":  # a message of an iteration written (the reader keeps no other)
            out[name] = np.arange(n) % N_ITERS
        elif kind == "S":
            out[name] = [f"{name}{i}".encode() for i in range(n)]
        elif kind == "b":
            out[name] = np.arange(n) % 2 == 0
        else:
            out[name] = np.arange(n) + 10 * k
    return out


POINT = Point(framework="torch", backend="gloo", launcher="mpirun", model="lenet", batch_size=8, iterations=3)


def write_old(path: Path, version: int, provenance: dict[str, Any] | None = None, point: Point = POINT) -> Path:
    """A complete 2-rank file as the writer of schema `version` laid it out: the tables that
    version had, with its columns; provenance without `comm_end` (recorded from schema 6 on) and
    `traits` unless given."""
    with h5py.File(path, "w") as f:
        f.attrs.update(
            schema_version=version, hpcbench_version=f"0.{version}.0", created="2026-01-01T00:00:00",
            sweep="old", spec="", epoch_ns=0, status=schema.STATUS_COMPLETE, n_ranks=N_RANKS,
            n_iterations=N_ITERS, iterations_written=N_ITERS,
        )  # fmt: skip
        f.create_group(schema.POINT).attrs.update(id=point.id, json=point.to_json(), ranks=N_RANKS)
        prov = f.create_group(schema.PROVENANCE)
        for key, value in {"hostnames": ["a", "b"], "writer": "gather", **(provenance or {})}.items():
            prov.attrs[key] = json.dumps(value) if isinstance(value, dict) else value
        f[schema.RANKS] = rows(schema.RANK_DTYPE, N_RANKS)
        f[schema.ITERATIONS] = rows(iteration_dtype(version), N_RANKS * N_ITERS).reshape(N_RANKS, N_ITERS)
        if version >= 2:
            f[schema.COMM] = rows(schema.COMM_DTYPE, 4)
            f[schema.RESOURCES] = rows(resource_dtype(version), 6)
        if version >= 3:
            f[schema.EVAL] = rows(schema.EVAL_DTYPE, 2)
        if version >= 8:
            f[schema.ENERGY] = rows(schema.ENERGY_DTYPE, 3)
    return path


@pytest.mark.parametrize("version", range(1, schema.SCHEMA_VERSION + 1))
def test_every_version_reads_in_the_current_shape(version: int, tmp_path: Path) -> None:
    p = read_point(write_old(tmp_path / f"v{version}.h5", version))
    assert p.attrs["schema_version"] == version  # what it was written with, as written
    assert p.iterations.dtype == schema.ITERATION_DTYPE and p.iterations.shape == (N_RANKS, N_ITERS)
    assert p.comm.dtype == schema.COMM_DTYPE and p.resources.dtype == schema.RESOURCE_DTYPE
    assert p.eval.dtype == schema.EVAL_DTYPE
    assert (len(p.comm), len(p.resources), len(p.eval)) == ((4 if version >= 2 else 0), (6 if version >= 2 else 0),
                                                            (2 if version >= 3 else 0))  # fmt: skip
    written = rows(iteration_dtype(version), N_RANKS * N_ITERS).reshape(N_RANKS, N_ITERS)
    for name in schema.ITERATION_DTYPE.names or ():
        np.testing.assert_array_equal(p.iterations[name], written[name].astype(schema.ITERATION_DTYPE[name]))
    if version >= 2:
        np.testing.assert_array_equal(p.comm, rows(schema.COMM_DTYPE, 4))
        stored = rows(resource_dtype(version), 6)
        for name in schema.RESOURCE_DTYPE.names or ():
            column = p.resources[name]
            if name in (stored.dtype.names or ()):
                np.testing.assert_array_equal(column, stored[name])  # kept as written
            elif column.dtype.kind == "f":
                assert np.isnan(column).all(), name  # added since: unknown
            else:
                assert (column == -1).all(), name
    if version >= 3:
        np.testing.assert_array_equal(p.eval, rows(schema.EVAL_DTYPE, 2))
    assert p.provenance["comm_end"] == schema.COMM_END_COMPLETION  # torch gloo: completion
    assert p.provenance["traits"] == asdict(legacy("torch", "gloo", "mpirun"))
    assert p.traits == Traits(grouping="buckets", sleeping_wait=True, launcher_mpi=True)


def test_schema_1_warmup_was_a_bool_and_reads_as_uint8(tmp_path: Path) -> None:
    path = write_old(tmp_path / "v1.h5", 1)
    with h5py.File(path) as f:
        assert f[schema.ITERATIONS].dtype["warmup"] == np.bool_  # what version 1 wrote: an enum
    p = read_point(path)
    assert p.iterations["warmup"].dtype == np.uint8
    assert p.iterations["warmup"].tolist() == [[1, 0, 1], [0, 1, 0]]


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        ({"torch_exchange": "mpi"}, schema.COMM_END_WAIT),
        ({"torch_exchange": "horovod"}, schema.COMM_END_WAIT),
        ({"jax_exchange": "pmean"}, schema.COMM_END_WAIT),
        ({"torch_exchange": "ddp"}, schema.COMM_END_COMPLETION),
        ({"jax_exchange": "pmean_fused"}, schema.COMM_END_COMPLETION),
        ({}, schema.COMM_END_COMPLETION),
        ({"torch_exchange": "mpi", "comm_end": schema.COMM_END_COMPLETION}, schema.COMM_END_COMPLETION),  # recorded
        ({"torch_exchange": "ddp", "comm_end": schema.COMM_END_WAIT}, schema.COMM_END_WAIT),
    ],
)
def test_comm_end_where_not_recorded_is_what_the_exchanges_did_then(
    recorded: dict[str, str], expected: str, tmp_path: Path
) -> None:
    for version in (5, schema.SCHEMA_VERSION):  # recorded from schema 6 on, without a version bump
        p = read_point(write_old(tmp_path / f"v{version}.h5", version, recorded))
        assert p.provenance["comm_end"] == expected
        assert {k: v for k, v in p.provenance.items() if k in recorded} == recorded  # what was recorded stays


def test_traits_where_not_recorded_are_the_built_in_backends_and_recorded_ones_stay(tmp_path: Path) -> None:
    horovod = Point(framework="torch", backend="horovod", launcher="torchrun", model="lenet", iterations=3)
    p = read_point(write_old(tmp_path / "horovod.h5", 4, point=horovod))
    assert p.traits == Traits(grouping="fusion", background_thread=True, launcher_mpi=False)
    ps = Point(framework="tensorflow", backend="ps", launcher="mpirun", model="lenet", iterations=3)
    assert read_point(write_old(tmp_path / "ps.h5", 7, point=ps)).traits == legacy("tensorflow", "ps", "mpirun")
    declared = {"grouping": "one_message", "sleeping_wait": True, "momentum": 0.0}
    p = read_point(write_old(tmp_path / "recorded.h5", schema.SCHEMA_VERSION, {"traits": declared}))
    assert p.provenance["traits"] == declared
    assert p.traits == Traits(grouping="one_message", sleeping_wait=True, momentum=0.0)


def test_a_column_that_no_step_accounts_for_is_damage(tmp_path: Path) -> None:
    path = write_old(tmp_path / "v7.h5", 7)
    with h5py.File(path, "r+") as f:  # a version-7 file whose resources lack a column version 2 had
        del f[schema.RESOURCES]
        f[schema.RESOURCES] = rows(_dropped(schema.RESOURCE_DTYPE, ("rss_bytes",)), 2)
    with pytest.raises(SchemaError, match=r"damaged point file \(resources lack the fields rss_bytes\)"):
        read_point(path)


def test_a_current_file_without_a_table_reads_it_empty_as_before(tmp_path: Path) -> None:
    path = write_old(tmp_path / "v7.h5", 7)
    with h5py.File(path, "r+") as f:
        del f[schema.EVAL]
    assert len(read_point(path).eval) == 0


@pytest.mark.parametrize("version", range(1, schema.SCHEMA_VERSION + 1))
def test_energy_reads_empty_before_schema_8_and_as_written_since(version: int, tmp_path: Path) -> None:
    p = read_point(write_old(tmp_path / f"v{version}.h5", version))
    assert p.energy.dtype == schema.ENERGY_DTYPE
    if version < 8:
        assert len(p.energy) == 0  # nothing was read
    else:
        np.testing.assert_array_equal(p.energy, rows(schema.ENERGY_DTYPE, 3))


def test_a_schema_8_file_written_before_energy_was_recorded_reads_it_empty(tmp_path: Path) -> None:
    path = write_old(tmp_path / "v8.h5", 8)  # 8 gained /energy unreleased: files without it are 8 too
    with h5py.File(path, "r+") as f:
        del f[schema.ENERGY]
    assert read_point(path).energy.dtype == schema.ENERGY_DTYPE and len(read_point(path).energy) == 0


# --- the steps, one at a time --------------------------------------------------------------


def parts(version: int, resources: np.ndarray | None = None) -> upgrade.Parts:
    it = rows(iteration_dtype(version), N_RANKS * N_ITERS).reshape(N_RANKS, N_ITERS)
    return upgrade.Parts(version, POINT, {}, it, None, resources, None)


def test_every_version_has_one_step_and_each_adds_what_its_version_added() -> None:
    assert sorted(upgrade.STEPS) == list(range(2, schema.SCHEMA_VERSION + 1))
    assert all(step.__doc__ for step in upgrade.STEPS.values())
    one = parts(1)
    upgrade.STEPS[2](one)
    assert one.iterations["warmup"].dtype == np.uint8 and one.comm is not None and len(one.comm) == 0
    assert one.resources is not None and len(one.resources) == 0 and one.eval is None
    two = parts(2)
    upgrade.STEPS[3](two)
    assert two.eval is not None and two.eval.dtype == schema.EVAL_DTYPE and len(two.eval) == 0
    for version, names in ADDED.items():
        before = parts(version - 1, rows(resource_dtype(version - 1), 3))
        upgrade.STEPS[version](before)
        assert before.resources is not None
        assert before.resources.dtype.names == (resource_dtype(version - 1).names or ()) + tuple(names)
        for name in names:
            assert np.all(before.resources[name] == -1) or np.isnan(before.resources[name]).all()
    seven = parts(7)
    upgrade.STEPS[8](seven)
    assert seven.energy is not None and seven.energy.dtype == schema.ENERGY_DTYPE and len(seven.energy) == 0
    four = parts(3, rows(resource_dtype(3), 3))
    upgrade.STEPS[4](four)  # stopped files: nothing missing
    assert four.resources is not None and four.resources.dtype == resource_dtype(3)


def test_unknown_values_are_the_samplers() -> None:
    assert math.isnan(upgrade.unknown(np.dtype("<f4"))) and upgrade.unknown(np.dtype("<i8")) == -1
    assert upgrade.unknown(np.dtype("S16")) == b""


def test_a_table_built_outside_a_file_upgrades_like_one_read() -> None:
    old = rows(resource_dtype(4), 3)
    current = upgrade.table(schema.RESOURCES, old, 4)
    assert current.dtype == schema.RESOURCE_DTYPE
    assert (current["child_run_ns"] == -1).all() and np.isnan(current["work_wait"]).all()
    np.testing.assert_array_equal(current["rss_bytes"], old["rss_bytes"])
    assert upgrade.table(schema.RESOURCES, current, schema.SCHEMA_VERSION) is current  # nothing to do: no copy
