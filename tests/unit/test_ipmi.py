"""The node meter (IPMI DCMI power reading) against a FAKE ipmitool (this machine has no BMC):
a script that prints what `ipmitool dcmi power reading` prints, the watts taken from a file the
test writes, or fails as ipmitool does without a BMC. Then the meter's rows, and the analysis'
`power_node_w` on a point file of known readings."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from hpcbench.analysis import energy
from hpcbench.store.energy import Absent
from hpcbench.trace.energy import sources_here
from hpcbench.trace.energy.ipmi import DCMI_COMMAND, VARIABLE, IpmiPowerReader, command_for, parse_watts
from hpcbench.trace.energy.meter import EnergyMeter
from tests.unit.test_energy import FakeClock
from tests.unit.test_energy_record import fabricated, known_joules, reading

# what ipmitool 1.8.19 prints for `dcmi power reading` on a server whose BMC has DCMI power management
DCMI_OUTPUT = """
    Instantaneous power reading:                   {watts} Watts
    Minimum during sampling period:                 88 Watts
    Maximum during sampling period:                412 Watts
    Average power reading over sample period:      301 Watts
    IPMI timestamp:                           Sat Nov 28 14:50:01 2026
    Sampling period:                          00000001 Seconds.
    Power reading state is:                   {state}

"""
NO_BMC = "Could not open device at /dev/ipmi0 or /dev/ipmi/0 or /dev/ipmidev/0: No such file or directory"


def fake_ipmitool(folder: Path, watts: float = 312, state: str = "activated", fail: bool = False) -> Path:
    """A FAKE `ipmitool` in `folder`: DCMI's output with the watts in `folder/watts`, or ipmitool's
    failure without a BMC (exit 1)."""
    folder.mkdir(exist_ok=True)
    (folder / "watts").write_text(f"{watts}\n")
    script = folder / "ipmitool"
    # bash builtins only: the test empties PATH to hide the real tools
    output = DCMI_OUTPUT.format(watts="$w", state=state)
    body = f'echo "{NO_BMC}" >&2; exit 1' if fail else f'w=$(<watts)\nprintf "%s" "{output}"'
    script.write_text(f'#!/bin/bash\n[ "$*" = "dcmi power reading" ] || exit 2\ncd "{folder}"\n{body}\n')
    script.chmod(0o755)
    return script


def test_dcmi_output_is_read_and_a_deactivated_or_missing_reading_is_refused() -> None:
    assert parse_watts(DCMI_OUTPUT.format(watts=312, state="activated")) == 312.0
    with pytest.raises(ValueError, match="deactivated"):
        parse_watts(DCMI_OUTPUT.format(watts=0, state="deactivated"))
    with pytest.raises(ValueError, match="no 'Instantaneous power reading"):
        parse_watts("Power reading state is: activated\n")
    assert command_for("ipmi") == DCMI_COMMAND
    assert command_for("sudo -n ipmitool -I open dcmi power reading")[:3] == ("sudo", "-n", "ipmitool")


def test_the_reader_integrates_the_node_power_between_reads(tmp_path: Path) -> None:
    script = fake_ipmitool(tmp_path / "bin", watts=200)
    clock = FakeClock()
    reader = IpmiPowerReader.open(str(script) + " dcmi power reading", clock)
    assert isinstance(reader, IpmiPowerReader), reader
    assert reader.domains == ["node"] and "power x time" in reader.describe()
    (tmp_path / "bin" / "watts").write_text("300\n")
    clock.ns += 2_000_000_000
    assert reader.read() == {"node": 500_000_000}  # (200 + 300) / 2 W over 2 s = 500 J
    clock.ns += 1_000_000_000
    assert reader.read() == {"node": 800_000_000}  # and 300 W for 1 s more


def test_a_missing_or_failing_meter_is_absent_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing = IpmiPowerReader.open("ipmi")
    assert missing == Absent(f"no ipmitool on PATH ({VARIABLE}=ipmi)")
    failing = IpmiPowerReader.open(str(fake_ipmitool(tmp_path / "bin", fail=True)) + " dcmi power reading")
    assert isinstance(failing, Absent) and f"exit 1: {NO_BMC}" in str(failing), failing
    off = IpmiPowerReader.open(str(fake_ipmitool(tmp_path / "off", state="deactivated")) + " dcmi power reading")
    assert isinstance(off, Absent) and "the BMC's power reading is deactivated" in str(off), off


def test_the_meter_reads_the_node_on_local_rank_0_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = fake_ipmitool(tmp_path / "bin", watts=250)
    monkeypatch.setenv(VARIABLE, f"{script} dcmi power reading")
    no_powercap = str(tmp_path / "no-powercap")
    first = EnergyMeter(0, 0, 0, local_rank=0, gpu_index=None, root=no_powercap)
    other = EnergyMeter(1, 0, 0, local_rank=1, gpu_index=None, root=no_powercap)
    assert first.sources["node"].startswith(f"node power through `{script} dcmi power reading`")
    assert other.sources["node"] == "not read: local rank 0 reads its host's" and not other.reading
    first.read()
    first.read()
    rows = first.drain()
    assert rows["source"].tolist() == [b"ipmi-power"] * 2 and rows["domain"].tolist() == [b"node"] * 2
    assert rows["microjoules"][1] > rows["microjoules"][0] >= 0  # 250 W integrated between the reads
    assert any(line.startswith("node meter: node power through") for line in sources_here(no_powercap))
    monkeypatch.delenv(VARIABLE)
    assert "node" not in EnergyMeter(0, 0, 0, local_rank=0, gpu_index=None, root=no_powercap).sources


def test_node_power_is_its_own_column_and_not_added_to_the_parts(tmp_path: Path) -> None:
    """Host a's meter read 1000 J over the 3 s timed window: 333.3 W; energy_j still the parts'."""
    node = [reading(0, t, "ipmi-power", "node", j) for t, j in ((0.0, 0.0), (1.0, 400.0), (4.0, 1400.0))]
    rows = np.concatenate([known_joules(), np.array(node, dtype=known_joules().dtype)])
    figures = energy.row(fabricated(tmp_path / "p.h5", rows))
    assert figures["power_node_w"] == pytest.approx(1000 / 3)
    assert figures["energy_j"] == pytest.approx(300 + 300 + 90 + 30)
    assert math.isnan(energy.row(fabricated(tmp_path / "none.h5", known_joules()))["power_node_w"])
