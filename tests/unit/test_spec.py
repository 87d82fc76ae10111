"""hpcbench.spec: expansion, excludes, synonyms, stable point ids, and error messages."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import pytest

from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.spec import Point, Sweep, load_sweep

# Every Point field with its documented default, written out by hand (not read from the
# code) so that a changed default, which would change every existing point id, is noticed.
HAND_DEFAULTS: dict[str, Any] = {
    "framework": "torch",
    "backend": "gloo",
    "launcher": "mpirun",
    "nodes": 1,
    "ranks_per_node": 1,
    "device": "cpu",
    "model": "lenet",
    "dataset": "synthetic",
    "batch_size": 32,
    "iterations": 100,
    "warmup": 10,
    "optimizer": "sgd",
    "lr": 0.01,
    "seed": 0,
}


def expected_id(set_fields: dict[str, Any]) -> str:
    """The documented rule: sha256 of the canonical JSON (sorted keys, no spaces) of the set fields, 12 hex."""
    blob = json.dumps(set_fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def sweep(body: str, **kwargs: Any) -> Sweep:
    return load_sweep("name: t\n" + body, **kwargs)


def fields_of(s: Sweep, *names: str) -> set[tuple[Any, ...]]:
    return {tuple(getattr(p, n) for n in names) for p in s.points}


# --------------------------------------------------------------------------------------
# Expansion


def test_matrix_is_cartesian_product_with_fixed_values() -> None:
    s = sweep(
        "matrix:\n"
        "  ranks_per_node: [1, 2, 4]\n"
        "  model: [lenet, mlp]\n"
        "  seed: [3, 7]\n"
        "fixed:\n"
        "  batch_size: 16\n"
        "  lr: 0.5\n"
    )
    assert len(s.points) == 12
    assert fields_of(s, "ranks_per_node", "model", "seed") == {
        (r, m, seed) for r in (1, 2, 4) for m in ("lenet", "mlp") for seed in (3, 7)
    }
    assert all(p.batch_size == 16 and p.lr == 0.5 for p in s.points)
    # untouched fields keep their defaults
    assert all(p.optimizer == "sgd" and p.nodes == 1 and p.environ == () for p in s.points)
    assert len({p.id for p in s.points}) == 12
    assert s.name == "t"
    assert s.executor == "local"
    assert s.warnings == ()


def test_only_fixed_gives_one_point_and_origin_names_sections() -> None:
    s = sweep("matrix:\n  nodes: [1, 2]\nfixed:\n  warmup: 0\n  iterations: 3\n")
    assert fields_of(s, "nodes", "warmup", "iterations") == {(1, 0, 3), (2, 0, 3)}
    assert s.origin == {"nodes": "matrix.nodes", "warmup": "fixed.warmup", "iterations": "fixed.iterations"}
    single = sweep("fixed:\n  batch_size: 4\n")
    assert len(single.points) == 1
    assert single.points[0].batch_size == 4


def test_spec_text_and_options_are_kept() -> None:
    text = "name: keep\nexecutor: slurm\noptions:\n  writer: gather\n  flush_every: 5\n  timeout_s: 90\n"
    s = load_sweep(text)
    assert s.text == text
    assert s.executor == "slurm"
    assert (s.options.writer, s.options.flush_every, s.options.timeout_s) == ("gather", 5, 90.0)
    assert isinstance(s.options.timeout_s, float)


def test_options_do_not_change_point_ids() -> None:
    a = sweep("fixed: {batch_size: 8}\n")
    b = sweep("fixed: {batch_size: 8}\noptions: {writer: mpio, flush_every: 3}\n")
    assert a.points[0].id == b.points[0].id


# --------------------------------------------------------------------------------------
# Exclude


def test_exclude_drops_matching_partial_points() -> None:
    s = sweep(
        "matrix:\n  ranks_per_node: [1, 2, 4]\n  model: [lenet, mlp]\n"
        "exclude:\n  - {ranks_per_node: 4, model: mlp}\n  - {ranks_per_node: 1, model: lenet}\n"
    )
    assert fields_of(s, "ranks_per_node", "model") == {(1, "mlp"), (2, "lenet"), (2, "mlp"), (4, "lenet")}
    assert s.warnings == ()


def test_exclude_single_field_drops_a_whole_slice() -> None:
    s = sweep("matrix:\n  ranks_per_node: [1, 2]\n  seed: [0, 1, 2]\nexclude:\n  - {seed: 1}\n")
    assert fields_of(s, "ranks_per_node", "seed") == {(1, 0), (1, 2), (2, 0), (2, 2)}


def test_exclude_compares_unset_fields_with_their_defaults() -> None:
    # device is not in the spec; every point has the default (cpu), so this drops ranks_per_node 2
    s = sweep("matrix:\n  ranks_per_node: [1, 2]\nexclude:\n  - {ranks_per_node: 2, device: cpu}\n")
    assert fields_of(s, "ranks_per_node") == {(1,)}
    # ... and one naming a different device drops nothing, with a warning
    s = sweep("matrix:\n  ranks_per_node: [1, 2]\nexclude:\n  - {ranks_per_node: 2, device: cuda}\n")
    assert fields_of(s, "ranks_per_node") == {(1,), (2,)}
    assert s.warnings == ("exclude[0] matches no point",)


def test_exclude_matching_nothing_warns_with_its_index() -> None:
    s = sweep(
        "matrix:\n  ranks_per_node: [1, 2]\n"
        "exclude:\n  - {ranks_per_node: 2}\n  - {ranks_per_node: 8}\n  - {model: mlp}\n"
    )
    assert fields_of(s, "ranks_per_node") == {(1,)}
    assert len(s.warnings) == 2
    assert "exclude[1]" in s.warnings[0]
    assert "exclude[2]" in s.warnings[1]
    assert all("matches no point" in w for w in s.warnings)


def test_exclude_accepts_the_synonym() -> None:
    s = sweep("matrix:\n  ranks_per_node: [1, 2]\nexclude:\n  - {gpus_per_node: 2}\n")
    assert fields_of(s, "ranks_per_node") == {(1,)}


# --------------------------------------------------------------------------------------
# gpus_per_node


@pytest.mark.parametrize("section", ["matrix", "fixed"])
def test_gpus_per_node_is_ranks_per_node(section: str) -> None:
    value = "[2]" if section == "matrix" else "2"
    s = sweep(f"{section}:\n  gpus_per_node: {value}\n")
    assert s.points[0].ranks_per_node == 2
    assert s.origin == {"ranks_per_node": f"{section}.gpus_per_node"}
    assert s.points[0].id == sweep(f"{section}:\n  ranks_per_node: {value}\n").points[0].id


@pytest.mark.parametrize(
    ("body", "path", "other"),
    [
        ("fixed:\n  ranks_per_node: 2\n  gpus_per_node: 2\n", "fixed.gpus_per_node", "fixed.ranks_per_node"),
        ("fixed:\n  gpus_per_node: 2\n  ranks_per_node: 2\n", "fixed.ranks_per_node", "fixed.gpus_per_node"),
        (
            "matrix:\n  gpus_per_node: [1]\nfixed:\n  ranks_per_node: 4\n",
            "fixed.ranks_per_node",
            "matrix.gpus_per_node",
        ),
    ],
)
def test_gpus_per_node_and_ranks_per_node_together_is_an_error(body: str, path: str, other: str) -> None:
    with pytest.raises(SpecError) as info:
        sweep(body)
    assert info.value.path == path
    assert other in str(info.value)


def test_same_field_in_matrix_and_fixed_is_an_error() -> None:
    with pytest.raises(SpecError) as info:
        sweep("matrix:\n  seed: [1, 2]\nfixed:\n  seed: 3\n")
    assert info.value.path == "fixed.seed"
    assert "matrix.seed" in str(info.value)


# --------------------------------------------------------------------------------------
# Point ids


def test_known_point_id_follows_the_documented_rule() -> None:
    p = sweep("fixed:\n  ranks_per_node: 2\n  batch_size: 16\n  lr: 0.001\n").points[0]
    expected_fields = {**HAND_DEFAULTS, "ranks_per_node": 2, "batch_size": 16, "lr": 0.001}
    assert p.id == expected_id(expected_fields)
    assert len(p.id) == 12
    assert all(c in "0123456789abcdef" for c in p.id)


def test_known_point_id_with_mappings_and_optional_fields() -> None:
    p = sweep(
        "fixed:\n  threads: 3\n  data_dir: /data/x\n  environ: {ZED: z, ALPHA: 1}\n  extra: {knob: true, level: 2}\n"
    ).points[0]
    expected_fields = {
        **HAND_DEFAULTS,
        "threads": 3,
        "data_dir": "/data/x",
        "environ": {"ALPHA": "1", "ZED": "z"},
        "extra": {"knob": True, "level": 2},
    }
    assert p.id == expected_id(expected_fields)


def test_point_id_does_not_depend_on_yaml_key_order_or_section() -> None:
    a = load_sweep("name: a\nfixed:\n  batch_size: 16\n  model: mlp\n  seed: 4\nmatrix:\n  ranks_per_node: [2]\n")
    b = load_sweep("matrix:\n  seed: [4]\n  batch_size: [16]\nfixed:\n  ranks_per_node: 2\n  model: mlp\nname: b\n")
    c = load_sweep("name: c\nfixed: {seed: 4, ranks_per_node: 2, model: mlp, batch_size: 16}\n")
    assert a.points[0].id == b.points[0].id == c.points[0].id
    assert a.points[0] == b.points[0] == c.points[0]


def test_point_id_of_environ_does_not_depend_on_key_order() -> None:
    a = sweep("fixed:\n  environ: {A: '1', B: '2'}\n").points[0]
    b = sweep("fixed:\n  environ: {B: '2', A: '1'}\n").points[0]
    assert a.id == b.id


def test_writing_a_default_explicitly_gives_the_same_id() -> None:
    a = sweep("fixed: {batch_size: 8}\n").points[0]
    b = sweep("fixed: {batch_size: 8, optimizer: sgd, nodes: 1}\n").points[0]
    assert a.id == b.id


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("seed: 0", "seed: 1"),
        ("lr: 0.1", "lr: 0.01000001"),
        ("model: lenet", "model: mlp"),
        ("environ: {A: '1'}", "environ: {A: '2'}"),
        ("environ: {A: '1'}", "environ: {B: '1'}"),
        ("threads: 1", "threads: 2"),
        ("extra: {k: 1}", "extra: {k: '1'}"),
        ("nodes: 2", "ranks_per_node: 2"),
    ],
)
def test_different_fields_give_different_ids(one: str, other: str) -> None:
    a = sweep(f"fixed: {{{one}}}\n").points[0]
    b = sweep(f"fixed: {{{other}}}\n").points[0]
    assert a != b
    assert a.id != b.id


def test_lr_written_as_string_exponent_is_a_float() -> None:
    # YAML 1.1 reads 1e-3 (no dot) as a string; the spec still accepts it as a number.
    p = sweep("fixed:\n  lr: 1e-3\n").points[0]
    assert isinstance(p.lr, float)
    assert p.lr == 0.001
    assert p.id == sweep("fixed:\n  lr: 0.001\n").points[0].id


def test_integer_lr_has_the_same_id_as_the_float() -> None:
    a = sweep("fixed:\n  lr: 1\n").points[0]
    b = sweep("fixed:\n  lr: 1.0\n").points[0]
    assert isinstance(a.lr, float)
    assert a.id == b.id


def test_point_json_round_trip() -> None:
    s = sweep(
        "matrix:\n  ranks_per_node: [1, 3]\n"
        "fixed:\n"
        "  threads: 2\n"
        "  lr: 0.25\n"
        "  data_dir: /d\n"
        "  environ: {NCCL_DEBUG: INFO, OMP_PROC_BIND: 'true'}\n"
        "  extra: {flag: false, ratio: 0.5, name: x, n: 3}\n"
    )
    for p in s.points:
        again = Point.from_json(p.to_json())
        assert again == p
        assert again.id == p.id
        assert hash(again) == hash(p)
    assert Point.from_json(Point().to_json()) == Point()


def test_point_from_dict_rejects_unknown_fields() -> None:
    d = json.loads(Point().to_json())
    d["colour"] = "red"
    with pytest.raises(SpecError, match="colour"):
        Point.from_dict(d)


# --------------------------------------------------------------------------------------
# Registry-backed choices and the cross-field check


def test_choices_accept_listed_values() -> None:
    s = sweep("matrix:\n  model: [lenet, resnet]\n", choices={"model": ["lenet", "resnet"], "framework": ["torch"]})
    assert fields_of(s, "model") == {("lenet",), ("resnet",)}


def _needs_cuda_for_nccl(p: Point) -> Iterable[tuple[str, str, str]]:
    if p.backend == "nccl" and p.device != "cuda":
        yield "backend", f"{p.backend!r} needs device cuda", "gloo"


def _rank_limit(p: Point) -> Iterable[tuple[str, str, str]]:
    if p.ranks_per_node > 2:
        yield "ranks_per_node", f"{p.ranks_per_node} ranks per node is too many", "at most 2"


@pytest.mark.parametrize(
    ("body", "check", "path", "words"),
    [
        (
            "matrix:\n  backend: [gloo, nccl]\n",
            _needs_cuda_for_nccl,
            "matrix.backend",
            ["needs device cuda", "gloo"],
        ),
        ("fixed:\n  backend: nccl\n", _needs_cuda_for_nccl, "fixed.backend", ["needs device cuda"]),
        ("matrix:\n  gpus_per_node: [1, 4]\n", _rank_limit, "matrix.gpus_per_node", ["4 ranks", "at most 2"]),
        ("fixed:\n  seed: 1\n", lambda p: [("device", "no devices here", "none")], "device (default)", ["no devices"]),
    ],
)
def test_check_problem_is_reported_at_the_fields_origin(body: str, check: Any, path: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        sweep(body, check=check)
    assert info.value.path == path
    for word in words:
        assert word in str(info.value)


def test_check_passes_every_point() -> None:
    seen: list[Point] = []

    def check(p: Point) -> Iterable[tuple[str, str, str]]:
        seen.append(p)
        return []

    s = sweep("matrix:\n  seed: [1, 2, 3]\nexclude:\n  - {seed: 2}\n", check=check)
    assert seen == list(s.points)
    assert len(seen) == 2


# --------------------------------------------------------------------------------------
# Bad specs: each names the path, the bad value (where there is one) and what is allowed.

LONG_NAME = "n" * 201

BAD_SPECS: list[tuple[str, str, str, list[str]]] = [
    # (id, spec text, path, words the message must contain: the value and the allowed values)
    ("unknown-top-key", "name: t\nmatrx: {seed: [1]}\n", "matrx", ["unknown key", "matrix", "fixed", "exclude"]),
    ("unknown-field", "name: t\nfixed:\n  batchsize: 8\n", "fixed.batchsize", ["unknown field", "batch_size"]),
    ("unknown-field-matrix", "name: t\nmatrix:\n  colour: [red]\n", "matrix.colour", ["gpus_per_node", "seed"]),
    ("bool-for-int", "name: t\nmatrix:\n  batch_size: [8, true]\n", "matrix.batch_size[1]", ["True", "integers >= 1"]),
    ("string-for-int", "name: t\nfixed:\n  iterations: '10'\n", "fixed.iterations", ["'10'", "integers >= 1"]),
    ("float-for-int", "name: t\nfixed:\n  nodes: 1.5\n", "fixed.nodes", ["1.5", "integers >= 1"]),
    ("negative-seed", "name: t\nfixed:\n  seed: -1\n", "fixed.seed", ["-1", "integers >= 0"]),
    ("zero-batch", "name: t\nmatrix:\n  batch_size: [8, 0]\n", "matrix.batch_size[1]", ["0", "integers >= 1"]),
    ("zero-threads", "name: t\nfixed:\n  threads: 0\n", "fixed.threads", ["0", "integers >= 1"]),
    ("negative-warmup", "name: t\nfixed:\n  warmup: -3\n", "fixed.warmup", ["-3", "integers >= 0"]),
    ("empty-matrix-list", "name: t\nmatrix:\n  model: []\n", "matrix.model", ["[]", "non-empty list"]),
    ("matrix-scalar", "name: t\nmatrix:\n  batch_size: 8\n", "matrix.batch_size", ["8", "non-empty list"]),
    ("duplicate-list-value", "name: t\nmatrix:\n  batch_size: [8, 16, 8]\n", "matrix.batch_size[2]", ["8", "distinct"]),
    ("duplicate-synonym-value", "name: t\nmatrix:\n  lr: [0.001, 1e-3]\n", "matrix.lr[1]", ["1e-3", "distinct"]),
    ("matrix-not-mapping", "name: t\nmatrix: [1, 2]\n", "matrix", ["mapping"]),
    ("fixed-not-mapping", "name: t\nfixed: 3\n", "fixed", ["mapping"]),
    ("exclude-not-list", "name: t\nexclude: {seed: 1}\n", "exclude", ["list"]),
    ("exclude-entry-not-mapping", "name: t\nexclude: [3]\n", "exclude[0]", ["mapping"]),
    ("exclude-empty-entry", "name: t\nexclude: [{}]\n", "exclude[0]", ["mapping"]),
    ("exclude-unknown-field", "name: t\nexclude:\n  - {foo: 1}\n", "exclude[0].foo", ["unknown field", "batch_size"]),
    (
        "exclude-bad-value",
        "name: t\nexclude:\n  - {seed: 1}\n  - {ranks_per_node: 0}\n",
        "exclude[1].ranks_per_node",
        ["0"],
    ),
    ("options-not-mapping", "name: t\noptions: [auto]\n", "options", ["mapping"]),
    ("options-unknown", "name: t\noptions:\n  writr: auto\n", "options.writr", ["writer", "flush_every", "timeout_s"]),
    ("options-writer", "name: t\noptions:\n  writer: fast\n", "options.writer", ["'fast'", "auto, mpio, gather"]),
    ("options-flush-zero", "name: t\noptions:\n  flush_every: 0\n", "options.flush_every", ["0", "integers >= 1"]),
    ("options-timeout-negative", "name: t\noptions:\n  timeout_s: -5\n", "options.timeout_s", ["-5", "positive"]),
    ("environ-not-mapping", "name: t\nfixed:\n  environ: [A]\n", "fixed.environ", ["['A']", "NAME: value"]),
    ("environ-bad-name", "name: t\nfixed:\n  environ: {1BAD: x}\n", "fixed.environ.1BAD", ["[A-Za-z_][A-Za-z0-9_]*"]),
    ("environ-name-space", "name: t\nfixed:\n  environ: {'A B': x}\n", "fixed.environ.A B", ["[A-Za-z_]"]),
    ("environ-name-equals", "name: t\nfixed:\n  environ: {'A=B': x}\n", "fixed.environ.A=B", ["[A-Za-z_]"]),
    (
        "environ-value-list",
        "name: t\nfixed:\n  environ: {A: [1]}\n",
        "fixed.environ.A",
        ["[1]", "a string or a number"],
    ),
    (
        "environ-value-bool",
        "name: t\nfixed:\n  environ: {A: true}\n",
        "fixed.environ.A",
        ["True", "string or a number"],
    ),
    (
        "environ-value-null",
        "name: t\nfixed:\n  environ: {A: null}\n",
        "fixed.environ.A",
        ["None", "string or a number"],
    ),
    ("environ-value-nul", 'name: t\nfixed:\n  environ: {A: "x\\0y"}\n', "fixed.environ.A", ["NUL"]),
    ("text-nul", 'name: t\nfixed:\n  model: "le\\0net"\n', "fixed.model", ["NUL"]),
    ("name-nul", 'name: "a\\0b"\n', "name", ["NUL"]),
    ("extra-not-scalar", "name: t\nfixed:\n  extra: {k: [1]}\n", "fixed.extra.k", ["[1]", "scalar"]),
    ("extra-not-mapping", "name: t\nfixed:\n  extra: 3\n", "fixed.extra", ["3", "mapping"]),
    ("name-missing", "fixed:\n  seed: 1\n", "name", ["None", "non-empty string"]),
    ("name-empty", "name: ''\n", "name", ["''", "non-empty string"]),
    ("name-not-string", "name: 5\n", "name", ["5", "non-empty string"]),
    ("name-too-long", f"name: {LONG_NAME}\n", "name", ["200"]),
    ("description-not-string", "name: t\ndescription: [1]\n", "description", ["text"]),
    ("executor-unknown", "name: t\nexecutor: pbs\n", "executor", ["'pbs'", "local, slurm"]),
    ("device-unknown", "name: t\nfixed:\n  device: tpu\n", "fixed.device", ["'tpu'", "cpu, cuda"]),
    ("optimizer-unknown", "name: t\nmatrix:\n  optimizer: [sgd, lamb]\n", "matrix.optimizer[1]", ["'lamb'", "adam"]),
    ("data-dir-empty", "name: t\nfixed:\n  data_dir: ''\n", "fixed.data_dir", ["''"]),
    (
        "exclude-drops-all",
        "name: t\nmatrix:\n  seed: [1, 2]\nexclude:\n  - {seed: 1}\n  - {seed: 2}\n",
        "exclude",
        ["drops every point"],
    ),
    ("lr-inf", "name: t\nfixed:\n  lr: .inf\n", "fixed.lr", ["inf", "positive finite"]),
    ("lr-nan", "name: t\nmatrix:\n  lr: [0.1, .nan]\n", "matrix.lr[1]", ["nan", "positive finite"]),
    ("lr-string-inf", "name: t\nfixed:\n  lr: 'inf'\n", "fixed.lr", ["'inf'", "positive finite"]),
    ("lr-zero", "name: t\nfixed:\n  lr: 0\n", "fixed.lr", ["0", "positive finite"]),
    ("lr-word", "name: t\nfixed:\n  lr: fast\n", "fixed.lr", ["'fast'", "positive finite"]),
    ("lr-bool", "name: t\nfixed:\n  lr: true\n", "fixed.lr", ["True", "positive finite"]),
    ("spec-not-mapping", "- name: t\n", "spec", ["mapping"]),
    ("spec-empty", "", "spec", ["mapping"]),
    ("duplicate-top-key", "name: a\nexecutor: local\nname: b\n", "line 3", ["duplicate key 'name'"]),
    ("duplicate-nested-key", "name: t\nfixed:\n  lr: 0.1\n  seed: 2\n  lr: 0.2\n", "line 5", ["duplicate key 'lr'"]),
    ("duplicate-key-in-exclude", "name: t\nexclude:\n  - {seed: 1, seed: 2}\n", "line 3", ["duplicate key 'seed'"]),
    ("yaml-unclosed-flow", "name: t\nfixed: {seed: 1\n", "line 3", ["not valid YAML"]),
    ("yaml-tab", "name: t\nfixed:\n\tseed: 1\n", "line 3", ["not valid YAML"]),
    ("yaml-bad-indent", "name: t\nfixed:\n  seed: 1\n lr: 2\n", "line 4", ["not valid YAML"]),
    ("yaml-python-tag", "name: !!python/object:os.system x\n", "line 1", ["not valid YAML"]),
    # a complex (unhashable) mapping key must be a SpecError, not a TypeError traceback
    ("yaml-list-key", "name: t\nfixed:\n  ? [seed]\n  : 1\n", "line 3", ["key"]),
    ("yaml-flow-list-key", "name: t\nfixed: {[seed]: 1}\n", "line 2", ["key"]),
    # `extra` values obey the same rules as the other fields: no NUL, finite numbers
    ("extra-nul", 'name: t\nfixed:\n  extra: {k: "a\\0b"}\n', "fixed.extra.k", ["NUL"]),
    ("extra-nan", "name: t\nfixed:\n  extra: {k: .nan}\n", "fixed.extra.k", ["nan"]),
]


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [pytest.param(text, path, words, id=case_id) for case_id, text, path, words in BAD_SPECS],
)
def test_bad_spec_names_path_value_and_allowed(text: str, path: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        load_sweep(text, choices={"executor": ["local", "slurm"]})
    err = info.value
    assert err.path == path
    message = str(err)
    assert message.startswith(f"{path}: ")
    for word in words:
        assert word in message, (word, message)
    assert "\n" not in message  # the CLIs print it on one line
    assert isinstance(err, HpcbenchError)
    assert err.exit_code == 2


CHOICES = {"framework": ["torch"], "launcher": ["mpirun", "torchrun"], "model": ["lenet", "mlp"], "dataset": ["mnist"]}


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        ("matrix:\n  model: [lenet, vgg]\n", "matrix.model[1]", ["'vgg'", "lenet, mlp"]),
        ("fixed:\n  framework: tensorflow\n", "fixed.framework", ["'tensorflow'", "torch"]),
        ("fixed:\n  launcher: srun\n", "fixed.launcher", ["'srun'", "mpirun, torchrun"]),
        ("matrix:\n  dataset: [mnist, cifar10]\n", "matrix.dataset[1]", ["'cifar10'", "mnist"]),
        ("exclude:\n  - {model: alexnet}\n", "exclude[0].model", ["'alexnet'", "lenet, mlp"]),
        ("fixed:\n  framework: 3\n", "fixed.framework", ["3", "torch"]),
    ],
)
def test_registry_backed_fields_are_checked_against_choices(body: str, path: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        sweep(body, choices=CHOICES)
    assert info.value.path == path
    for word in words:
        assert word in str(info.value)


def test_empty_choice_list_says_none_defined() -> None:
    with pytest.raises(SpecError) as info:
        sweep("fixed:\n  env: myenv\n", choices={"env": []})
    assert info.value.path == "fixed.env"
    assert "'myenv'" in str(info.value)
    assert "none defined yet" in str(info.value)


# Sections written as a falsy non-mapping are silently taken as empty (`raw.get(name) or {}`).
@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("name: t\nfixed: 0\n", "fixed"),
        ("name: t\nfixed: false\n", "fixed"),
        ("name: t\nmatrix: ''\n", "matrix"),
        ("name: t\nmatrix: []\n", "matrix"),
    ],
    ids=["fixed-0", "fixed-false", "matrix-empty-string", "matrix-empty-list"],
)
def test_falsy_non_mapping_section_is_an_error(text: str, path: str) -> None:
    with pytest.raises(SpecError) as info:
        load_sweep(text, choices={"executor": ["local", "slurm"]})
    assert info.value.path == path


# `matrix:` and `fixed:` with nothing under them are empty sections; the same must hold for
# `exclude:` and `options:` (e.g. after commenting out their only entries).
@pytest.mark.parametrize("section", ["matrix", "fixed", "exclude", "options"])
def test_empty_section_written_as_null_is_accepted(section: str) -> None:
    s = load_sweep(f"name: t\n{section}:\n  # nothing here for now\n")
    assert len(s.points) == 1
    assert s.points[0] == Point()


# --------------------------------------------------------------------------------------
# Grouped axes


def test_grouped_axis_sets_its_fields_together() -> None:
    s = sweep(
        "matrix:\n"
        "  stack:\n"
        "    - {framework: torch, backend: gloo}\n"
        "    - {framework: tensorflow, backend: multiworker, env: modern}\n"
        "  ranks_per_node: [1, 2]\n"
    )
    assert fields_of(s, "framework", "backend", "env", "ranks_per_node") == {
        ("torch", "gloo", None, 1),
        ("torch", "gloo", None, 2),
        ("tensorflow", "multiworker", "modern", 1),
        ("tensorflow", "multiworker", "modern", 2),
    }
    assert s.origin["backend"] == "matrix.stack[0].backend"
    # the same point as one written without a group: ids depend on fields only
    plain = sweep("fixed:\n  framework: torch\n  backend: gloo\n  ranks_per_node: 2\n")
    assert plain.points[0].id in {p.id for p in s.points}


@pytest.mark.parametrize(
    ("body", "where", "what"),
    [
        ("matrix:\n  stack: [{framework: torch}]\nfixed:\n  framework: torch\n", "fixed.framework", "given twice"),
        ("matrix:\n  backend: [gloo]\n  stack: [{backend: mpi}]\n", "matrix.stack[0].backend", "given twice"),
        ("matrix:\n  stack: [{framework: torch}, {framework: torch}]\n", "matrix.stack[1]", "listed twice"),
        ("matrix:\n  stack: [{}]\n", "matrix.stack[0]", "empty mapping"),
        ("matrix:\n  stack: [{frame: torch}]\n", "matrix.stack[0].frame", "unknown field"),
        ("matrix:\n  stack: [{ranks_per_node: 0}]\n", "matrix.stack[0].ranks_per_node", "too small"),
        ("matrix:\n  stack: [1, 2]\n", "matrix.stack", "unknown field"),
    ],
)
def test_grouped_axis_errors_name_the_entry(body: str, where: str, what: str) -> None:
    with pytest.raises(SpecError) as info:
        sweep(body)
    assert info.value.path == where, str(info.value)
    assert what in str(info.value)
