"""An installed hpcbench (`pip install`, not editable, run from outside any checkout) submits a
sweep to the test cluster with a site profile it ships as package data, and its ranks run it."""

from __future__ import annotations

import json
import os

import pytest

from hpcbench.store.reader import read_point
from hpcbench.sweepdir.manifest import DONE, Manifest
from hpcbench.testing.installed import Installed

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

SPEC = """\
name: installed
executor: slurm
profile: testcluster
matrix:
  launcher: [srun, mpirun]
fixed: {framework: synthetic, backend: none, model: sleep, ranks_per_node: 2, iterations: 20, warmup: 2}
"""


def test_an_installed_package_submits_with_a_shipped_profile(installed: Installed) -> None:
    hpcbench = installed.venv / "bin" / "hpcbench"
    spec, out = installed.elsewhere / "slurm.yaml", installed.elsewhere / "slurm-out"
    spec.write_text(SPEC)
    conf = os.environ["SLURM_CONF"]
    submitted = installed.run(hpcbench, "run", spec, "--out", out, SLURM_CONF=conf)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    waited = installed.run(hpcbench, "status", out, "--wait", "--interval", "1", timeout=400, SLURM_CONF=conf)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    shipped = installed.purelib().resolve() / "hpcbench" / "plan" / "site_profiles" / "testcluster.yaml"
    entries = Manifest.load(out).entries.values()
    assert len(entries) == 2 and all(e.state == DONE for e in entries)
    for entry in entries:
        run_file = json.loads((out / "points" / f"{entry.id}.json").read_text())
        assert run_file["profile"]["path"] == str(shipped)  # the installed package's own profile
        data = read_point(out / entry.result)
        assert data.complete and data.iterations.shape == (2, 22)
