"""Under `pytest -n 2` (tests/conftest.py): a test marked `quiet` runs with no other test beside
it, while the others do run side by side; a module's tests stay on one worker."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

CONFTEST = """
from tests.conftest import pytest_runtest_protocol  # the hook under test
"""

# Each test writes when it ran (wall clock) and on which worker. The quiet test's group is
# handed out first and the plain ones' two groups beside it, so that without the lock it would
# overlap them; the plain tests sleep long against a worker's start-up, so that the two groups
# overlap each other on any machine.
BODY = """
import json, os, time
from pathlib import Path
import pytest

def _ran(name, seconds):
    t0 = time.time()
    time.sleep(seconds)
    Path(os.environ["RUNS"], name).write_text(json.dumps(
        [t0, time.time(), os.environ.get("PYTEST_XDIST_WORKER", "")]))

@pytest.mark.quiet
@pytest.mark.xdist_group("q")
def test_alone():
    _ran("quiet", 1.5)

@pytest.mark.xdist_group("p1")
@pytest.mark.parametrize("i", range(3))
def test_plain(i):
    _ran(f"plain{i}", 1.0)

@pytest.mark.xdist_group("p2")
@pytest.mark.parametrize("i", range(3))
def test_plain_too(i):
    _ran(f"other{i}", 1.0)
"""


def test_a_quiet_test_runs_alone_and_the_others_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_runs.py").write_text(BODY)
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNS": str(runs)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "test_runs.py", "-q", "-p", "no:cacheprovider",
         "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
         "-o", "markers=quiet: alone", "--rootdir", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0 and "7 passed" in proc.stdout, proc.stdout + proc.stderr
    spans = {p.name: json.loads(p.read_text()) for p in runs.iterdir()}
    assert len(spans) == 7 and {w for _, _, w in spans.values()} == {"gw0", "gw1"}, spans
    q0, q1, _ = spans.pop("quiet")
    for name, (t0, t1, _) in spans.items():
        assert t1 <= q0 or t0 >= q1, (name, (t0, t1), (q0, q1))  # no overlap with the quiet test
    plain = sorted(spans.values())
    assert any(b[0] < a[1] for a, b in itertools.pairwise(plain)), plain  # the others overlapped
