"""What a point file's provenance holds that differs on every run, whatever was installed or
chosen (job ids, daemon addresses, session folders, process and thread ids, temporary paths,
timestamps): the rest is what two runs can meaningfully differ in (`hpcbench compare`,
docs/compare.md#provenance lists both tables)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# Keys: shell patterns matched
# case-insensitively against the whole dotted key (`environment.OMPI_MCA_orte_hnp_uri`), and why.
PER_RUN_KEYS: dict[str, str] = {
    "*job_id": "a job id (Slurm's SLURM_JOB_ID, the point's slurm_job_id)",
    "*jobid": "a launcher's job id (Open MPI's OMPI_MCA_ess_base_jobid)",
    "*jobfam*": "a launcher's job family, named after its process (Open MPI's orte_jobfam_session_dir)",
    "*_uri": "a launcher daemon's contact address, a port drawn per run (Open MPI's orte_hnp_uri, "
    "orte_local_daemon_uri)",
    "*session_dir": "a per-run session folder (Open MPI's orte_top_session_dir ...)",
    "*precondition_transports": "a random key drawn per job (Open MPI's orte_precondition_transports)",
    "*pid": "a process id (Open MPI's ess_base_vpid is a rank's)",
    "*pids": "process ids",
    "*timestamp*": "a timestamp",
    "created": "when the file was made",
}
# Values that hold a per-run part beside what matters (the sampler's sources name its thread):
# the part is replaced before values are compared, so only the rest can differ.
PER_RUN_VALUES: tuple[tuple[str, str, str], ...] = (
    (r"/proc/(?:\d+|self)/task/\d+", "/proc/PID/task/TID", "a process or thread id in a /proc path"),
    (r"/proc/\d+", "/proc/PID", "a process id in a /proc path"),
    (r"\bpid[.=:_ ]?\d+", "pid.PID", "a process id in a name (pid.23583)"),
    (r"(?:/tmp|/var/tmp|/dev/shm)/[^\s/;,:]+", "TMP", "a temporary path's name (mkdtemp's tmpXXXXXXXX)"),
    (r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?", "TIME", "a timestamp"),
)
_PER_RUN_VALUES = tuple((re.compile(pattern, re.IGNORECASE), mask) for pattern, mask, _ in PER_RUN_VALUES)


def _flatten(key: str, value: Any) -> Iterator[tuple[str, str]]:
    """(dotted key, value as text) pairs: mappings recurse; a list gives each item."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(f"{key}.{k}" if key else str(k), v)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                yield key, " ".join(f"{k}={item[k]}" for k in sorted(item) if item[k] not in (None, ""))
            else:
                yield key, str(item)
    else:
        yield key, str(value)


def per_run_key(key: str) -> bool:
    """Whether a provenance key (dotted) differs on every run by nature (PER_RUN_KEYS)."""
    lower = key.lower()
    return any(fnmatch.fnmatchcase(lower, pattern.lower()) for pattern in PER_RUN_KEYS)


def steady_value(text: str) -> str:
    """A provenance value with its per-run parts (PER_RUN_VALUES) masked."""
    for pattern, mask in _PER_RUN_VALUES:
        text = pattern.sub(mask, text)
    return text


def steady_values(provenances: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Every key of the points' provenance and the values seen (dotted keys for mappings),
    without the keys that differ on every run and with the per-run parts of values masked."""
    seen: dict[str, set[str]] = {}
    for provenance in provenances:
        for key, text in _flatten("", dict(provenance)):
            if not per_run_key(key):
                seen.setdefault(key, set()).add(steady_value(text))
    return seen
