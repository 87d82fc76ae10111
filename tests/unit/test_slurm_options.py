"""hpcbench.executors.slurm.options and the `slurm:` / `profile:` parts of sweep specs (hpcbench.spec)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest

from hpcbench.errors import SpecError
from hpcbench.executors import catalog
from hpcbench.executors.slurm import options as slurm_options
from hpcbench.executors.slurm.options import SlurmOptions, parse, parse_time
from hpcbench.plan.launch import parse_sweep
from hpcbench.spec import Point, Sweep

# The documented option names, written out by hand: a renamed or dropped option is noticed.
OPTION_NAMES = (
    "partition",
    "account",
    "qos",
    "constraint",
    "exclusive",
    "time",
    "mem",
    "cpus_per_task",
    "array_parallelism",
    "signal_delay_s",
    "additional",
    "setup",
)


def sweep(body: str) -> Sweep:
    """A spec loaded as the sweep command loads it: the executors' sections validated by them;
    under the Slurm executor unless the body names one (Slurm options are refused under another)."""
    head = "name: t\n" + ("" if "executor:" in body else "executor: slurm\n")
    return parse_sweep(head + body, catalog())


def spec_error(call: Any, *args: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        call(*args)
    return info.value


# --------------------------------------------------------------------------------------
# parse_time: sbatch's time syntax -> whole minutes


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("45", 45),  # M
        ("1", 1),
        ("90:00", 90),  # M:S
        ("10:30", 11),  # M:S, seconds round up
        ("0:30", 1),
        ("0:1", 1),
        ("2:00:00", 120),  # H:M:S
        ("1:30:00", 90),
        ("1:30:01", 91),
        ("0:0:1", 1),
        ("0:00:59", 1),
        ("1-0", 24 * 60),  # D-H
        ("2-3", 2 * 24 * 60 + 3 * 60),
        ("1-2:30", 24 * 60 + 2 * 60 + 30),  # D-H:M
        ("0-0:5", 5),
        ("1-0:0:1", 24 * 60 + 1),  # D-H:M:S
        ("3-04:05:06", 3 * 24 * 60 + 4 * 60 + 5 + 1),
        ("0-0:0:1", 1),
        ("007", 7),
    ],
)
def test_parse_time_sbatch_syntax(text: str, minutes: int) -> None:
    assert parse_time("slurm.time", text) == minutes


@pytest.mark.parametrize("value", [1, 30, 60 * 24 * 7])
def test_parse_time_accepts_positive_int_minutes(value: int) -> None:
    result = parse_time("slurm.time", value)
    assert result == value
    assert type(result) is int


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        -30,
        True,
        False,
        1.5,
        30.0,
        None,
        [30],
        {"minutes": 30},
        "",
        "1:2:3:4",  # four colon parts
        "1-2:3:4:5",
        "abc",
        "1h",
        "30m",
        "-5",
        "-1-0",
        "1-",
        "-",
        "1:",
        ":30",
        "1::2",
        "1-2-3",
        " 5",
        "5 ",
        "+5",
        "1.5",
        "1e3",
        "1_0",
        "²",  # str.isdigit() says yes, int() says no
    ],
)
def test_parse_time_rejects(value: Any) -> None:
    err = spec_error(parse_time, "slurm.time", value)
    assert err.path == "slurm.time"
    assert repr(value) in str(err) or str(value) in str(err)


@pytest.mark.parametrize("value", ["0", "00:00", "0:0:0", "0-0", "0-0:0", "0-0:0:0", "0:00"])
def test_parse_time_rejects_zero_durations(value: str) -> None:
    err = spec_error(parse_time, "slurm.time", value)
    assert err.path == "slurm.time"


def test_parse_time_error_names_the_allowed_forms() -> None:
    err = spec_error(parse_time, "fixed.slurm.time", "soon")
    assert err.path == "fixed.slurm.time"
    assert "'soon'" in str(err)
    assert err.allowed is not None
    for form in ("M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"):
        assert form in err.allowed


# --------------------------------------------------------------------------------------
# SlurmOptions: defaults, fields, merged


def test_option_fields_are_the_documented_vocabulary() -> None:
    assert tuple(f.name for f in dataclasses.fields(SlurmOptions)) == OPTION_NAMES
    assert slurm_options.FIELDS == OPTION_NAMES


def test_defaults() -> None:
    o = SlurmOptions()
    assert (o.partition, o.account, o.qos, o.constraint, o.exclusive, o.mem, o.cpus_per_task) == (None,) * 7
    assert o.time == 30
    assert o.array_parallelism == 64
    assert o.signal_delay_s == 60
    assert o.additional == ()
    assert o.setup == ()


def test_merged_empty_overrides_are_identity() -> None:
    o = SlurmOptions(partition="gpu", time=5)
    assert o.merged({}) == o
    assert SlurmOptions().merged({}) == SlurmOptions()


def test_merged_later_overrides_win_and_others_stay() -> None:
    base = SlurmOptions(partition="debug", account="a", time=10, setup=("echo one",))
    out = base.merged({"time": 20, "account": "b", "setup": ("echo two",)})
    assert out.time == 20
    assert out.account == "b"
    assert out.partition == "debug"
    assert out.setup == ("echo two",)  # setup is replaced, not appended
    assert base.time == 10  # frozen: the original is unchanged
    chained = SlurmOptions().merged({"time": 1}).merged({"time": 2}).merged({"time": 3})
    assert chained.time == 3


def test_merged_additional_is_keywise() -> None:
    base = SlurmOptions(additional=(("comment", "base"), ("mail-type", "END")))
    out = base.merged({"additional": (("comment", "over"), ("mail-user", "me@x"))})
    assert out.additional == (("comment", "over"), ("mail-type", "END"), ("mail-user", "me@x"))
    # also from the mapping form (to_raw / JSON), and with nothing to add
    assert base.merged({"additional": {"gres": "gpu:1"}}).additional == (
        ("comment", "base"),
        ("gres", "gpu:1"),
        ("mail-type", "END"),
    )
    assert base.merged({"additional": ()}).additional == base.additional
    assert base.merged({"time": 5}).additional == base.additional


def test_merged_takes_parsed_values() -> None:
    parsed = parse("slurm", {"time": "1:00:00", "additional": {"mail-type": "END"}, "setup": ["module purge"]})
    out = SlurmOptions().merged(parsed)
    assert out.time == 60
    assert out.additional == (("mail-type", "END"),)
    assert out.setup == ("module purge",)


# --------------------------------------------------------------------------------------
# parse / as_items / to_raw


def test_parse_none_is_empty() -> None:
    assert parse("slurm", None) == {}
    assert slurm_options.as_items("slurm", None) == ()


def test_parse_returns_only_given_keys_in_canonical_form() -> None:
    raw = {
        "partition": "gpu",
        "account": "proj-1",
        "qos": "high",
        "constraint": "a100&ib",
        "exclusive": True,
        "time": "2-00:00",
        "mem": "16G",
        "cpus_per_task": 8,
        "array_parallelism": 4,
        "signal_delay_s": 120,
        "additional": {"mail-type": "END", "comment": "hi there", "gres": 2},
        "setup": ["module purge", "source /etc/profile"],
    }
    out = parse("slurm", raw)
    assert out == {
        "partition": "gpu",
        "account": "proj-1",
        "qos": "high",
        "constraint": "a100&ib",
        "exclusive": True,
        "time": 2 * 24 * 60,
        "mem": "16G",
        "cpus_per_task": 8,
        "array_parallelism": 4,
        "signal_delay_s": 120,
        "additional": (("comment", "hi there"), ("gres", "2"), ("mail-type", "END")),
        "setup": ("module purge", "source /etc/profile"),
    }
    assert parse("slurm", {"time": 5}) == {"time": 5}


def test_as_items_is_sorted_pairs() -> None:
    items = slurm_options.as_items("p", {"time": 10, "account": "x", "mem": "1G"})
    assert items == (("account", "x"), ("mem", "1G"), ("time", 10))
    assert items == slurm_options.as_items("p", {"mem": "1G", "time": "10", "account": "x"})


def test_to_raw_gives_mapping_and_list_back() -> None:
    values = {"time": 7, "additional": (("a-b", "1"), ("comment", "2")), "setup": ("x", "y")}
    raw = slurm_options.to_raw(values)
    assert raw == {"time": 7, "additional": {"a-b": "1", "comment": "2"}, "setup": ["x", "y"]}
    assert values["additional"] == (("a-b", "1"), ("comment", "2"))  # input not modified
    assert slurm_options.to_raw({"time": 3}) == {"time": 3}
    # raw -> parsed -> raw is stable (JSON-ready)
    assert slurm_options.to_raw(parse("s", raw)) == raw
    assert json.loads(json.dumps(raw)) == raw


def test_parse_rejects_non_mapping() -> None:
    for raw in ([1, 2], "gpu", 5):
        err = spec_error(parse, "slurm", raw)
        assert err.path == "slurm"
        assert "not a mapping" in str(err)


def test_unknown_key_lists_valid_keys() -> None:
    err = spec_error(parse, "slurm", {"bogus": 1})
    assert err.path == "slurm.bogus"
    assert "unknown key" in str(err)
    assert err.allowed is not None
    assert set(err.allowed.split(", ")) == set(OPTION_NAMES)


@pytest.mark.parametrize("key", ["cpus-per-task", "nodes", "gpus_per_node", "job_name", "Time"])
def test_not_an_option_key(key: str) -> None:
    err = spec_error(parse, "fixed.slurm", {key: 1})
    assert err.path == f"fixed.slurm.{key}"
    assert "unknown key" in err.problem


@pytest.mark.parametrize("key", ["partition", "account", "qos", "constraint"])
@pytest.mark.parametrize("bad", ["gpu\nrm -rf /", "a\rb", "tab\there", "nul\x00", "esc\x1b[0m", "del\x7f", "\n"])
def test_text_values_reject_control_characters(key: str, bad: str) -> None:
    err = spec_error(parse, "slurm", {key: bad})
    assert err.path == f"slurm.{key}"
    assert "control characters" in err.problem


@pytest.mark.parametrize("key", ["partition", "account", "qos", "constraint"])
@pytest.mark.parametrize("bad", ["", None, True, 1.5, ["gpu"], {"a": 1}])
def test_text_values_reject_non_text(key: str, bad: Any) -> None:
    err = spec_error(parse, "slurm", {key: bad})
    assert err.path == f"slurm.{key}"


def test_text_values_allow_printable_text_and_ints() -> None:
    out = parse("slurm", {"partition": "gpu a100", "account": 1234, "constraint": "x|y&z", "qos": "q's"})
    assert out == {"partition": "gpu a100", "account": "1234", "constraint": "x|y&z", "qos": "q's"}


@pytest.mark.parametrize("mem", ["4000", "4000M", "16G", "1T", "512K", "0G"])
def test_mem_accepts_sbatch_syntax(mem: str) -> None:
    assert parse("slurm", {"mem": mem}) == {"mem": mem}


def test_mem_int_is_megabytes_text() -> None:
    assert parse("slurm", {"mem": 4000}) == {"mem": "4000"}


@pytest.mark.parametrize(
    "mem", ["16GB", "16g", "G", "1.5G", "-1G", "16 G", " 16G", "16G ", "lots", "16P", "16GG", "１６G", "١٦G"]
)
def test_mem_rejects_bad_syntax(mem: str) -> None:
    # Non-ASCII digits (fullwidth, Arabic-Indic) would reach the #SBATCH line, which sbatch rejects.
    err = spec_error(parse, "slurm", {"mem": mem})
    assert err.path == "slurm.mem"
    assert "memory size" in err.problem


@pytest.mark.parametrize("value", [1, 0, "yes", "true", None, [True]])
def test_exclusive_must_be_bool(value: Any) -> None:
    err = spec_error(parse, "slurm", {"exclusive": value})
    assert err.path == "slurm.exclusive"
    assert "boolean" in err.problem
    assert parse("slurm", {"exclusive": False}) == {"exclusive": False}


@pytest.mark.parametrize("key", ["cpus_per_task", "array_parallelism", "signal_delay_s"])
@pytest.mark.parametrize("value", [0, -1, True, "4", 2.0, None])
def test_positive_int_options_reject(key: str, value: Any) -> None:
    err = spec_error(parse, "slurm", {key: value})
    assert err.path == f"slurm.{key}"
    assert "positive integer" in err.problem


def test_time_error_names_path() -> None:
    err = spec_error(parse, "slurm", {"time": "1:2:3:4"})
    assert err.path == "slurm.time"


def test_setup_is_a_list_of_single_line_strings() -> None:
    assert parse("slurm", {"setup": []}) == {"setup": ()}
    assert parse("slurm", {"setup": ["a; b", "$(c) 'd'"]}) == {"setup": ("a; b", "$(c) 'd'")}
    err = spec_error(parse, "slurm", {"setup": "module load x"})
    assert err.path == "slurm.setup"
    assert "not a list" in err.problem
    err = spec_error(parse, "slurm", {"setup": ["ok", "two\nlines"]})
    assert err.path == "slurm.setup[1]"
    assert "control characters" in err.problem
    err = spec_error(parse, "slurm", {"setup": ["ok", "fine", ""]})
    assert err.path == "slurm.setup[2]"
    err = spec_error(parse, "slurm", {"setup": [["nested"]]})
    assert err.path == "slurm.setup[0]"


def test_additional_must_be_a_mapping() -> None:
    err = spec_error(parse, "slurm", {"additional": ["mail-type=END"]})
    assert err.path == "slurm.additional"
    assert "not a mapping" in err.problem


@pytest.mark.parametrize(
    "name", ["nodes", "ntasks", "ntasks-per-node", "gpus-per-node", "array", "output", "error", "job-name", "wrap"]
)
def test_additional_rejects_derived_options(name: str) -> None:
    err = spec_error(parse, "slurm", {"additional": {name: "1"}})
    assert err.path == f"slurm.additional.{name}"
    assert "set by hpcbench" in err.problem


@pytest.mark.parametrize(
    "name",
    ["time", "partition", "account", "qos", "constraint", "exclusive", "mem", "cpus-per-task", "signal-delay-s"],
)
def test_additional_rejects_names_of_own_fields(name: str) -> None:
    err = spec_error(parse, "slurm", {"additional": {name: "1"}})
    assert err.path == f"slurm.additional.{name}"
    assert "own key" in err.problem


def test_additional_rejects_signal_which_signal_delay_s_sets() -> None:
    # hpcbench writes --signal=USR2@<signal_delay_s>; `additional: {signal: ...}` would replace it
    # silently, so it must be refused like the other derived options.
    err = spec_error(parse, "slurm", {"additional": {"signal": "B:TERM@10"}})
    assert err.path == "slurm.additional.signal"


@pytest.mark.parametrize("name", ["Mail-Type", "mail_type", "-x", "1x", "mail type", "", "--gres", "a.b"])
def test_additional_rejects_non_option_names(name: str) -> None:
    err = spec_error(parse, "slurm", {"additional": {name: "1"}})
    assert err.path == f"slurm.additional.{name}"
    assert "not an sbatch option name" in err.problem


def test_additional_rejects_non_string_names() -> None:
    err = spec_error(parse, "slurm", {"additional": {5: "x"}})
    assert err.path == "slurm.additional.5"


@pytest.mark.parametrize("value", ["x\ny", "\x00", "", None, True, 1.5])
def test_additional_values_are_one_line_text(value: Any) -> None:
    err = spec_error(parse, "slurm", {"additional": {"comment": value}})
    assert err.path == "slurm.additional.comment"


def test_additional_accepts_other_options() -> None:
    out = parse("slurm", {"additional": {"mail-type": "END", "gres": "gpu:2", "comment": "a b; $(c)", "nice": 10}})
    assert out["additional"] == (("comment", "a b; $(c)"), ("gres", "gpu:2"), ("mail-type", "END"), ("nice", "10"))


# --------------------------------------------------------------------------------------
# Sweep specs: the top-level `slurm:` section and `profile:`


def test_spec_slurm_section_and_profile() -> None:
    s = sweep(
        "executor: slurm\n"
        "profile: testcluster\n"
        "slurm:\n"
        "  time: '1:30:00'\n"
        "  account: proj\n"
        "  additional: {mail-type: END}\n"
        "  setup: [module purge]\n"
    )
    assert s.executor == "slurm"
    assert s.profile == "testcluster"
    assert dict(s.sections.get("slurm", {})) == {
        "time": 90,
        "account": "proj",
        "additional": (("mail-type", "END"),),
        "setup": ("module purge",),
    }
    # the sweep-level section is not part of any point
    assert all(p.slurm == () for p in s.points)


def test_spec_without_slurm_or_profile() -> None:
    s = sweep("fixed: {seed: 1}\n")
    assert dict(s.sections.get("slurm", {})) == {}
    assert s.profile is None
    assert sweep("slurm:\nprofile:\n").profile is None


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ("slurm: {partition: gpu}\n", "slurm"),
        ("fixed: {slurm: {time: 10}}\n", "fixed.slurm"),
        ("matrix: {slurm: [{time: 10}, {time: 20}]}\n", "matrix.slurm"),
        ("matrix: {stack: [{seed: 1, slurm: {time: 10}}]}\n", "matrix.stack[0].slurm"),
    ],
)
def test_slurm_options_are_refused_under_the_local_executor(body: str, path: str) -> None:
    # docs/spec.md: they would not be used, and a point's slurm field would change its id
    err = spec_error(sweep, "executor: local\n" + body)
    assert err.path == path
    assert "executor slurm" in err.problem and "executor is local" in err.problem
    assert err.allowed is not None and "executor: slurm" in err.allowed
    assert sweep("executor: local\nslurm:\n").executor == "local"  # an empty section is no options


def test_spec_slurm_section_does_not_change_point_ids() -> None:
    plain = sweep("matrix: {seed: [1, 2]}\n")
    with_slurm = sweep("matrix: {seed: [1, 2]}\nslurm: {time: 99, partition: x}\nprofile: generic\n")
    assert [p.id for p in plain.points] == [p.id for p in with_slurm.points]


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ("slurm: {time: 0}\n", "slurm.time"),
        ("slurm: {time: '1:2:3:4'}\n", "slurm.time"),
        ("slurm: {bogus: 1}\n", "slurm.bogus"),
        ("slurm: [time]\n", "slurm"),
        ("slurm: {mem: lots}\n", "slurm.mem"),
        ("slurm: {additional: {nodes: 2}}\n", "slurm.additional.nodes"),
        ('slurm: {setup: ["a\\nb"]}\n', "slurm.setup[0]"),
        ("fixed: {slurm: {bogus: 1}}\n", "fixed.slurm.bogus"),
        ("fixed: {slurm: {time: -5}}\n", "fixed.slurm.time"),
        ("fixed: {slurm: {additional: {time: '5'}}}\n", "fixed.slurm.additional.time"),
        ("matrix: {slurm: [{mem: 1G}, {mem: lots}]}\n", "matrix.slurm[1].mem"),
        ("matrix: {slurm: [{time: 5}, {exclusive: 1}]}\n", "matrix.slurm[1].exclusive"),
        ("matrix: {slurm: [{time: 5}, 7]}\n", "matrix.slurm[1]"),
        ("profile: ''\n", "profile"),
        ("profile: 5\n", "profile"),
        ("profile: [generic]\n", "profile"),
    ],
)
def test_spec_slurm_errors_name_the_path(body: str, path: str) -> None:
    err = spec_error(sweep, body)
    assert err.path == path
    assert str(err).startswith(f"{path}: ")


def test_spec_matrix_slurm_duplicates_after_canonicalisation() -> None:
    err = spec_error(sweep, "matrix: {slurm: [{time: 60}, {time: '1:00:00'}]}\n")
    assert err.path == "matrix.slurm[1]"
    assert "twice" in err.problem


# --------------------------------------------------------------------------------------
# Per-point slurm overrides: ids and JSON round trip


def expected_id(set_fields: dict[str, Any]) -> str:
    blob = json.dumps(set_fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def test_matrix_slurm_overrides_make_distinct_points() -> None:
    s = sweep("matrix:\n  slurm: [{time: 10}, {time: 20, partition: big}]\n  seed: [1, 2]\n")
    assert len(s.points) == 4
    assert {p.slurm for p in s.points} == {(("time", 10),), (("partition", "big"), ("time", 20))}
    assert len({p.id for p in s.points}) == 4
    assert s.origin["slurm"] == "matrix.slurm"


def test_slurm_override_changes_the_point_id() -> None:
    base = sweep("fixed: {seed: 1}\n").points[0]
    over = sweep("fixed: {seed: 1, slurm: {time: 10}}\n").points[0]
    assert base.id != over.id
    assert over.slurm == (("time", 10),)
    assert base.id == Point(seed=1).id


def test_slurm_override_id_follows_the_documented_rule() -> None:
    # every default field plus the set ones, `slurm` in its raw (JSON) form
    p = sweep("fixed: {slurm: {time: '0:30', additional: {mail-type: END}}}\n").points[0]
    fields = {
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
        "slurm": {"additional": {"mail-type": "END"}, "time": 1},
    }
    assert p.id == expected_id(fields)


def test_same_overrides_in_another_key_order_give_the_same_id() -> None:
    a = sweep("fixed: {slurm: {time: 10, partition: gpu, additional: {mail-type: END, comment: x}}}\n").points[0]
    b = sweep("fixed: {slurm: {additional: {comment: x, mail-type: END}, partition: gpu, time: 10}}\n").points[0]
    c = sweep("fixed: {slurm: {partition: gpu, time: '10:00', additional: {comment: x, mail-type: END}}}\n").points[0]
    assert a == b == c
    assert a.id == b.id == c.id
    d = sweep("fixed: {slurm: {time: 11, partition: gpu, additional: {mail-type: END, comment: x}}}\n").points[0]
    assert d.id != a.id


def test_empty_slurm_override_keeps_the_id() -> None:
    assert sweep("fixed: {slurm: {}}\n").points[0].id == Point().id
    assert sweep("fixed: {slurm: }\n").points[0].id == Point().id


def test_exclude_by_slurm_override() -> None:
    s = sweep("matrix:\n  slurm: [{time: 10}, {time: 20}]\nexclude:\n  - {slurm: {time: '20:00'}}\n")
    assert [p.slurm for p in s.points] == [(("time", 10),)]
    assert s.warnings == ()


def test_point_json_round_trip_with_slurm_overrides() -> None:
    s = sweep(
        "fixed:\n"
        "  slurm:\n"
        "    time: '1-00:00'\n"
        "    mem: 8G\n"
        "    exclusive: false\n"
        "    additional: {mail-type: END, comment: 'a b'}\n"
        "    setup: [module purge, 'export X=\"1 2\"']\n"
    )
    (p,) = s.points
    assert dict(p.slurm)["time"] == 24 * 60
    back = Point.from_json(p.to_json())
    assert back == p
    assert back.id == p.id
    raw = json.loads(p.to_json())
    assert raw["slurm"] == {
        "time": 24 * 60,
        "mem": "8G",
        "exclusive": False,
        "additional": {"comment": "a b", "mail-type": "END"},
        "setup": ["module purge", 'export X="1 2"'],
    }


def test_point_from_dict_checks_the_shape_of_slurm() -> None:
    # A point read back from a run or point file was validated when the spec was loaded:
    # from_dict checks only that the executor options are a mapping.
    d = Point().as_dict()
    d["slurm"] = ["time", 5]
    err = spec_error(Point.from_dict, d)
    assert err.path == "point.slurm"
