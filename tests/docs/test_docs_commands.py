"""The manual's command lines and YAML run: every `hpcbench ...` / `python -m hpcbench...` line
in a code block of README.md or docs/*.md is found, and each either runs for real here, on
fabricated sweeps in a scratch folder (its exit status, the files the docs say it writes, and
the output a transcript shows, numbers aside), or stands in SKIPPED with the reason (ranks,
Slurm, GPUs, hours, environments). Every option a command line names is one its --help knows,
skipped or not. Every YAML block validates through the loader that reads it: sweep specs
(hpcbench.plan.launch.parse_sweep), site profiles (hpcbench.plan.profiles.parse) and
prediction files (hpcbench.analysis.model.forecast_spec.parse).

A synopsis is run as its shortest form: `[optional parts]` left out, `a|b` as `a`, and its
placeholders (DIR, POINT.h5, ...) as scratch files; paths of the repository (analysis/...)
as they are; other relative paths (runs/scaling, sweeps/before) as sweeps made in the
scratch folder, which is the commands' working directory."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hpcbench.analysis.model import forecast_spec
from hpcbench.cli import analyze as analyze_cli
from hpcbench.cli import main as main_cli
from hpcbench.executors import catalog
from hpcbench.plan import profiles
from hpcbench.plan.launch import parse_sweep, sections
from hpcbench.spec import Point, parse_yaml
from hpcbench.sweepdir.manifest import DONE, Manifest
from hpcbench.testing.arrays import model_point
from tests.analysis import test_calibration, test_compare

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


# ------------------------------------------------------------------------------------------
# Finding the code blocks and the command lines in them

FENCE = re.compile(r"^(```|~~~)([^\n]*)\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
# hpcbench, .venv/bin/hpcbench, python -m hpcbench[.module], behind mpirun / srun and their options
COMMAND = re.compile(
    r"^(?:(?P<prefix>(?:mpirun|srun)\s.*?)\s)?(?:\S*/)?(?:(?P<cli>hpcbench)|python3?\s+-m\s+(?P<module>hpcbench(?:\.[\w.]+)?))(?=\s|$)"
)
DESCRIPTION = re.compile(r"\s{2,}(?![\s\[-])")  # a synopsis' description column, after two blanks
NOT_COMMANDS = ("yaml", "yml", "json", "python", "sql", "text")  # code blocks that hold no command lines (text: output)


def code_blocks(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line of the opening fence, language, body) of every fenced block."""
    text = path.read_text(encoding="utf-8")
    for m in FENCE.finditer(text):
        yield text[: m.start()].count("\n") + 1, m.group(2).strip(), m.group(3)


@dataclass
class DocCommand:
    """A command line of the manual: as written, where, and what a transcript shows after it."""

    text: str
    places: list[str] = field(default_factory=list)
    output: tuple[str, ...] = ()  # a transcript's lines after the command
    exit_code: int | None = None  # a transcript's `echo $?`


def _lines(body: str) -> tuple[bool, list[tuple[str, list[str]]]]:
    """Whether the block is a transcript (`$ ` lines), and its lines with what follows each."""
    lines = body.splitlines()
    transcript = any(line.startswith("$ ") for line in lines)
    out: list[tuple[str, list[str]]] = []
    for line in lines:
        if transcript:
            if line.startswith("$ "):
                out.append((line[2:], []))
            elif out:
                out[-1][1].append(line)
        elif out and re.match(r"^\s+\[", line):  # a synopsis continued on the next line
            out[-1] = (out[-1][0] + " " + line.strip(), [])
        else:
            out.append((line, []))
    return transcript, out


def doc_commands() -> list[DocCommand]:
    """Every command line, once (the places it stands listed)."""
    found: dict[str, DocCommand] = {}
    for path in markdown_files():
        for line, lang, body in code_blocks(path):
            if lang in NOT_COMMANDS:
                continue
            transcript, lines = _lines(body)
            for i, (text, after) in enumerate(lines):
                exit_code = None
                if transcript and i + 1 < len(lines) and lines[i + 1][0].strip() == "echo $?":
                    exit_code = int(lines[i + 1][1][0])
                for part in re.split(r"\s&&\s", text):
                    part = re.sub(r"\s+#.*$", "", part.strip())
                    part = DESCRIPTION.split(part, maxsplit=1)[0]
                    if COMMAND.match(part):
                        command = found.setdefault(part, DocCommand(part))
                        command.places.append(where(path, line))
                        if transcript:
                            command.output, command.exit_code = tuple(after), exit_code
    return list(found.values())


@dataclass(frozen=True)
class Parsed:
    module: str  # hpcbench, hpcbench.sweep, hpcbench.analyze, ...
    args: tuple[str, ...]  # the shortest form: optional parts left out, alternatives as the first
    options: tuple[str, ...]  # every option the line names, optional ones too
    prefix: str  # mpirun / srun and their options

    @property
    def subcommand(self) -> tuple[str, ...]:
        """What --help is asked of: the module and its subcommand, where it has them."""
        families = {
            "hpcbench": tuple(c.name for c in main_cli.SUBCOMMANDS),
            "hpcbench.sweep": SWEEP_COMMANDS,
            "hpcbench.analyze": ANALYZE,
        }
        words = families.get(self.module, ())
        first = next((a for a in self.args if not a.startswith("-")), None)
        if first in words:
            return (first,)
        return ("run",) if self.module == "hpcbench.sweep" else ()  # `python -m hpcbench.sweep SPEC.yaml` is run


SWEEP_COMMANDS = ("run", "status", "resume", "cancel", "check")
ANALYZE = ("analyze", "summary", "report", "trace")


def parse(text: str) -> Parsed:
    m = COMMAND.match(text)
    assert m is not None, text
    module = m.group("module") or "hpcbench"
    rest = text[m.end() :]
    rest = DESCRIPTION.split(rest.strip(), maxsplit=1)[0]
    options = tuple(dict.fromkeys(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", rest)))
    while re.search(r"\[[^\[\]]*\]", rest):
        rest = re.sub(r"\s*\[[^\[\]]*\]", "", rest)
    args = [token.split("|")[0] for token in shlex.split(rest) if token != "..."]
    return Parsed(module, tuple(args), options, (m.group("prefix") or "").strip())


# ------------------------------------------------------------------------------------------
# What cannot run here, and why. Each such line's options are still checked against --help.

SKIPPED = {
    "hpcbench check": "probes every framework in every environment (minutes; environments built apart)",
    "~/venvs/hpcbench/bin/hpcbench check": "probes every framework in every environment (minutes)",
    "~/venvs/hpcbench/bin/python -m hpcbench.rank.linkage check": "checks this machine's MPI and HDF5 build record",
    "srun -N 1 -n 1 ~/venvs/hpcbench/bin/python -m hpcbench.rank.linkage check": "needs Slurm",
    "mpirun -n 4 python -m hpcbench.commbench [--sizes 4K,64K,1M,16M] [--iters 20] [--warmup 5] "
    "[--average avg|min|max|rank0] [-o FILE.h5 [--force]]": "starts 4 MPI ranks",
    "mpirun -n 4 --host a:4 python -m hpcbench.commbench -o intra4.h5": "starts MPI ranks on a named host",
    "mpirun -n 4 --host a:1,b:1,c:1,d:1 python -m hpcbench.commbench -o inter4.h5": "needs 4 hosts",
    ".venv/bin/hpcbench run analysis/frameworks.yaml --out DIR": "every framework in every environment: hours",
}
# A sweep that would start ranks (`run`, `python -m hpcbench.sweep SPEC.yaml`) runs with
# --dry-run instead: the spec is read, checked and planned, the launch commands printed,
# nothing run (the ranks' own tests run sweeps for real).


# ------------------------------------------------------------------------------------------
# The scratch folder: fabricated sweeps where the commands look for them

QUICK = "name: quickstart\nexecutor: local\nmatrix: {ranks_per_node: [1, 2, 4]}\nfixed: {model: mlp, batch_size: 8}\n"


def model_sweep(directory: Path) -> Path:
    """A sweep directory as `hpcbench run` leaves it: spec.yaml, a manifest whose every point
    is done, and their point files (three scales of a configuration that follows the model,
    with messages, so that predict can fit it)."""
    directory.mkdir(parents=True)
    (directory / "spec.yaml").write_text(QUICK, encoding="utf-8")
    manifest = Manifest(directory, "quickstart", "local")  # the README's sweep, as a dry run finds it
    for n in (1, 2, 4):
        point, _ = model_point(directory, n)
        manifest.add(point).state = DONE
    assert {p.id for p in parse_sweep(QUICK, catalog()).points} == set(manifest.entries)
    manifest.save()
    return directory


def prediction() -> str:
    """docs/predict.md's prediction file (its first YAML block)."""
    return next(body for _, lang, body in code_blocks(DOCS / "predict.md") if lang == "yaml")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-template")
    model_sweep(root / "sweep")
    before = test_compare.write_sweep(root / "before", {}, 11, "old", test_compare.OLD, extra=("alexnet", 2))
    after = test_compare.write_sweep(
        root / "after", {test_compare.SLOWED: 1.2}, 13, "new", test_compare.NEW, extra=("vgg11", 2)
    )
    assert before.is_dir() and after.is_dir()
    return root


def renamed(directory: Path, name: str) -> None:
    """A copy of the fabricated sweep under another sweep name (its manifest and spec)."""
    for file in ("manifest.json", "spec.yaml"):
        path = directory / file
        path.write_text(path.read_text(encoding="utf-8").replace("quickstart", name), encoding="utf-8")


def scratch_for(template: Path, scratch: Path) -> dict[str, Path]:
    """The scratch folder's sweeps and files; the placeholders' values."""
    for name in (
        "runs/quickstart",
        "runs/transformers",
        "runs/parallelism",
        "runs/scaling",
        "runs/old",
        "runs/new",
        "sweep",
    ):
        shutil.copytree(template / "sweep", scratch / name)
    renamed(scratch / "runs/transformers", "transformers")  # as analysis/transformers.yaml names its sweep
    renamed(scratch / "runs/parallelism", "parallelism")
    shutil.copytree(template / "before", scratch / "sweeps" / "before")
    shutil.copytree(template / "after", scratch / "sweeps" / "after")
    shutil.copytree(template / "before", scratch / "baseline")
    (scratch / "resnet50.yaml").write_text(prediction(), encoding="utf-8")
    (scratch / "resnet50.csv").write_text("an earlier prediction\n", encoding="utf-8")  # running.md: exists already
    point = next((scratch / "sweep").glob("*.h5"))
    return {
        "DIR": scratch / "sweep",
        "SWEEP_DIR": scratch / "sweep",
        "BASELINE_DIR": scratch / "baseline",
        "NEW_DIR": scratch / "sweep",
        "POINT.h5": point,
        "TRACE.json": scratch / "trace.json",
        "FILE.yaml": scratch / "resnet50.yaml",
        "OUT.csv": scratch / "out.csv",
        "TABLE.yaml": ROOT / "hpcbench/analysis/published/tf_ec2_k80_distributed.yaml",
        "SPEC.yaml": ROOT / "analysis/quickstart.yaml",
    }


def concrete(args: tuple[str, ...], values: dict[str, Path], scratch: Path) -> list[str]:
    """The arguments with placeholders as scratch files and repository paths made absolute."""
    out = []
    for arg in args:
        if arg in values:
            out.append(str(values[arg]))
        elif arg.startswith("/tmp/"):
            out.append(str(scratch / arg.lstrip("/")))
        elif not arg.startswith("-") and "/" in arg and (ROOT / arg).exists():
            out.append(str(ROOT / arg))
        else:
            out.append(arg)
    return out


# ------------------------------------------------------------------------------------------
# Running a command


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [*self.stdout.splitlines(), *self.stderr.splitlines()]


def in_process(module: str, args: list[str], cwd: Path) -> Ran:
    """The analysis commands in this process (each would import pandas and h5py again)."""
    main = analyze_cli.main if module == "hpcbench.analyze" else main_cli.main
    out, err = io.StringIO(), io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args, out)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
    return Ran(code, out.getvalue(), err.getvalue())


def subprocess_run(module: str, args: list[str], cwd: Path) -> Ran:
    """The sweep commands in a process of their own (they install signal handlers)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def invoke(parsed: Parsed, args: list[str], cwd: Path) -> Ran:
    sweep_family = parsed.module == "hpcbench.sweep" or (
        parsed.module == "hpcbench" and bool(args) and args[0] in SWEEP_COMMANDS
    )
    if parsed.module in ("hpcbench", "hpcbench.analyze") and not sweep_family:
        return in_process(parsed.module, args, cwd)
    return subprocess_run(parsed.module, args, cwd)


NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
HEX_ID = re.compile(r"\b[0-9a-f]{12}\b")


def normal(line: str, scratch: Path) -> str:
    """A line as transcripts are compared: the scratch folder as the docs' /home/me, point ids
    and numbers as placeholders, runs of blanks as one."""
    line = line.replace(str(scratch), "/home/me")
    return " ".join(NUMBER.sub("N", HEX_ID.sub("ID", line)).split())


# What each command writes, as the docs say (checked after it ran).


def report_files() -> set[str]:
    """The files docs/analysis.md says `hpcbench report` writes into the sweep directory."""
    text = (DOCS / "analysis.md").read_text(encoding="utf-8")
    section = text.split("\n## report\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([\w.]+\.(?:csv|html|md))`", section))


def export_files() -> set[str]:
    """The files docs/export.md's "What is written" names (the logs as mllog/)."""
    text = (DOCS / "export.md").read_text(encoding="utf-8")
    block = text.split("What is written:", 1)[1].split("```", 2)[1]
    return {line.split()[0].removeprefix("DIR/").split("/")[0] for line in block.splitlines() if line.strip()}


def option_value(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        if arg in names and i + 1 < len(args):
            return args[i + 1]
        for name in names:
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def target_of(parsed: Parsed, args: list[str], cwd: Path) -> tuple[str, Path]:
    """The analysis command a line runs and the sweep directory or file it names first."""
    words = [a for i, a in enumerate(args) if not a.startswith("-") and not (i and args[i - 1].startswith("-"))]
    if parsed.module == "hpcbench.analyze" and (not words or words[0] not in ANALYZE):
        words = ["analyze", *words]
    if parsed.module not in ("hpcbench", "hpcbench.analyze") or len(words) < 2:
        return "", cwd
    target = Path(words[1])
    return words[0], target if target.is_absolute() else cwd / target


def check_written(command: str, target: Path, args: list[str], cwd: Path, before: set[str]) -> None:
    """The files the docs say the command writes are there (for report and export: those, no others)."""
    if command == "analyze":
        assert (target / "summary.csv").is_file()
    elif command == "report":
        made = {p.name for p in target.iterdir() if p.is_file()} - before
        assert made == report_files(), "docs/analysis.md#report names other files than report writes"
    elif command == "trace":
        trace = json.loads((cwd / str(option_value(args, "-o", "--output"))).read_text(encoding="utf-8"))
        assert trace["traceEvents"]
    elif command == "export":
        out = Path(option_value(args, "-o", "--output") or target / "export")
        out = out if out.is_absolute() else cwd / out
        made = {p.name for p in out.iterdir() if not p.name.startswith(".")}
        if option_value(args, "-f", "--format") is None:
            assert made == export_files(), "docs/export.md's list of what is written is not what export writes"
        assert made <= export_files()
    elif command == "predict" and option_value(args, "--csv"):
        assert (cwd / str(option_value(args, "--csv"))).is_file()


COMMANDS = doc_commands()


def test_the_commands_are_found() -> None:
    texts = {c.text for c in COMMANDS}
    assert any(t.startswith("hpcbench analyze") for t in texts) and any("hpcbench.sweep" in t for t in texts)
    assert any(c.output for c in COMMANDS) and any(c.exit_code == 1 for c in COMMANDS)
    stale = set(SKIPPED) - texts
    assert not stale, f"skip-list entries no doc holds any more: {sorted(stale)}"


def test_synopses_are_run_in_their_shortest_form() -> None:
    p = parse("hpcbench trace POINT.h5 [--ideal] -o TRACE.json [--force]             Chrome-trace / Perfetto JSON")
    assert (p.module, p.args, p.options) == ("hpcbench", ("trace", "POINT.h5", "-o", "TRACE.json"),
                                             ("--ideal", "-o", "--force"))  # fmt: skip
    p = parse("hpcbench export SWEEP_DIR [--format parquet|mllog|json ...] [-o DIR]")
    assert p.args == ("export", "SWEEP_DIR") and p.options == ("--format", "-o")
    p = parse("mpirun -n 4 --host a:4 python -m hpcbench.commbench -o intra4.h5")
    assert (p.module, p.prefix, p.args, p.options) == ("hpcbench.commbench", "mpirun -n 4 --host a:4",
                                                       ("-o", "intra4.h5"), ("-o",))  # fmt: skip
    assert normal("wrote runs/x/points.parquet (1,368,000 rows) for 3d0e8cb4ed45", Path("/s")) == (
        "wrote runs/x/points.parquet (N rows) for ID"
    )


@functools.cache
def help_text(module: str, subcommand: tuple[str, ...]) -> str:
    """`--help` of a module's (sub)command, once per session."""
    parsed = Parsed(module, (*subcommand, "--help"), (), "")
    ran = invoke(parsed, list(parsed.args), ROOT)
    assert ran.code == 0, ran.stderr
    return ran.stdout


def name(command: DocCommand) -> str:
    """A test id: where the line stands, and its command."""
    return f"{command.places[0]} {' '.join(parse(command.text).args[:1])}".strip()


@pytest.mark.parametrize("command", COMMANDS, ids=name)
def test_every_option_named_is_one_the_command_knows(command: DocCommand) -> None:
    parsed = parse(command.text)
    if not parsed.options:
        return
    known = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text(parsed.module, parsed.subcommand)))
    unknown = [option for option in parsed.options if option not in known]
    assert not unknown, f"{command.places}: {command.text!r} names options its --help does not: {unknown}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.text not in SKIPPED], ids=name)
def test_every_command_runs_as_the_docs_say(command: DocCommand, template: Path, tmp_path: Path) -> None:
    parsed = parse(command.text)
    values = scratch_for(template, tmp_path)
    args = concrete(parsed.args, values, tmp_path)
    if parsed.module == "hpcbench.sweep" or (args and args[0] == "run"):
        args.append("--dry-run")  # DRY_RUN: a sweep that would start ranks is planned, not run
    command_name, target = target_of(parsed, args, tmp_path)
    before = {p.name for p in target.iterdir()} if target.is_dir() else set()
    ran = invoke(parsed, args, tmp_path)
    context = f"{command.places}: {shlex.join(args)}\n{ran.stdout}\n{ran.stderr}"
    expected = command.exit_code
    if expected is None:
        errors = any(": error: " in line for line in command.output)
        expected = 2 if errors else 0
    allowed = {expected, 1} if parsed.args[:1] == ("compare",) and not command.output else {expected}
    assert ran.code in allowed, context
    assert "Traceback" not in ran.stderr, context
    actual = {normal(line, tmp_path) for line in ran.lines}
    missing = [
        line for line in command.output if line.strip() not in ("...", "") and normal(line, tmp_path) not in actual
    ]
    assert not missing, f"{context}\nthe transcript's lines not in the output: {missing}"
    if ran.code in (0, 1) and not command.output:
        check_written(command_name, target, args, tmp_path, before)


# ------------------------------------------------------------------------------------------
# YAML blocks


def yaml_blocks() -> list[tuple[str, str]]:
    return [
        (where(path, line), body)
        for path in markdown_files()
        for line, lang, body in code_blocks(path)
        if lang in ("yaml", "yml")
    ]


def validate_yaml(body: str, place: str, scratch: Path) -> str:
    """Load a block as what it is; the kind. A fragment is loaded inside what it belongs to: a
    spec's `matrix`/`fixed`/`slurm` parts with a name, a prediction's `links` in predict.md's
    prediction file (its commbench files fabricated)."""
    raw = parse_yaml(body)
    assert isinstance(raw, dict), place
    if set(raw) & {"modules", "srun_args", "mpirun_args", "container"}:
        profiles.parse("doc", scratch / "doc.yaml", body, sections(catalog()))
        return "site profile"
    if set(raw) & {"single_rank", "links", "layers", "exchange"}:
        full = {**parse_yaml(prediction()), **raw}
        for name in full.get("links", {}).get("from_commbench", []):  # intraN.h5: N ranks on a node; interN.h5: N nodes
            path = scratch / name
            path.parent.mkdir(parents=True, exist_ok=True)
            count = int(re.findall(r"\d+", path.name)[-1])
            intra = path.name.startswith("intra")
            hosts = ["n0"] * count if intra else [f"n{i}" for i in range(count)]
            link = test_calibration.INTRA if intra else test_calibration.INTER
            test_calibration.fabricate(path, hosts, link, 0.01, seed=count)
        forecast_spec.parse(yaml.safe_dump(full), scratch)
        return "prediction"
    text = body if "name" in raw else "name: doc\n" + body
    sweep = parse_sweep(text, catalog())
    assert sweep.points and all(isinstance(p, Point) for p in sweep.points)
    return "sweep spec"


@pytest.mark.parametrize(("place", "body"), yaml_blocks(), ids=[p for p, _ in yaml_blocks()])
def test_every_yaml_block_validates(place: str, body: str, tmp_path: Path) -> None:
    validate_yaml(body, place, tmp_path)


def test_the_yaml_blocks_are_found(tmp_path: Path) -> None:
    kinds = {validate_yaml(body, place, tmp_path) for place, body in yaml_blocks()}
    assert kinds == {"site profile", "prediction", "sweep spec"}
