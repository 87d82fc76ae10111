"""The documentation against the code: docs/point-file.md names every column of every structured
dtype of the point-file schema, its current version and every phase; README.md stays a front door
(at most 200 lines); and every relative link in README.md and docs/*.md leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from hpcbench.store import schema

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
POINT_FILE_DOC = DOCS / "point-file.md"
README_MAX_LINES = 200

# [text](target) and [text](target "title"); images too. Targets in angle brackets are autolinks.
_LINK = re.compile(r"\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_CODE_BLOCK = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")


def structured_dtypes() -> dict[str, np.dtype]:
    """Every structured numpy dtype defined in the schema module, by attribute name."""
    found = {}
    for name in dir(schema):
        value = getattr(schema, name)
        if isinstance(value, np.dtype) and value.names:
            found[name] = value
    return found


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def relative_links(text: str) -> list[str]:
    """Link targets that point into the repository (no scheme, no pure anchor), code left out."""
    prose = _INLINE_CODE.sub("", _CODE_BLOCK.sub("", text))
    targets = []
    for target in _LINK.findall(prose):
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith(("#", "//")):
            continue
        targets.append(target)
    return targets


@pytest.fixture(scope="module")
def point_file_doc() -> str:
    return POINT_FILE_DOC.read_text(encoding="utf-8")


def test_schema_defines_the_dtypes_the_doc_must_cover() -> None:
    names = set(structured_dtypes())
    assert {"ITERATION_DTYPE", "RANK_DTYPE", "COMM_DTYPE", "RESOURCE_DTYPE", "EVAL_DTYPE"} <= names


@pytest.mark.parametrize("dtype_name", sorted(structured_dtypes()))
def test_point_file_doc_names_every_column(dtype_name: str, point_file_doc: str) -> None:
    dtype = structured_dtypes()[dtype_name]
    missing = [field for field in dtype.names or () if f"`{field}`" not in point_file_doc]
    assert not missing, f"docs/point-file.md does not describe {dtype_name} columns {missing}"


def test_point_file_doc_states_the_current_schema_version(point_file_doc: str) -> None:
    version = schema.SCHEMA_VERSION
    assert f"SCHEMA_VERSION = {version}" in point_file_doc, f"docs/point-file.md does not state version {version}"
    history_rows = re.findall(r"^\| (\d+) \|", point_file_doc, re.MULTILINE)
    assert [int(v) for v in history_rows] == list(range(1, version + 1)), "schema history table is not 1..current"


def test_point_file_doc_names_every_phase(point_file_doc: str) -> None:
    missing = [phase for phase in schema.PHASES if f"`{phase}`" not in point_file_doc]
    assert not missing, f"docs/point-file.md does not describe the phases {missing}"


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"


def test_link_extraction() -> None:
    text = (
        "[a](docs/spec.md) [b](#anchor) [c](https://example.org) <https://x.y> [d](../x.md#part)\n"
        '`[e](not/a/link.md)` [f](g.md "title")\n```\n[h](in/code.md)\n```\n'
    )
    assert relative_links(text) == ["docs/spec.md", "../x.md#part", "g.md"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(path: Path) -> None:
    broken = []
    for target in relative_links(path.read_text(encoding="utf-8")):
        file_part = target.split("#", 1)[0]
        if not file_part:
            continue
        resolved = (path.parent / file_part).resolve()
        if not resolved.exists():
            broken.append(target)
        elif not resolved.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
    assert not broken, f"{path.relative_to(ROOT)} links to missing files: {broken}"
