"""The links of a prediction: each level's cost as a prediction file's `links:` states it
(rates and latency, α and β, per-P fits) or as commbench files fit it, and the inter-node
link `hpcbench predict SWEEP_DIR --links FILE` reads; with the checkers of numbers and
mappings that name the key of what is wrong (forecast_spec.py reads the rest of the file).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.analysis.model import linkfit as calibration
from hpcbench.analysis.model.collectives import LinkCost, MessageCost, link_from_rate
from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.spec import parse_yaml


@dataclass(frozen=True)
class Level:
    """One level's cost: a per-hop link, or all-reduce fits per rank count (t = α_P + β_P·n)."""

    link: LinkCost | None = None
    fits: Mapping[int, MessageCost] = field(default_factory=dict)


def number(path: str, value: Any, minimum: float = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value <= minimum):
        allowed = f"a number {'>' if strict else '>='} {minimum:g}"
        raise SpecError(path, f"{value!r} is not {allowed}", allowed)
    return float(value)


def count(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(path, f"{value!r} is not a positive integer", "integers >= 1")
    return value


def mapping(path: str, value: Any, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if value is None:
        raise SpecError(path, "is missing", "a mapping with keys " + ", ".join(keys))
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", "a mapping with keys " + ", ".join(keys))
    for key in value:
        if key not in keys:
            raise SpecError(f"{path}.{key}", "unknown key", ", ".join(keys))
    return value


def _fits(path: str, raw: Any) -> dict[int, MessageCost]:
    """`{P: [alpha_s, beta_s_per_byte], ...}`: all-reduce fits per rank count, as published."""
    allowed = "P: [alpha_s, beta_s_per_byte] with P >= 2 ranks"
    if not isinstance(raw, Mapping) or not raw:
        raise SpecError(path, f"{raw!r} is not a non-empty mapping", allowed)
    out: dict[int, MessageCost] = {}
    for p, pair in raw.items():
        where = f"{path}.{p}"
        if isinstance(p, bool) or not isinstance(p, int) or p < 2:
            raise SpecError(where, f"{p!r} is not a rank count >= 2", allowed)
        if not isinstance(pair, list) or len(pair) != 2:
            raise SpecError(where, f"{pair!r} is not [alpha_s, beta_s_per_byte]", allowed)
        out[p] = MessageCost(number(f"{where}[0]", pair[0]), number(f"{where}[1]", pair[1]))
    return out


def _level(path: str, raw: Any) -> Level:
    m = mapping(path, raw, ("bandwidth_gbps", "latency_us", "alpha_s", "beta_s_per_byte", "fits"))
    if "fits" in m:
        return Level(fits=_fits(f"{path}.fits", m["fits"]))
    if "bandwidth_gbps" in m:
        bandwidth = number(f"{path}.bandwidth_gbps", m["bandwidth_gbps"], strict=True)
        return Level(link_from_rate(bandwidth, number(f"{path}.latency_us", m.get("latency_us", 0.0))))
    if "alpha_s" in m and "beta_s_per_byte" in m:
        alpha = number(f"{path}.alpha_s", m["alpha_s"])
        return Level(LinkCost(alpha, number(f"{path}.beta_s_per_byte", m["beta_s_per_byte"])))
    raise SpecError(path, "gives no cost", "bandwidth_gbps (+ latency_us), alpha_s + beta_s_per_byte, or fits")


def _from_commbench(raw: Any, base: Path | None) -> dict[str, calibration.LinkFit]:
    """Levels fitted on commbench files (calibration.levels_from_commbench)."""
    allowed = "a non-empty list of commbench files (paths relative to the prediction file)"
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise SpecError("links.from_commbench", f"{raw!r} is not {allowed}", allowed)
    paths = [Path(p) if Path(p).is_absolute() or base is None else base / p for p in raw]
    for i, path in enumerate(paths):
        if not path.is_file():
            raise SpecError(f"links.from_commbench[{i}]", f"{str(path)!r} is not a file", allowed)
    try:
        return {str(level): fit for level, fit in calibration.levels_from_commbench(paths).items()}
    except HpcbenchError as exc:
        raise SpecError("links.from_commbench", str(exc), "files of `hpcbench commbench -o FILE`") from None


LINK_KEYS = ("intra", "inter", "nics_per_node", "from_commbench")


def levels(links: Mapping[str, Any], base: Path | None) -> tuple[dict[str, Level], dict[str, calibration.LinkFit]]:
    """The levels a `links:` mapping states (intra, inter), and those fitted on its commbench
    files (a level stated beside them wins); at least one."""
    if "intra" not in links and "inter" not in links and "from_commbench" not in links:
        raise SpecError("links", "gives no link", "intra and/or inter, or from_commbench: [FILES]")
    fitted = _from_commbench(links["from_commbench"], base) if "from_commbench" in links else {}
    fitted = {name: fit for name, fit in fitted.items() if name not in links}
    given = {name: Level(fit.link) for name, fit in fitted.items()}
    given |= {name: _level(f"links.{name}", links[name]) for name in ("intra", "inter") if name in links}
    return given, fitted


def network_link(path: Path) -> tuple[LinkCost, str]:
    """The inter-node link of a links file (`hpcbench predict SWEEP_DIR --links FILE`): a
    mapping of `links:`'s keys (or a file with a `links:` section), its `inter` level (a
    per-hop link: rates and latency, alpha and beta, or fitted on commbench files), and where
    it came from."""
    if not path.is_file():
        raise SpecError("--links", f"{path}: no such file", "a YAML file: inter: {bandwidth_gbps: .., latency_us: ..}")
    raw = parse_yaml(path.read_text(encoding="utf-8"))
    if isinstance(raw, Mapping) and "links" in raw:
        raw = raw["links"]
    links = mapping("links", raw, LINK_KEYS)
    given, fitted = levels(links, path.parent)
    level = given.get("inter")
    if level is None or level.link is None:
        allowed = "inter: {bandwidth_gbps, latency_us} or {alpha_s, beta_s_per_byte}, or from_commbench files"
        raise SpecError("links.inter", f"{path} gives no per-hop inter-node link", allowed)
    link = level.link
    rate = 8e-9 / link.beta if link.beta else math.inf
    stated = f"{path.name}: inter α {link.alpha * 1e6:.1f} µs, β {rate:.1f} Gbit/s per hop"
    return link, fitted["inter"].describe() if "inter" in fitted else stated
