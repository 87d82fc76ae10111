"""Which power reading the sampler's "gpu" source takes (`power_reader`), against a FAKE pynvml
(no GPU on this machine): the instantaneous field where NVML answers it, else the averaged
reading, and the description says which and why. On a GPU, tests/gpu/test_energy.py reads both."""

from __future__ import annotations

from typing import Any

import pytest

from hpcbench.trace.gpu import AVERAGED, INSTANT, power_reader
from tests.unit.test_energy import FakeNvml

pynvml = pytest.importorskip("pynvml")


class FakeFieldNvml(FakeNvml):
    """FAKE pynvml with nvmlDeviceGetFieldValues: `instant_mw`, or `field_return` as the field's status."""

    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_FI_DEV_POWER_INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT

    def __init__(self, instant_mw: int = 612_345, field_return: int = pynvml.NVML_SUCCESS, **kw: Any) -> None:
        super().__init__(**kw)
        self.instant_mw, self.field_return = instant_mw, field_return
        self.asked: list[list[int]] = []

    def nvmlDeviceGetFieldValues(self, handle: Any, fields: list[int]) -> list[Any]:
        self.asked.append(list(fields))
        value = pynvml.c_nvmlFieldValue_t()
        value.fieldId, value.nvmlReturn = fields[0], self.field_return
        value.value.uiVal = self.instant_mw
        return [value]


def test_the_instantaneous_field_where_nvml_answers_it() -> None:
    nvml = FakeFieldNvml(power_mw=250_000)
    read, how = power_reader(nvml, ("fake handle", 0))
    assert how == INSTANT
    assert read() == pytest.approx(612.345)
    assert nvml.asked[-1] == [pynvml.NVML_FI_DEV_POWER_INSTANT]


def test_the_averaged_reading_where_the_field_is_not_supported() -> None:
    nvml = FakeFieldNvml(power_mw=250_000, field_return=pynvml.NVML_ERROR_NOT_SUPPORTED)
    read, how = power_reader(nvml, ("fake handle", 0))
    assert how.startswith(AVERAGED) and "no instantaneous power: " in how and "Not Supported" in how, how
    assert read() == pytest.approx(250.0)


def test_the_averaged_reading_where_pynvml_has_no_such_field() -> None:
    nvml = FakeNvml(power_mw=125_500)  # no nvmlDeviceGetFieldValues, no NVML_FI_DEV_POWER_INSTANT
    read, how = power_reader(nvml, ("fake handle", 0))
    assert how == f"{AVERAGED} (this pynvml has no NVML_FI_DEV_POWER_INSTANT)"
    assert read() == pytest.approx(125.5)
