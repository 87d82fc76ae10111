"""hpcbench.trace.energy: RAPL on FAKE powercap trees laid out as the kernel lays them out, NVML through
a FAKE pynvml (no GPU on this machine) raising the real pynvml error classes, the records and windows,
and `sources_here` on this machine's real /sys/class/powercap and NVML."""

from __future__ import annotations

import ast
import errno
import math
import os
import re
from pathlib import Path
from typing import Any

import pynvml
import pytest

from hpcbench.trace.energy import (
    Absent,
    EnergySample,
    NvmlEnergyReader,
    RaplReader,
    energy_between,
    sources_here,
    summarise,
)
from tests.unit.test_python39 import PACKAGE, problems

RANGE_UJ = 262_143_328_850  # max_energy_range_uj of a Xeon package (as read on one)


def write_zone(directory: Path, name: str, energy_uj: int, range_uj: int = RANGE_UJ) -> None:
    directory.mkdir(parents=True)
    (directory / "name").write_text(f"{name}\n")
    (directory / "energy_uj").write_text(f"{energy_uj}\n")
    (directory / "max_energy_range_uj").write_text(f"{range_uj}\n")
    (directory / "enabled").write_text("1\n")
    (directory / "subsystem").symlink_to(directory.parent)  # as the kernel's: a walk must not loop through it


def write_fake_powercap(
    root: Path, packages: dict[int, dict[str, int]], prefix: str = "intel-rapl", range_uj: int = RANGE_UJ
) -> None:
    """A FAKE /sys/class/powercap: the control type `<prefix>/` (``enabled``), a package zone
    `<prefix>:N/` (name "package-N" unless given) with its sub-zones nested `<prefix>:N/<prefix>:N:M/`
    (name dram, core, ...), and, as the kernel also lists them, every zone again flat as a link
    (`<prefix>:N:M -> <prefix>:N/<prefix>:N:M`) and inside the control type's directory.

    `packages`: {N: {zone name: energy_uj}}, the package zone first.
    """
    control = root / prefix
    control.mkdir(parents=True)
    (control / "enabled").write_text("1\n")
    for n, zones in packages.items():
        items = list(zones.items())
        package = root / f"{prefix}:{n}"
        write_zone(package, items[0][0], items[0][1], range_uj)
        (control / package.name).symlink_to(package)
        for m, (name, energy) in enumerate(items[1:]):
            sub = package / f"{prefix}:{n}:{m}"
            write_zone(sub, name, energy, range_uj)
            (root / sub.name).symlink_to(sub)


def set_energy(root: Path, zone: str, energy_uj: int) -> None:
    """Rewrite a zone's counter in place (same inode: the reader's kept descriptor sees it)."""
    (root / zone / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def two_packages(tmp_path: Path) -> Path:
    root = tmp_path / "fake_sys_class_powercap"
    write_fake_powercap(root, {0: {"package-0": 1_000, "dram": 200}, 1: {"package-1": 3_000, "dram": 400}})
    return root


def open_rapl(root: Path, **kwargs: Any) -> RaplReader:
    reader = RaplReader.open(str(root), **kwargs)
    assert isinstance(reader, RaplReader), reader
    return reader


# --- RAPL ----------------------------------------------------------------------------------


def test_rapl_reads_two_packages_and_their_dram_each_zone_once(two_packages: Path) -> None:
    reader = open_rapl(two_packages)
    try:
        assert reader.domains == ["package-0", "dram-0", "package-1", "dram-1"]
        assert reader.ranges_uj == dict.fromkeys(reader.domains, RANGE_UJ)
        assert reader.describe() == "package-0, dram-0, package-1, dram-1 (readable)"
        assert reader.read() == {"package-0": 1_000, "dram-0": 200, "package-1": 3_000, "dram-1": 400}
        set_energy(two_packages, "intel-rapl:0", 5_000)
        set_energy(two_packages, "intel-rapl:1/intel-rapl:1:0", 900)
        assert reader.read() == {"package-0": 5_000, "dram-0": 200, "package-1": 3_000, "dram-1": 900}
        samples = reader.sample(123)
        assert samples[0] == EnergySample(123, "rapl", "package-0", 5_000)
        assert samples[0].joules == 0.005
    finally:
        reader.close()


def test_rapl_wrap_around_mid_run_adds_the_range(tmp_path: Path) -> None:
    root = tmp_path / "fake_sys_class_powercap"
    write_fake_powercap(root, {0: {"package-0": 900, "dram": 50}}, range_uj=1_000)
    reader = open_rapl(root)
    try:
        set_energy(root, "intel-rapl:0", 980)
        assert reader.read()["package-0"] == 980
        set_energy(root, "intel-rapl:0", 30)  # wrapped: 20 to the top, then 30
        assert reader.read()["package-0"] == 1_030
        set_energy(root, "intel-rapl:0", 700)
        set_energy(root, "intel-rapl:0/intel-rapl:0:0", 10)  # the sub-zone wraps on its own: 50 + 950 + 10
        assert reader.read() == {"package-0": 1_700, "dram-0": 1_010}
    finally:
        reader.close()


def test_rapl_energy_uj_root_only_is_absent_with_the_reason(two_packages: Path) -> None:
    """The kernel refuses a non-root reader of energy_uj (mode 0400); these tests run as root here, and root
    reads a file whatever its mode, so the refusal is the reader's opener hook raising what open(2) raises."""

    def refuse(path: str) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", path)

    reader = RaplReader.open(str(two_packages), opener=refuse)
    assert isinstance(reader, Absent)
    assert str(reader).startswith(f"absent: energy_uj is readable by root only: {two_packages}/intel-rapl:0/energy_uj")
    assert "PermissionError" in reader.reason
    assert reader.reason.endswith("3 other zone(s) unreadable too")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file: the hook test above covers it")
def test_rapl_mode_000_energy_uj_is_absent_for_a_non_root_reader(two_packages: Path) -> None:
    for zone in ("intel-rapl:0", "intel-rapl:0/intel-rapl:0:0", "intel-rapl:1", "intel-rapl:1/intel-rapl:1:0"):
        (two_packages / zone / "energy_uj").chmod(0)
    reader = RaplReader.open(str(two_packages))
    assert isinstance(reader, Absent)
    assert reader.reason.startswith("energy_uj is readable by root only: ")


def test_rapl_one_unreadable_zone_is_named_and_the_others_read(two_packages: Path) -> None:
    """A zone whose energy_uj is a directory (a way to make it unreadable that stops root too) is left out, said why."""
    dram = two_packages / "intel-rapl:1" / "intel-rapl:1:0" / "energy_uj"
    dram.unlink()
    dram.mkdir()
    reader = open_rapl(two_packages)
    try:
        assert reader.domains == ["package-0", "dram-0", "package-1"]
        flat = two_packages / "intel-rapl:1:0" / "energy_uj"  # the zone as /sys/class/powercap lists it
        assert reader.missing == [f"dram-1: {flat}: IsADirectoryError: [Errno 21] Is a directory"]
        assert reader.describe().startswith("package-0, dram-0, package-1 (readable); not read: dram-1: ")
    finally:
        reader.close()


def test_rapl_without_powercap_is_absent(tmp_path: Path) -> None:
    missing = tmp_path / "sys_class_powercap_not_there"
    reader = RaplReader.open(str(missing))
    assert reader == Absent(f"no {missing} (no RAPL: a VM or a kernel without powercap)")
    empty = tmp_path / "fake_sys_class_powercap"
    empty.mkdir()
    (empty / "intel-rapl-mmio:0").mkdir()  # not read: it counts the MSR zone's package again
    reader = RaplReader.open(str(empty))
    assert isinstance(reader, Absent)
    assert reader.reason.startswith(f"no RAPL zones under {empty}")


def test_rapl_amd_names_and_psys_read_alike(tmp_path: Path) -> None:
    root = tmp_path / "fake_sys_class_powercap"
    write_fake_powercap(root, {0: {"package-0": 10, "core": 5}, 1: {"psys": 70}}, prefix="amd-rapl")
    reader = open_rapl(root)
    try:
        assert reader.read() == {"package-0": 10, "core-0": 5, "psys": 70}
    finally:
        reader.close()


# --- NVML ----------------------------------------------------------------------------------


class FakeNvml:
    """FAKE pynvml (no GPU on this machine): the functions the energy readers call, on `gpus` fake GPUs.

    `energy_mj`: what successive nvmlDeviceGetTotalEnergyConsumption calls return; `power_mw`: what
    nvmlDeviceGetPowerUsage returns. The `*_error` arguments are NVML return codes: the call raises the
    real pynvml error class for it (pynvml.NVMLError(code) is an NVMLError_NotSupported, ...)."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED

    def __init__(
        self,
        *,
        gpus: int = 1,
        energy_mj: list[int] | None = None,
        power_mw: int = 250_000,
        init_error: int | None = None,
        energy_error: int | None = None,
        power_error: int | None = None,
    ) -> None:
        self.gpus = gpus
        self.energy_mj = list(energy_mj or [1_000])
        self.power_mw = power_mw
        self.init_error, self.energy_error, self.power_error = init_error, energy_error, power_error
        self.initialised = 0  # nvmlInit calls not yet shut down

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        if not 0 <= index < self.gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ("fake handle", index)

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str:
        return "Fake GPU"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: tuple[str, int]) -> int:
        if self.energy_error is not None:
            raise pynvml.NVMLError(self.energy_error)
        return self.energy_mj.pop(0) if len(self.energy_mj) > 1 else self.energy_mj[0]

    def nvmlDeviceGetPowerUsage(self, handle: tuple[str, int]) -> int:
        if self.power_error is not None:
            raise pynvml.NVMLError(self.power_error)
        return self.power_mw


class FakeClock:
    """A FAKE perf_counter_ns, moved on by the test."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


def test_nvml_energy_counter_in_microjoules() -> None:
    fake = FakeNvml(energy_mj=[5_000, 5_000, 7_500])  # the probe at open, then two reads
    reader = NvmlEnergyReader.open(0, fake)
    assert isinstance(reader, NvmlEnergyReader)
    assert (reader.method, reader.domains) == ("counter", ["gpu-0"])
    assert reader.describe() == "GPU 0 (Fake GPU): total-energy counter (nvmlDeviceGetTotalEnergyConsumption)"
    assert reader.read() == {"gpu-0": 5_000_000}
    assert reader.sample(42) == [EnergySample(42, "nvml", "gpu-0", 7_500_000)]
    reader.close()
    reader.close()
    assert fake.initialised == 0


def test_nvml_counter_not_supported_integrates_power_over_time() -> None:
    fake = FakeNvml(energy_error=pynvml.NVML_ERROR_NOT_SUPPORTED, power_mw=250_000)
    clock = FakeClock()
    reader = NvmlEnergyReader.open(0, fake, clock)
    assert isinstance(reader, NvmlEnergyReader)
    assert reader.method == "power integration"
    assert "no energy counter: NVMLError_NotSupported: Not Supported" in reader.describe()
    clock.ns += 2_000_000_000
    assert reader.read() == {"gpu-0": 500_000_000}  # 250 W x 2 s
    fake.power_mw = 150_000
    clock.ns += 1_000_000_000
    assert reader.read() == {"gpu-0": 700_000_000}  # + (250 + 150) / 2 W x 1 s
    reader.close()
    assert fake.initialised == 0


@pytest.mark.parametrize(
    ("fake", "reason"),
    [
        (
            FakeNvml(energy_error=pynvml.NVML_ERROR_NO_PERMISSION),
            "GPU 0 (Fake GPU): nvmlDeviceGetTotalEnergyConsumption: NVMLError_NoPermission: Insufficient Permissions",
        ),
        (
            FakeNvml(energy_error=pynvml.NVML_ERROR_NOT_SUPPORTED, power_error=pynvml.NVML_ERROR_NOT_SUPPORTED),
            "GPU 0 (Fake GPU): nvmlDeviceGetTotalEnergyConsumption: NVMLError_NotSupported: Not Supported;"
            " nvmlDeviceGetPowerUsage: NVMLError_NotSupported: Not Supported",
        ),
        (
            FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
            "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
        ),
        (FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "NVMLError_DriverNotLoaded: Driver Not Loaded"),
        (FakeNvml(gpus=0), "GPU 0: NVMLError_InvalidArgument: Invalid Argument"),
    ],
    ids=["no-permission", "neither-counter-nor-power", "library-not-found", "driver-not-loaded", "no-such-gpu"],
)
def test_nvml_failures_are_absent_with_nvml_reason(fake: FakeNvml, reason: str) -> None:
    assert NvmlEnergyReader.open(0, fake) == Absent(reason)
    assert fake.initialised == 0


def test_sources_here_one_line_per_source(two_packages: Path) -> None:
    fake = FakeNvml(gpus=2)
    assert sources_here(str(two_packages), fake) == [
        "rapl: package-0, dram-0, package-1, dram-1 (readable)",
        "nvml energy: GPU 0 (Fake GPU): total-energy counter (nvmlDeviceGetTotalEnergyConsumption)",
        "nvml energy: GPU 1 (Fake GPU): total-energy counter (nvmlDeviceGetTotalEnergyConsumption)",
    ]
    assert fake.initialised == 0
    assert sources_here(str(two_packages / "nowhere"), FakeNvml(gpus=0)) == [
        f"rapl: absent: no {two_packages}/nowhere (no RAPL: a VM or a kernel without powercap)",
        "nvml energy: absent: no GPU (NVML counts none)",
    ]


def test_sources_here_on_this_machine_says_what_it_reads_or_why_not() -> None:
    """The development VM has no powercap and no GPU (absent); a node with RAPL or a GPU lists domains."""
    lines = sources_here()
    assert re.fullmatch(r"rapl: (absent: .+|[\w@:-]+(, [\w@:-]+)* \(readable\).*)", lines[0]), lines
    assert lines[1:], lines
    for line in lines[1:]:
        assert re.fullmatch(r"nvml energy: (absent: .+|GPU \d+ \(.+\): .+)", line), line


# --- records -------------------------------------------------------------------------------


def test_energy_between_flags_a_window_shorter_than_the_update_interval() -> None:
    a = EnergySample(0, "nvml", "gpu-0", 1_000_000)
    window = energy_between(a, EnergySample(2_000_000_000, "nvml", "gpu-0", 601_000_000))
    assert (window.joules, window.seconds, window.watts) == (600.0, 2.0, 300.0)
    assert (window.trustworthy, window.why) == (True, "")
    short = energy_between(a, EnergySample(50_000_000, "nvml", "gpu-0", 1_000_000))
    assert (short.joules, short.trustworthy) == (0.0, False)
    assert short.why.startswith("a 50 ms window is shorter than the counter's update interval (100 ms)")
    assert energy_between(a, EnergySample(50_000_000, "nvml", "gpu-0", 1_000_000), update_interval_s=0.001).trustworthy
    reset = energy_between(a, EnergySample(2_000_000_000, "nvml", "gpu-0", 0))
    assert not reset.trustworthy
    assert "backwards" in reset.why
    with pytest.raises(ValueError, match="two domains"):
        energy_between(a, EnergySample(1, "nvml", "gpu-1", 0))
    with pytest.raises(ValueError, match="earlier"):
        energy_between(EnergySample(5, "nvml", "gpu-0", 0), a)


def test_summarise_per_domain_from_first_to_last_reading() -> None:
    samples = [
        EnergySample(3_000_000_000, "rapl", "package-0", 400_000_000),
        EnergySample(1_000_000_000, "rapl", "package-0", 100_000_000),
        EnergySample(1_000_000_000, "nvml", "gpu-0", 10_000_000),
        EnergySample(5_000_000_000, "nvml", "gpu-0", 1_610_000_000),
        EnergySample(2_000_000_000, "rapl", "dram-0", 7),
        EnergySample(1_000_000_000, "nvml", "gpu-1", 9_000_000),
        EnergySample(2_000_000_000, "nvml", "gpu-1", 1_000_000),  # reset: unknown, not negative
    ]
    summary = summarise(samples)
    assert summary["package-0"] == (300.0, 2.0, 150.0)
    assert summary["gpu-0"] == (1600.0, 4.0, 400.0)
    assert summary["dram-0"].joules == 0.0
    assert summary["dram-0"].seconds == 0.0
    assert math.isnan(summary["dram-0"].average_watts)
    assert math.isnan(summary["gpu-1"].joules)
    assert math.isnan(summary["gpu-1"].average_watts)
    with pytest.raises(ValueError, match="two sources"):
        summarise([samples[0], EnergySample(0, "nvml", "package-0", 0)])


def test_energy_modules_run_on_python_3_9() -> None:
    """Rank-side code will import them (the sampler): Python 3.9 forms only (see test_python39)."""
    for path in sorted((PACKAGE / "trace" / "energy").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path), feature_version=(3, 9))
        assert problems(tree) == [], path


def test_check_lists_this_hosts_sources_in_its_table_and_json(
    two_packages: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hpcbench check` names each energy source of the host (here a FAKE powercap tree, and
    NVML as this machine has it: absent without a GPU), in its table and its JSON alike."""
    from hpcbench.cli import check
    from hpcbench.trace.energy.meter import ROOT_VARIABLE

    monkeypatch.setenv(ROOT_VARIABLE, str(two_packages))
    lines = check.energy_sources()
    assert lines[0] == "rapl: package-0, dram-0, package-1, dram-1 (readable)"
    assert all(line.startswith("nvml energy: ") for line in lines[1:]) and lines[1:]
    results: list[tuple[str, str]] = [(".venv", "not built: bash envs/setup.sh")]
    text = check.overview(results)  # type: ignore[arg-type]
    block = text.split("Energy sources on this host (what its ranks record in /energy):\n", 1)[1].split("\n\n", 1)[0]
    assert block.splitlines() == [f"  {line}" for line in lines]
    assert check.as_json(results)["energy"] == lines  # type: ignore[arg-type]
