"""hpcbench.sweepdir.manifest and hpcbench.sweepdir.atomic: the sweep directory's bookkeeping on disk."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from hpcbench.errors import HpcbenchError
from hpcbench.spec import Point
from hpcbench.sweepdir import manifest
from hpcbench.sweepdir.atomic import write_text_atomic
from hpcbench.sweepdir.manifest import Entry, Manifest

P1 = Point(ranks_per_node=1, batch_size=8)
P2 = Point(ranks_per_node=2, batch_size=8, environ=(("NCCL_DEBUG", "INFO"),))
P3 = Point(nodes=2, ranks_per_node=2, seed=3)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp") or p.name.startswith("."))


# --------------------------------------------------------------------------------------
# Manifest


def test_round_trip(tmp_path: Path) -> None:
    m = Manifest(tmp_path, "sweep-a", "local")
    e1, e2 = m.add(P1), m.add(P2)
    e2.state, e2.attempts, e2.reason, e2.started, e2.ended = manifest.FAILED, 2, "exit code 1", "t0", "t1"
    e1.state, e1.job_id = manifest.DONE, "42"
    m.save()
    again = Manifest.load(tmp_path)
    assert again == m
    assert again.name == "sweep-a"
    assert again.executor == "local"
    assert list(again.entries) == [P1.id, P2.id]  # order kept
    assert again.entries[P2.id].reason == "exit code 1"
    assert Point.from_dict(again.entries[P2.id].point) == P2
    assert leftovers(tmp_path) == []


def test_entry_describes_its_point(tmp_path: Path) -> None:
    e = Manifest(tmp_path, "s", "local").add(P3)
    assert e.id == P3.id
    assert e.label == P3.label()
    assert e.point == P3.as_dict()
    assert (e.state, e.attempts, e.reason) == (manifest.PENDING, 0, "")
    assert e.result == f"{P3.id}.h5"
    assert e.log == f"logs/{P3.id}.log"


def test_add_is_idempotent(tmp_path: Path) -> None:
    m = Manifest(tmp_path, "s", "local")
    e = m.add(P1)
    e.state, e.attempts = manifest.DONE, 1
    again = m.add(Point(batch_size=8, ranks_per_node=1))  # an equal point, built anew
    assert again is e
    assert again.state == manifest.DONE
    assert again.attempts == 1
    assert len(m.entries) == 1


def test_counts(tmp_path: Path) -> None:
    m = Manifest(tmp_path, "s", "local")
    states = ["pending", "queued", "running", "done", "out of memory", "failed", "stopped"]
    assert m.counts() == dict.fromkeys(states, 0)
    for p in (P1, P2, P3, Point(seed=9)):
        m.add(p)
    m.entries[P1.id].state = manifest.DONE
    m.entries[P2.id].state = manifest.FAILED
    m.entries[P3.id].state = manifest.DONE
    assert m.counts() == {**dict.fromkeys(states, 0), "pending": 1, "done": 2, "failed": 1}


def test_open_reuses_an_existing_manifest(tmp_path: Path) -> None:
    m = Manifest(tmp_path, "old", "local")
    m.add(P1).state = manifest.DONE
    m.save()
    reopened = Manifest.open(tmp_path, "new-name", "slurm")
    assert reopened.entries[P1.id].state == manifest.DONE
    assert (reopened.name, reopened.executor) == ("new-name", "slurm")
    fresh = Manifest.open(tmp_path / "elsewhere", "n", "local")
    assert fresh.entries == {}


def test_save_creates_the_directory(tmp_path: Path) -> None:
    m = Manifest(tmp_path / "a" / "b", "s", "local")
    m.add(P1)
    m.save()
    assert Manifest.load(tmp_path / "a" / "b").entries.keys() == {P1.id}


def test_load_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(HpcbenchError) as info:
        Manifest.load(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    assert "not a sweep directory" in message
    assert "manifest.json" in message


ENTRY: dict[str, Any] = {"id": "x", "label": "l", "point": {}}


def _valid(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"version": 1, "name": "s", "executor": "local", "entries": []}
    data.update(changes)
    return data


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b'{"version": 1, "name": "s", "entr', id="truncated"),
        pytest.param(b"", id="empty"),
        pytest.param(b"not json at all", id="text"),
        pytest.param(b"[1, 2, 3]", id="json-list"),
        pytest.param(b'"a string"', id="json-string"),
        pytest.param(b"\xff\xfe\x00garbage\x80", id="binary"),
        pytest.param(json.dumps(_valid(entries=[{"id": "x"}])).encode(), id="entry-missing-fields"),
        pytest.param(json.dumps(_valid(entries=[{**ENTRY, "bogus": 1}])).encode(), id="entry-unknown-field"),
        pytest.param(json.dumps({"version": 1}).encode(), id="no-entries"),
    ],
)  # fmt: skip
def test_load_corrupt_manifest_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(HpcbenchError) as info:
        Manifest.load(tmp_path)
    assert "manifest" in str(info.value)
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_load_other_version(tmp_path: Path, version: object) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(_valid(version=version)))
    with pytest.raises(HpcbenchError) as info:
        Manifest.load(tmp_path)
    message = str(info.value)
    assert "version" in message
    assert repr(version) in message or str(version) in message
    assert str(tmp_path) in message


def test_entries_roundtrip_through_plain_json(tmp_path: Path) -> None:
    entry = Entry("0123456789ab", "label", {"seed": 1}, manifest.RUNNING, 1, "", "job7", "s", "")
    (tmp_path / "manifest.json").write_text(json.dumps(_valid(entries=[entry.__dict__])))
    assert Manifest.load(tmp_path).entries == {"0123456789ab": entry}


# --------------------------------------------------------------------------------------
# write_text_atomic


def test_write_text_atomic_writes_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.json"
    write_text_atomic(path, "first")
    assert path.read_text() == "first"
    write_text_atomic(path, "second ü × →")
    assert path.read_text(encoding="utf-8") == "second ü × →"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.json"]


def test_write_text_atomic_keeps_old_content_when_replace_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "manifest.json"
    write_text_atomic(path, "old")

    def refuse(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space"):
        write_text_atomic(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_write_text_atomic_cleans_up_when_the_write_fails(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "bad surrogate \udcff")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_write_text_atomic_keeps_old_content_on_keyboard_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.txt"
    path.write_text("old")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_manifest_save_failure_keeps_the_previous_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = Manifest(tmp_path, "s", "local")
    m.add(P1)
    m.save()
    m.add(P2)

    def refuse(src: Any, dst: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk gone"):
        m.save()
    monkeypatch.undo()
    assert Manifest.load(tmp_path).entries.keys() == {P1.id}
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_write_text_atomic_file_mode_follows_umask(tmp_path: Path) -> None:
    # a sweep directory is read by colleagues and by analysis jobs: the manifest must get
    # the mode a plain write would give it (0666 & ~umask), not mkstemp's private 0600
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "new.json", "{}")
        (tmp_path / "plain.json").write_text("{}")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "new.json").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.json").stat().st_mode) == 0o644
