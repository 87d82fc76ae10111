"""Theano's and PyTensor's compile cache: one per Python, library and numpy version, so that an
environment built again (a fresh clone's) finds what the last one compiled."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpcbench.frameworks.theano import library


def test_environments_of_the_same_versions_share_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HPCBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(library, "_version", lambda dist: {"theano": "1.0.5", "numpy": "1.23.5"}[dist])
    here = library.cache_dir("theano")
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    assert here == tmp_path / "theano" / f"{python}-theano1.0.5-numpy1.23.5"
    monkeypatch.setattr(sys, "prefix", "/another/clone/.envs/legacy")  # the same environment, built again
    assert library.cache_dir("theano") == here
    monkeypatch.setattr(library, "_version", lambda dist: {"theano": "1.0.5", "numpy": "1.24.0"}[dist])
    assert library.cache_dir("theano") != here  # compiled against another numpy: a cache of its own


def test_a_library_that_is_not_installed_reads_none() -> None:
    assert library._version("no-such-distribution-hpcbench") == "none"
