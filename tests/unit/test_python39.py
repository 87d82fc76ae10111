"""What a rank imports must run on Python 3.9: the Caffe environment's ranks run Debian 11's
python3 (pycaffe exists only for it). The rest of hpcbench needs 3.10.

Static, so that it runs without that environment (tests/frameworks/test_caffe.py imports
the same modules there for real): every hpcbench module reachable by imports from what runs
in a rank (the worker, the Caffe adapter, the capability probe of `hpcbench check`, the MPI
launchers) parses as Python 3.9 and evaluates none of the 3.10 forms at run time:
`zip(strict=)`, `X | Y` of classes (in `isinstance` / `issubclass`, or a module-level alias),
`dataclass(slots=, kw_only=)`, `match`, `traceback.format_exception_only(exc)` with the
exception alone.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hpcbench"
ENTRY = ("worker", "frameworks.caffe", "plan.capabilities", "plan.launch", "launchers.mpirun", "launchers.srun")


def _file(module: str) -> Path | None:
    path = PACKAGE.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(module: str, tree: ast.Module) -> set[str]:
    """hpcbench modules this module imports at its top level (not inside functions or TYPE_CHECKING)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {a.name.removeprefix("hpcbench.") for a in node.names if a.name.startswith("hpcbench.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hpcbench"):
            base = node.module.removeprefix("hpcbench").lstrip(".")
            found.add(base)
            found |= {f"{base}.{a.name}".lstrip(".") for a in node.names if _file(f"{base}.{a.name}".lstrip("."))}
    parts = module.split(".")
    found |= {".".join(parts[:i]) for i in range(1, len(parts))}  # the packages above it run first
    return {m for m in found if m and _file(m)}


@functools.cache
def reachable() -> dict[str, ast.Module]:
    seen: dict[str, ast.Module] = {}
    todo = list(ENTRY)
    while todo:
        module = todo.pop()
        path = _file(module)
        if module in seen or path is None:
            continue
        seen[module] = tree = ast.parse(path.read_text(), str(path), feature_version=(3, 9))
        todo += sorted(_imports(module, tree) - set(seen))
    return seen


def _is_type_union(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return all(_is_type_union(side) for side in (node.left, node.right))
    return isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) or (
        isinstance(node, ast.Constant) and node.value is None
    )


def problems(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            keywords = {k.arg for k in node.keywords}
            if node.func.id == "zip" and "strict" in keywords:
                found.append(f"{line}: zip(strict=)")
            if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                second = node.args[1]
                if isinstance(second, ast.BinOp) and _is_type_union(second):
                    found.append(f"{line}: {node.func.id} with X | Y")
            if node.func.id == "dataclass" and keywords & {"slots", "kw_only"}:
                found.append(f"{line}: dataclass(slots=, kw_only=)")
        call = node.func if isinstance(node, ast.Call) and len(node.args) == 1 else None
        if isinstance(call, ast.Attribute) and call.attr in (
            "format_exception_only",
            "format_exception",
            "print_exception",
        ):
            found.append(f"{line}: traceback.{call.attr}(exc) (3.9 takes the type, then the value)")
        if isinstance(node, ast.Match):
            found.append(f"{line}: match")
    for node in tree.body:  # module-level aliases are evaluated when the module loads
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.BinOp) and _is_type_union(value):
            found.append(f'{node.lineno}: alias with X | Y (quote it: `Name: TypeAlias = "X | Y"`)')
    return found


def test_the_walk_reaches_what_a_rank_runs() -> None:
    modules = reachable()
    for module in ("worker", "spec.point", "workloads.layers", "store.writer", "trace.messages", "rank.linkage"):
        assert module in modules, module


@pytest.mark.parametrize("module", sorted(reachable()))
def test_rank_side_module_runs_on_python_3_9(module: str) -> None:
    assert problems(reachable()[module]) == []


def test_the_check_finds_each_form() -> None:
    code = """
A = int | None
def f(x, a, b):
    traceback.format_exception_only(x)
    isinstance(x, int | str)
    zip(a, b, strict=True)
    match x:
        case 1:
            pass
"""
    found = problems(ast.parse(code))
    assert sorted(f.split(": ", 1)[1].split(" (")[0] for f in found) == [
        "alias with X | Y",
        "isinstance with X | Y",
        "match",
        "traceback.format_exception_only(exc)",
        "zip(strict=)",
    ]
    assert (
        problems(ast.parse("A = 1 | 2\nisinstance(x, (int, str))\nzip(a, b)\nformat_exception_only(type(x), x)\n"))
        == []
    )
