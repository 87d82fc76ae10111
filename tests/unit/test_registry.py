"""hpcbench.registry with a throwaway package of parts written to tmp_path."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpcbench.errors import HpcbenchError
from hpcbench.registry import Registry, import_error

MISSING = "hb_surely_missing_module_4f1c"


@dataclass
class Parts:
    package: str
    registry: Registry[Any]


def _write(directory: Path, name: str, body: str) -> None:
    (directory / name).write_text(textwrap.dedent(body))


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Parts]:
    package = f"hb_parts_{uuid.uuid4().hex[:10]}"
    root = tmp_path / package
    root.mkdir()
    _write(root, "__init__.py", "")
    _write(
        root,
        "registry.py",  # skipped by discovery: holds the registry itself
        f"""
        from hpcbench.registry import Registry
        WIDGETS = Registry("widget", {package!r})
        """,
    )
    _write(
        root,
        "base.py",  # skipped by discovery, but imported by the parts
        f"""
        from typing import ClassVar
        from {package}.registry import WIDGETS

        class Widget:
            name: ClassVar[str]
            requires: ClassVar[tuple[str, ...]] = ()
        """,
    )
    _write(
        root,
        "alpha.py",
        f"""
        from {package}.base import WIDGETS, Widget

        @WIDGETS.register
        class Alpha(Widget):
            name = "alpha"
            requires = ("json",)

        @WIDGETS.register
        class AlphaTwo(Widget):
            name = "alpha2"
        """,
    )
    _write(
        root,
        "needs_lib.py",  # imports fine; its library is only imported when a point uses it
        f"""
        from {package}.base import WIDGETS, Widget

        @WIDGETS.register
        class Heavy(Widget):
            name = "heavy"
            requires = ("json", {MISSING!r})
        """,
    )
    _write(root, "broken.py", f"import {MISSING}_too\n")
    _write(root, "crashes.py", "raise RuntimeError('boom at import')\n")
    _write(root, "_private.py", "raise RuntimeError('private modules are not parts')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    registry = importlib.import_module(f"{package}.registry").WIDGETS
    yield Parts(package, registry)
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def test_discovery_registers_classes_of_every_module(parts: Parts) -> None:
    assert parts.registry.names() == ["alpha", "alpha2", "heavy"]
    assert [cls.name for cls in parts.registry] == ["alpha", "alpha2", "heavy"]
    assert parts.registry.get("alpha").__module__ == f"{parts.package}.alpha"


def test_modules_that_fail_to_import_are_listed_as_broken(parts: Parts) -> None:
    broken = parts.registry.broken
    assert set(broken) == {"broken", "crashes"}
    assert "ModuleNotFoundError" in broken["broken"]
    assert f"{MISSING}_too" in broken["broken"]
    assert "RuntimeError" in broken["crashes"]
    assert "boom at import" in broken["crashes"]


def test_private_and_base_modules_are_not_parts(parts: Parts) -> None:
    parts.registry.names()
    assert f"{parts.package}._private" not in sys.modules
    assert "_private" not in parts.registry.broken


def test_broken_is_a_copy(parts: Parts) -> None:
    parts.registry.broken.clear()
    assert "broken" in parts.registry.broken


def test_load_checks_required_modules(parts: Parts) -> None:
    assert parts.registry.load("alpha").name == "alpha"
    with pytest.raises(HpcbenchError) as info:
        parts.registry.load("heavy")
    message = str(info.value)
    assert "'heavy'" in message
    assert MISSING in message
    assert "widget" in message
    # get() does not import the requirements: the part stays listed and usable for checks
    assert parts.registry.get("heavy").name == "heavy"


def test_unknown_name_lists_known_names(parts: Parts) -> None:
    with pytest.raises(HpcbenchError) as info:
        parts.registry.get("gamma")
    message = str(info.value)
    assert "'gamma'" in message
    assert "alpha, alpha2, heavy" in message
    with pytest.raises(HpcbenchError):
        parts.registry.load("gamma")


def test_registering_another_class_under_a_taken_name_fails(parts: Parts) -> None:
    parts.registry.names()

    class Impostor:
        name = "alpha"
        requires = ()

    with pytest.raises(HpcbenchError, match="alpha"):
        parts.registry.register(Impostor)
    # registering the same class again is harmless
    alpha = parts.registry.get("alpha")
    assert parts.registry.register(alpha) is alpha


def test_import_error_reports_the_first_failure() -> None:
    assert import_error(()) is None
    assert import_error(("json", "os")) is None
    error = import_error(("json", MISSING, "also_missing_hb"))
    assert error is not None
    assert error.startswith(f"{MISSING}: ModuleNotFoundError")
