"""Property-based fuzzing of sweep specs: whatever the text, loading it either gives points
or raises SpecError naming the field — never another exception, never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcbench.errors import SpecError, one_line
from hpcbench.executors import catalog
from hpcbench.plan.launch import load_text
from tests.conftest import run_module

VALID: dict[str, Any] = {
    "name": "fuzz",
    "executor": "local",
    "matrix": {"ranks_per_node": [1, 2], "model": ["lenet", "mlp"]},
    "fixed": {"framework": "torch", "backend": "gloo", "batch_size": 8, "iterations": 4, "warmup": 1, "lr": 0.01},
    "options": {"writer": "auto", "flush_every": 100},
}

INT_FIELDS = ("nodes", "ranks_per_node", "batch_size", "iterations", "warmup", "seed")
NAME_FIELDS = ("framework", "backend", "launcher", "model", "dataset", "device", "optimizer")
SECTIONS = ("matrix", "fixed", "exclude", "options", "slurm")

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
not_an_int = st.one_of(
    st.text(max_size=10), st.floats(), st.booleans(), st.integers(max_value=-1),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)  # fmt: skip
not_a_name = st.one_of(
    st.integers(), st.floats(), st.booleans(), st.just(""), st.text(max_size=12).map(lambda s: s + "\N{SNOWMAN}"),
    st.lists(st.text(max_size=3), min_size=1, max_size=3).map(lambda x: {"nested": x}),
)  # fmt: skip


def load(spec: Any) -> None:
    load_text(yaml.safe_dump(spec, allow_unicode=True), catalog())


def error_of(text: str) -> SpecError | None:
    """The SpecError loading `text` raises (None if it loads); any other exception fails the test."""
    try:
        load_text(text, catalog())
    except SpecError as exc:
        return exc
    return None


def rejected(spec: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        load(spec)
    message = str(info.value)
    assert "\n" not in message, "one line"
    assert "Traceback" not in message
    return info.value


def with_fixed(field: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(VALID)
    spec["matrix"].pop(field, None)
    spec["fixed"][field] = value
    return spec


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_any_text_loads_or_raises_spec_error(text: str) -> None:
    error = error_of(text)
    assert error is None or "\n" not in str(error)


@settings(max_examples=300, deadline=None)
@given(values)
def test_any_document_loads_or_raises_spec_error(document: Any) -> None:
    error = error_of(yaml.safe_dump(document, allow_unicode=True))
    assert error is None or "\n" not in str(error)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SECTIONS), values)
def test_any_section_value_loads_or_raises_spec_error_naming_the_section(section: str, value: Any) -> None:
    spec = copy.deepcopy(VALID)
    spec[section] = value
    error = error_of(yaml.safe_dump(spec, allow_unicode=True))
    assert error is None or error.path.split(".")[0].split("[")[0] in (section, "fixed", "matrix", "point", "sweep")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(INT_FIELDS), not_an_int)
def test_a_bad_integer_field_is_named(field: str, value: Any) -> None:
    error = rejected(with_fixed(field, value))
    assert field in error.path, str(error)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAME_FIELDS), not_a_name)
def test_a_bad_name_field_is_named(field: str, value: Any) -> None:
    error = rejected(with_fixed(field, value))
    assert field in error.path or field in str(error), str(error)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(INT_FIELDS + NAME_FIELDS), st.one_of(st.just([]), not_an_int.map(lambda v: [1, v])))
def test_a_bad_matrix_axis_is_named(field: str, axis: Any) -> None:
    if axis and field not in INT_FIELDS:
        axis = [VALID["fixed"].get(field, "lenet"), 17]
    spec = copy.deepcopy(VALID)
    spec["fixed"].pop(field, None)
    spec["matrix"][field] = axis
    error = rejected(spec)
    assert field in error.path, str(error)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=12).filter(lambda k: k not in (*SECTIONS, "name", "executor", "profile")))
def test_an_unknown_top_level_key_is_named(key: str) -> None:
    spec = copy.deepcopy(VALID)
    spec[key] = 1
    error = rejected(spec)
    (as_read,) = set(yaml.safe_load(yaml.safe_dump(spec, allow_unicode=True))) - set(VALID)  # YAML folds some breaks
    assert one_line(str(as_read)) in str(error)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(INT_FIELDS), not_an_int)
def test_the_cli_rejects_before_any_job(tmp_path: Path, field: str, value: Any) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(with_fixed(field, value), allow_unicode=True))
    out = tmp_path / f"out-{field}"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 2
    assert res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and field in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()
