"""The dense peak table: names as NVML and ROCm report them find the right row and only it,
the numbers are dense and in order, and MFU against them is a fraction."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from hpcbench.devices import peaks
from hpcbench.devices.peaks import DTYPES, TABLE, Peak, match, mfu, mfu_problem, peak_for
from hpcbench.errors import HpcbenchError

# Names as nvmlDeviceGetName (or ROCm) reports them -> the table row they are.
REAL_NAMES = {
    "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM",
    "NVIDIA H100 SXM5 80GB": "NVIDIA H100 SXM",
    "NVIDIA H100 PCIe": "NVIDIA H100 PCIe",
    "NVIDIA H100 NVL": "NVIDIA H100 NVL",
    "NVIDIA H200": "NVIDIA H200 SXM",
    "NVIDIA H200 NVL": "NVIDIA H200 NVL",
    "NVIDIA GH200 480GB": "NVIDIA GH200",
    "NVIDIA GH200 144G HBM3e": "NVIDIA GH200",
    "NVIDIA A100-SXM4-40GB": "NVIDIA A100 SXM",
    "NVIDIA A100-SXM4-80GB": "NVIDIA A100 SXM",
    "NVIDIA A100-PCIE-40GB": "NVIDIA A100 PCIe",
    "NVIDIA A100 80GB PCIe": "NVIDIA A100 PCIe",
    "NVIDIA A10": "NVIDIA A10",
    "NVIDIA A30": "NVIDIA A30",
    "NVIDIA A40": "NVIDIA A40",
    "NVIDIA L4": "NVIDIA L4",
    "NVIDIA L40": "NVIDIA L40",
    "NVIDIA L40S": "NVIDIA L40S",
    "Tesla V100-SXM2-16GB": "NVIDIA V100 SXM2",
    "Tesla V100-SXM2-32GB": "NVIDIA V100 SXM2",
    "Tesla V100-PCIE-16GB": "NVIDIA V100 PCIe",
    "Tesla V100-PCIE-32GB": "NVIDIA V100 PCIe",
    "Tesla V100S-PCIE-32GB": "NVIDIA V100S PCIe",
    "Tesla T4": "NVIDIA T4",
    "NVIDIA B200": "NVIDIA B200",
    "NVIDIA B100": "NVIDIA B100",
    "NVIDIA GB200": "NVIDIA GB200",
    "AMD Instinct MI250X": "AMD Instinct MI250X",
    "AMD Instinct MI300X": "AMD Instinct MI300X",
    "AMD Instinct MI325X": "AMD Instinct MI325X",
}

UNKNOWN = [
    "NVIDIA Imaginary X9",
    "",
    "NVIDIA H100",  # SXM, PCIe or NVL: not said, not guessed
    "NVIDIA H800",
    "NVIDIA A10G",  # not an A10
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a slice of an A100
    "AMD Instinct MI250X/MI250",  # one name for two devices
    "AMD Instinct MI300A",
    "Intel(R) Xeon(R) Processor (2 CPUs)",
]


def _rows_matching(name: str) -> list[str]:
    return [row.name for row in TABLE if row.matches(name)]


@pytest.mark.parametrize(("name", "row"), REAL_NAMES.items())
def test_real_names_match_their_row_and_only_it(name: str, row: str) -> None:
    found = match(name)
    assert found is not None and found.name == row
    assert _rows_matching(name) == [row]  # whatever the table's order


@pytest.mark.parametrize("row", [row.name for row in TABLE])
def test_every_table_name_matches_its_own_row_only(row: str) -> None:
    found = match(row)
    assert found is not None and found.name == row
    assert _rows_matching(row) == [row]


def test_every_row_has_a_real_name_in_the_tests() -> None:
    assert {row.name for row in TABLE} == set(REAL_NAMES.values())


@pytest.mark.parametrize("name", UNKNOWN)
def test_unknown_names_match_nothing(name: str) -> None:
    assert match(name) is None
    assert peak_for(name, "bf16") is None


def test_the_look_alikes_stay_apart() -> None:
    def row(name: str) -> str | None:
        found = match(name)
        return found.name if found else None

    assert row("NVIDIA H100 NVL") == "NVIDIA H100 NVL" != row("NVIDIA H100 80GB HBM3")
    assert row("NVIDIA H200") == "NVIDIA H200 SXM"
    assert row("NVIDIA H200 NVL") == "NVIDIA H200 NVL"
    assert row("NVIDIA GH200 480GB") == "NVIDIA GH200"
    assert row("NVIDIA GB200") == "NVIDIA GB200" != row("NVIDIA B200")
    assert row("NVIDIA A100 80GB PCIe") == "NVIDIA A100 PCIe"
    assert row("nvidia  a100-sxm4-80gb ") == "NVIDIA A100 SXM"  # case and spaces do not matter


def test_h100_sxm_is_the_dense_figure() -> None:
    peak = peak_for("NVIDIA H100 80GB HBM3", "bf16")
    assert peak is not None
    assert peak.flops_per_s == 989.4e12  # not the 1979 of 2:4 sparsity
    assert peak.source.startswith("table: NVIDIA H100 SXM (") and "dense" in peak.source
    assert peak.device == "NVIDIA H100 80GB HBM3"
    tf32 = peak_for("NVIDIA H100 80GB HBM3", "tf32")
    assert tf32 is not None and tf32.flops_per_s == 494.7e12
    pcie = peak_for("NVIDIA H100 PCIe", "bf16")
    assert pcie is not None and pcie.flops_per_s == 756e12
    a100 = peak_for("NVIDIA A100-SXM4-80GB", "bf16")
    assert a100 is not None and a100.flops_per_s == 312e12


def test_a_missing_dtype_is_none_not_another_number() -> None:
    for dtype in ("bf16", "tf32", "fp8"):
        assert peak_for("Tesla V100-SXM2-16GB", dtype) is None
        assert peak_for("Tesla T4", dtype) is None
    assert peak_for("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert peak_for("NVIDIA H100 80GB HBM3", "fp64") is None


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_numbers_are_sane(row: peaks.DevicePeaks) -> None:
    flops = row.flops
    assert set(flops) <= set(DTYPES)
    assert "fp32" in flops and "fp16" in flops
    assert all(math.isfinite(v) and 1e12 <= v <= 1e16 for v in flops.values())
    if "bf16" in flops:
        assert flops["bf16"] >= flops["fp32"]
    assert flops["fp16"] >= flops["fp32"]
    if "tf32" in flops:
        assert flops["fp32"] <= flops["tf32"] <= flops.get("bf16", flops["fp16"])
    if "fp8" in flops:
        assert flops["fp8"] >= flops["fp16"]
    assert row.source and "\n" not in row.source and "dense" in row.source


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_half_the_peak_is_an_mfu_of_one_half(row: peaks.DevicePeaks) -> None:
    for dtype in row.flops:
        peak = row.peak(dtype)
        assert peak is not None
        for devices in (1, 8, 1024):
            value = mfu(0.5 * peak.flops_per_s * devices, peak, devices)
            assert value == pytest.approx(0.5)
            assert mfu_problem(value, peak) is None


def test_mfu_without_a_peak_is_nan() -> None:
    assert math.isnan(mfu(1e15, peak_for("NVIDIA Imaginary X9", "bf16"), 8))
    assert mfu_problem(math.nan, None) is None
    with pytest.raises(ValueError, match="at least 1"):
        mfu(1e15, Peak(1e15, "bf16", "table: x", "x"), 0)


def test_mfu_over_one_is_flagged() -> None:
    # the sparse H100 figure halves MFU; an A100 peak on an H100 gives more than 100 %
    a100 = peak_for("NVIDIA A100-SXM4-80GB", "bf16")
    value = mfu(0.4 * 989.4e12, a100, 1)
    assert value > 1.0  # returned as it is ...
    problem = mfu_problem(value, a100)
    assert problem is not None  # ... and said to be wrong
    assert problem.startswith("MFU 1.27 is over 100 %") and "NVIDIA A100 SXM" in problem
    assert mfu_problem(1.0, a100) is None and mfu_problem(0.3, a100) is None


def test_measured_peaks_fill_in_for_the_table() -> None:
    measured = {
        "Intel(R) Xeon(R) Processor (2 CPUs)": {
            "fp32": {"flops_per_s": 2.0e11, "source": "measured: xeon fp32 matmul n=2048, 2025-01-01"},
            "bf16": {"flops_per_s": "fast"},  # damaged: ignored
        },
        "NVIDIA H100 80GB HBM3": {"bf16": {"flops_per_s": 7.0e14, "source": "measured: h100"}},
        "Tesla V100-SXM2-16GB": {"bf16": {"flops_per_s": 3.0e13, "source": "measured: v100 bf16"}},
        "broken": "not an object",
    }
    cpu = peak_for("Intel(R) Xeon(R) Processor (2 CPUs)", "fp32", measured)
    assert cpu == Peak(2.0e11, "fp32", "measured: xeon fp32 matmul n=2048, 2025-01-01",
                       "Intel(R) Xeon(R) Processor (2 CPUs)")  # fmt: skip
    assert peak_for("Intel(R) Xeon(R) Processor (2 CPUs)", "bf16", measured) is None
    assert peak_for("Intel(R) Xeon(R) Processor (4 CPUs)", "fp32", measured) is None  # exact names only
    assert peak_for("broken", "fp32", measured) is None
    table = peak_for("NVIDIA H100 80GB HBM3", "bf16", measured)
    assert table is not None and table.flops_per_s == 989.4e12  # the table first
    v100 = peak_for("Tesla V100-SXM2-16GB", "bf16", measured)
    assert v100 is not None and v100.source == "measured: v100 bf16"  # what the table lacks


def test_precisions_map_to_their_dtype() -> None:
    assert [peaks.dtype_for_precision(p) for p in (None, "fp32", "tf32", "bf16", "fp16")] == [
        "fp32", "fp32", "tf32", "bf16", "fp16",
    ]  # fmt: skip
    with pytest.raises(HpcbenchError, match="allowed: fp32, tf32, bf16, fp16"):
        peaks.dtype_for_precision("fp64")


def test_precisions_are_the_specs() -> None:
    from hpcbench.spec.fields import PRECISIONS

    assert peaks.PRECISIONS == PRECISIONS


def test_docs_table_agrees_with_the_code() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics-and-model.md").read_text(encoding="utf-8")
    assert peaks.markdown_table() in docs


def test_peaks_imports_no_framework() -> None:
    source = Path(peaks.__file__).read_text(encoding="utf-8")
    imported = set(re.findall(r"^(?:from|import) ([\w.]+)", source, re.MULTILINE))
    assert imported <= {"__future__", "math", "re", "collections.abc", "dataclasses", "typing", "hpcbench.errors"}
