"""hpcbench.plan.profiles: finding, parsing and recording site profiles."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpcbench.errors import SpecError
from hpcbench.executors import catalog
from hpcbench.plan import profiles
from hpcbench.plan.launch import sections
from hpcbench.plan.profiles import SiteProfile

# The executors' option parsers, as the sweep command hands them to profile loading.
SECTIONS = sections(catalog())


def load(name: str | None) -> profiles.SiteProfile:
    return profiles.load(name, SECTIONS)


def from_dict(d: dict[str, Any]) -> profiles.SiteProfile:
    return profiles.from_dict(d, SECTIONS)


SHIPPED_DIR = Path(__file__).resolve().parents[2] / "hpcbench" / "plan" / "site_profiles"
SHIPPED = ("generic", "infiniband-example", "testcluster")


@pytest.fixture(autouse=True)
def _no_extra_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's own $HPCBENCH_PROFILES must not leak into these tests."""
    monkeypatch.delenv("HPCBENCH_PROFILES", raising=False)


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def parse_error(text: str, name: str = "site") -> SpecError:
    with pytest.raises(SpecError) as info:
        profiles.parse(name, Path(f"/x/{name}.yaml"), text, SECTIONS)
    return info.value


# --------------------------------------------------------------------------------------
# Shipped profiles


def test_shipped_profiles_are_available() -> None:
    assert set(SHIPPED) <= set(profiles.available())
    assert profiles.available() == sorted(profiles.available())


def test_generic_profile() -> None:
    p = load("generic")
    assert p.name == "generic"
    assert Path(p.path) == SHIPPED_DIR / "generic.yaml"
    assert p.srun_args == ("--mpi=pmix",)
    assert p.modules == ()
    assert p.env == ()
    assert p.slurm == ()
    assert p.container == ()
    assert p.setup_lines() == []
    assert "generic" in p.description


def test_none_and_empty_mean_generic() -> None:
    assert load(None) == load("generic")
    assert load("") == load("generic")


def test_testcluster_profile() -> None:
    p = load("testcluster")
    assert p.name == "testcluster"
    assert dict(p.slurm) == {"partition": "debug", "time": 10, "signal_delay_s": 5}
    env = dict(p.env)
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert env["HPCBENCH_MASTER_ADDR"] == "127.0.0.1"
    assert [name for name, _ in p.env] == sorted(env)  # items are sorted
    assert p.mpirun_args[:3] == ("--mca", "btl", "self,tcp")
    assert p.srun_args == ("--mpi=pmix",)


def test_infiniband_example_profile() -> None:
    p = load("infiniband-example")
    assert p.modules == ("gcc/12.2", "openmpi/4.1.5", "cuda/12.4")
    assert p.setup_lines() == ["module load gcc/12.2 openmpi/4.1.5 cuda/12.4"]
    env = dict(p.env)
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert env["OMPI_MCA_btl"] == "^openib,smcuda"
    assert p.srun_args == ("--mpi=pmix", "--cpu-bind=cores")
    assert p.mpirun_args == ("--mca", "pml", "ucx")
    assert p.container[0] == "apptainer"
    assert p.container[-1] == "/images/hpcbench.sif"
    assert dict(p.slurm) == {"exclusive": True}


# --------------------------------------------------------------------------------------
# Finding profiles


def test_load_by_path(tmp_path: Path) -> None:
    path = write(
        tmp_path, "mysite.yaml", "description: mine\nmodules: [gcc]\nslurm: {partition: gpu, time: '2:00:00'}\n"
    )
    p = load(str(path))
    assert p.name == "mysite"
    assert p.path == str(path)
    assert p.description == "mine"
    assert p.modules == ("gcc",)
    assert dict(p.slurm) == {"partition": "gpu", "time": 120}
    assert p.srun_args == ("--mpi=pmix",)  # default when not given


def test_load_by_yml_path(tmp_path: Path) -> None:
    path = write(tmp_path, "other.yml", "description: yml\n")
    assert load(str(path)).name == "other"


def test_load_missing_path(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load(str(tmp_path / "absent.yaml"))
    assert info.value.path == "profile"
    assert "not found" in str(info.value)


def test_empty_profile_file_has_defaults(tmp_path: Path) -> None:
    p = load(str(write(tmp_path, "empty.yaml", "")))
    assert p == SiteProfile(name="empty", path=str(tmp_path / "empty.yaml"))


def test_env_folder_is_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "a", "alpha.yaml", "description: from a\n")
    write(tmp_path / "b", "beta.yaml", "description: from b\n")
    monkeypatch.setenv("HPCBENCH_PROFILES", f"{tmp_path / 'a'}::{tmp_path / 'b'}")
    assert load("alpha").description == "from a"
    assert load("beta").description == "from b"
    names = profiles.available()
    assert {"alpha", "beta", *SHIPPED} <= set(names)
    assert profiles.search_path()[:2] == [tmp_path / "a", tmp_path / "b"]
    assert profiles.search_path()[-1] == SHIPPED_DIR


def test_env_folder_shadows_shipped_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = write(tmp_path, "generic.yaml", "description: my generic\nsrun_args: [--mpi=pmi2]\n")
    monkeypatch.setenv("HPCBENCH_PROFILES", str(tmp_path))
    p = load("generic")
    assert p.description == "my generic"
    assert p.path == str(mine)
    assert p.srun_args == ("--mpi=pmi2",)
    assert load(None).srun_args == ("--mpi=pmi2",)
    assert profiles.available().count("generic") == 1


def test_first_env_folder_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "one", "site.yaml", "description: one\n")
    write(tmp_path / "two", "site.yaml", "description: two\n")
    monkeypatch.setenv("HPCBENCH_PROFILES", f"{tmp_path / 'one'}:{tmp_path / 'two'}")
    assert load("site").description == "one"


def test_missing_env_folder_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCBENCH_PROFILES", str(tmp_path / "nowhere"))
    assert set(SHIPPED) <= set(profiles.available())
    assert load("testcluster").name == "testcluster"


def test_unknown_name_lists_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "local-site.yaml", "description: x\n")
    monkeypatch.setenv("HPCBENCH_PROFILES", str(tmp_path))
    with pytest.raises(SpecError) as info:
        load("no-such-cluster")
    err = info.value
    assert err.path == "profile"
    assert "'no-such-cluster' not found" in err.problem
    assert err.allowed is not None
    assert set(err.allowed.split(", ")) >= {"local-site", *SHIPPED}


def test_unreadable_profile_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(SpecError) as info:
        load(str(path))
    assert info.value.path == "profile"
    assert "cannot be read" in info.value.problem


# --------------------------------------------------------------------------------------
# Parsing errors name `profile NAME: key`


def test_not_a_mapping() -> None:
    err = parse_error("[a, b]\n")
    assert err.path == "profile site"


def test_invalid_yaml() -> None:
    with pytest.raises(SpecError):
        profiles.parse("site", Path("x"), "modules: [a\n", SECTIONS)


def test_unknown_key_lists_keys() -> None:
    err = parse_error("moduls: [gcc]\n")
    assert err.path == "profile site: moduls"
    assert "unknown key" in err.problem
    assert err.allowed is not None
    assert set(err.allowed.split(", ")) == {
        "description",
        "modules",
        "setup",
        "env",
        "srun_args",
        "mpirun_args",
        "container",
        "slurm",
    }


@pytest.mark.parametrize("key", ["modules", "setup", "srun_args", "mpirun_args", "container"])
@pytest.mark.parametrize("value", ["gcc/12", "[gcc, 5]", "['']", "{a: b}", '["a\\0b"]', "[[a]]", "7"])
def test_string_lists(key: str, value: str) -> None:
    err = parse_error(f"{key}: {value}\n", name="hpc")
    assert err.path == f"profile hpc: {key}"
    assert "not a list of strings" in err.problem


def test_env_name_invalid() -> None:
    err = parse_error("env: {1BAD: x}\n")
    assert err.path.startswith("profile site: env")
    assert "1BAD" in err.path
    assert "environment variable name" in err.problem
    err = parse_error("env: {'A-B': x}\n")
    assert err.path.startswith("profile site: env")


def test_env_value_nul() -> None:
    err = parse_error('env: {GOOD: "a\\0b"}\n')
    assert err.path == "profile site: env.GOOD"
    assert "NUL" in err.problem


def test_env_not_mapping_and_bad_values() -> None:
    assert parse_error("env: [A=1]\n").path == "profile site: env"
    assert parse_error("env: {A: [1]}\n").path == "profile site: env.A"
    assert parse_error("env: {A: true}\n").path == "profile site: env.A"


def test_env_values_become_text() -> None:
    p = profiles.parse("s", Path("s.yaml"), "env: {B: 3, A: 1.5, C: x}\n", SECTIONS)
    assert p.env == (("A", "1.5"), ("B", "3"), ("C", "x"))


@pytest.mark.parametrize(
    ("slurm", "key"),
    [
        ("{time: 0}", "slurm.time"),
        ("{bogus: 1}", "slurm.bogus"),
        ("{mem: lots}", "slurm.mem"),
        ("{exclusive: yes please}", "slurm.exclusive"),
        ("{additional: {nodes: 2}}", "slurm.additional.nodes"),
        ('{partition: "a\\nb"}', "slurm.partition"),
        ("[partition]", "slurm"),
    ],
)
def test_slurm_section_errors(slurm: str, key: str) -> None:
    err = parse_error(f"slurm: {slurm}\n", name="cl")
    assert err.path == f"profile cl: {key}"


def test_description_must_be_text() -> None:
    # A sweep spec refuses a non-string description (spec.load_sweep); a profile should too,
    # instead of recording "['a', 'b']" (or "None" for an empty `description:`).
    err = parse_error("description: [a, b]\n")
    assert err.path == "profile site: description"


# --------------------------------------------------------------------------------------
# setup_lines and the recorded form


def test_setup_lines_quote_modules() -> None:
    p = SiteProfile(
        name="x",
        path="x.yaml",
        modules=("gcc/12", "my module", "evil;rm -rf /", "$(id)", "it's"),
        setup=("source /etc/profile", "export A=1"),
    )
    lines = p.setup_lines()
    assert lines[1:] == ["source /etc/profile", "export A=1"]
    assert shlex.split(lines[0]) == ["module", "load", "gcc/12", "my module", "evil;rm -rf /", "$(id)", "it's"]
    assert lines[0].startswith("module load gcc/12 ")


def test_setup_lines_without_modules() -> None:
    p = SiteProfile(name="x", path="x", setup=("a", "b"))
    assert p.setup_lines() == ["a", "b"]
    assert SiteProfile(name="x", path="x").setup_lines() == []


def test_modules_from_yaml_stay_one_token_each() -> None:
    p = profiles.parse("s", Path("s.yaml"), "modules: ['a b', 'c;d', plain]\nsetup: ['echo hi']\n", SECTIONS)
    lines = p.setup_lines()
    assert shlex.split(lines[0]) == ["module", "load", "a b", "c;d", "plain"]
    assert lines[1] == "echo hi"


@pytest.mark.parametrize("name", SHIPPED)
def test_round_trip_shipped(name: str) -> None:
    p = load(name)
    assert from_dict(p.as_dict()) == p


def test_round_trip_full_profile(tmp_path: Path) -> None:
    text = yaml.safe_dump(
        {
            "description": "everything: set",
            "modules": ["gcc/12", "open mpi"],
            "setup": ["source /etc/profile", "ulimit -n 4096"],
            "env": {"NCCL_DEBUG": "INFO", "X": 3},
            "srun_args": ["--mpi=pmi2", "--cpu-bind=none"],
            "mpirun_args": ["--bind-to", "none"],
            "container": ["apptainer", "exec", "/i.sif"],
            "slurm": {
                "partition": "gpu",
                "time": "1-00:00",
                "exclusive": False,
                "additional": {"mail-type": "END", "gres": "gpu:4"},
                "setup": ["module purge"],
            },
        }
    )
    p = load(str(write(tmp_path, "full.yaml", text)))
    d: dict[str, Any] = p.as_dict()
    assert d["slurm"] == {
        "partition": "gpu",
        "time": 24 * 60,
        "exclusive": False,
        "additional": {"gres": "gpu:4", "mail-type": "END"},
        "setup": ["module purge"],
    }
    assert d["env"] == {"NCCL_DEBUG": "INFO", "X": "3"}
    assert d["name"] == "full"
    assert d["path"] == str(tmp_path / "full.yaml")
    back = from_dict(d)
    assert back == p
    # and through the YAML dump a run file records
    assert from_dict(yaml.safe_load(profiles.dump(p))) == p


def test_from_dict_validates() -> None:
    d = load("generic").as_dict()
    d["slurm"] = {"time": -1}
    with pytest.raises(SpecError) as info:
        from_dict(d)
    assert info.value.path == "profile generic: slurm.time"
