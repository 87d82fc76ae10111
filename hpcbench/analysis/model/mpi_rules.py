"""Which algorithm an MPI library's MPI_Allreduce runs, by message size and rank count, and its cost.

An MPI library does not run one all-reduce: it picks an algorithm per call from the message's
bytes n and the communicator's size p. The model follows the library named in the point's
provenance (`mpi`, the library's own version string):

- **Open MPI 4.1 and later** (the `tuned` component's fixed decision rules, commutative
  operations such as the gradients' sum): p < 4: recursive doubling below 4 KiB and from 8 to
  16 KiB, a ring from 4 to 8 KiB and from 16 to 64 KiB, a segmented ring to 256 KiB,
  Rabenseifner's above; 4 <= p < 8: recursive doubling from 16 B to 8 KiB, Rabenseifner's
  above; 8 <= p < 16: recursive doubling below 8 KiB, Rabenseifner's above; larger
  communicators by the library's table (`_OPEN_MPI_41`, reduce then broadcast below a size
  for the largest).
- **Open MPI before 4.1**: recursive doubling below 10,000 bytes, a ring above.
- **MPICH** and its derivatives that keep its defaults (`MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE`
  2048): recursive doubling up to 2 KiB, Rabenseifner's above.
- Any other library (its rules are not published with it): a ring, as before.
- An algorithm forced through Open MPI's MCA parameters (`OMPI_MCA_coll_tuned_use_dynamic_rules=1`
  and `OMPI_MCA_coll_tuned_allreduce_algorithm=N` in the ranks' environment, as provenance
  keeps it) is that algorithm at every size: 1 and 2 (a reduce then a broadcast), 3
  (recursive doubling), 4 and 5 (a ring, segmented or not), 6 (Rabenseifner's).

Costs, n bytes per rank on p ranks, p' the largest power of two <= p, e = 1 when p is not a
power of two (the e extra ranks first hand their data to a partner and get the result back:
two steps of n bytes), α, β, γ per step, per byte sent, per byte reduced:

| algorithm | α steps | β bytes / n | γ bytes / n |
| --- | --- | --- | --- |
| ring, segmented ring | 2(p−1) | 2(p−1)/p | (p−1)/p |
| recursive doubling | lg p' + 2e | lg p' + 2e | lg p' + e |
| Rabenseifner (reduce-scatter by halving, all-gather by doubling) | 2 lg p' + 2e | 2(p'−1)/p' + 2e | (p'−1)/p' + e |
| reduce then broadcast (binomial trees) | 2⌈lg p⌉ | 2⌈lg p⌉ | ⌈lg p⌉ |

So between 2 and 4 ranks a small message's cost doubles (1 step, then 2) where a ring's
triples (2 steps, then 6): the ring overstates how fast a latency-bound exchange grows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np

from hpcbench.analysis.model.collectives import LinkCost, check_ranks

RING, DOUBLING, RABENSEIFNER, REDUCE_BCAST = "ring", "recursive doubling", "rabenseifner", "reduce+broadcast"
KiB = 1024

# Open MPI 4.1's fixed rules, commutative branch: (communicator sizes below, [(bytes below, algorithm)],
# algorithm above the last size); segmented rings are rings here.
_OPEN_MPI_41: tuple[tuple[int, tuple[tuple[int, str], ...], str], ...] = (
    (4, ((8, RING), (4 * KiB, DOUBLING), (8 * KiB, RING), (16 * KiB, DOUBLING), (256 * KiB, RING)), RABENSEIFNER),
    (8, ((16, RING), (8 * KiB, DOUBLING)), RABENSEIFNER),
    (16, ((8 * KiB, DOUBLING),), RABENSEIFNER),
    (32, ((64, RING), (4 * KiB, DOUBLING)), RABENSEIFNER),
    (64, ((128, RING),), RABENSEIFNER),
    (128, ((256 * KiB, DOUBLING),), RABENSEIFNER),
    (256, ((128 * KiB, REDUCE_BCAST), (256 * KiB, DOUBLING)), RABENSEIFNER),
    (512, ((4 * KiB, REDUCE_BCAST),), RABENSEIFNER),
    (2048, ((2 * KiB, REDUCE_BCAST), (16 * KiB, DOUBLING)), RABENSEIFNER),
    (4096, ((2 * KiB, REDUCE_BCAST), (4 * KiB, RING), (16 * KiB, DOUBLING)), RABENSEIFNER),
    (2**62, ((2 * KiB, REDUCE_BCAST), (16 * KiB, RING), (32 * KiB, DOUBLING)), RABENSEIFNER),
)


def _open_mpi_41(n: float, p: int) -> str:
    for below, sizes, above in _OPEN_MPI_41:
        if p < below:
            return next((algorithm for limit, algorithm in sizes if n < limit), above)
    raise AssertionError("unreachable: the last row has no size limit")


RULES: dict[str, Callable[[float, int], str]] = {
    "open-mpi-4.1": _open_mpi_41,
    "open-mpi": lambda n, p: DOUBLING if n < 10_000 else RING,
    "mpich": lambda n, p: DOUBLING if n <= 2 * KiB else RABENSEIFNER,
}


# OMPI_MCA_coll_tuned_allreduce_algorithm's numbers
_OPEN_MPI_FORCED = {"1": REDUCE_BCAST, "2": REDUCE_BCAST, "3": DOUBLING, "4": RING, "5": RING, "6": RABENSEIFNER}
FORCED = "forced:"  # rules that name one algorithm for every size: FORCED + its name


def library(version: object, environment: object = None) -> str:
    """The rules (a key of RULES, or FORCED + an algorithm) of the MPI library named by
    `version` (MPI_Get_library_version's first line, as the point's provenance keeps it), given
    the ranks' `environment` (a mapping); "" for a library whose rules are unknown."""
    text = str(version or "")
    found = re.search(r"Open MPI v(\d+)\.(\d+)", text)
    if found:
        env = environment if isinstance(environment, dict) else {}
        forced = _OPEN_MPI_FORCED.get(str(env.get("OMPI_MCA_coll_tuned_allreduce_algorithm", "")))
        if forced and str(env.get("OMPI_MCA_coll_tuned_use_dynamic_rules", "")) in ("1", "true"):
            return FORCED + forced
        return "open-mpi-4.1" if (int(found[1]), int(found[2])) >= (4, 1) else "open-mpi"
    return "mpich" if text.startswith("MPICH") else ""


def algorithm(rules: str, n: float, p: int) -> str:
    """The algorithm `rules` run for n bytes on p ranks (a ring where the rules are unknown)."""
    if rules.startswith(FORCED):
        return rules[len(FORCED) :]
    choose = RULES.get(rules)
    return choose(n, p) if choose else RING


def steps(name: str, p: int) -> tuple[float, float, float]:
    """(α steps, β bytes per byte, γ bytes per byte) of one all-reduce of `name` on p ranks."""
    check_ranks(p)
    if p == 1:
        return 0.0, 0.0, 0.0
    if name == RING:
        return 2.0 * (p - 1), 2 * (p - 1) / p, (p - 1) / p
    if name == REDUCE_BCAST:
        depth = math.ceil(math.log2(p))
        return 2.0 * depth, 2.0 * depth, float(depth)
    low = 1 << (p.bit_length() - 1)  # the largest power of two <= p
    lg, extra = float(low.bit_length() - 1), float(low != p)
    if name == DOUBLING:
        return lg + 2 * extra, lg + 2 * extra, lg + extra
    if name == RABENSEIFNER:
        return 2 * lg + 2 * extra, 2 * (low - 1) / low + 2 * extra, (low - 1) / low + extra
    raise ValueError(f"unknown all-reduce algorithm {name!r}")


def cost(rules: str, n: float, p: int, link: LinkCost) -> float:
    """Seconds of one MPI_Allreduce of n bytes on p ranks under `rules`."""
    a, b, c = steps(algorithm(rules, n, p), p)
    return a * link.alpha + n * (b * link.beta + c * link.gamma)


def design(rules: str, n_bytes: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """The least-squares design of all-reduces of n_bytes[i] on ranks[i] under `rules`: per row
    [α steps, bytes sent], so that the row's time is the row · (α, β) (γ folded into β)."""
    m = np.asarray(n_bytes, dtype=float)
    p = np.asarray(ranks, dtype=int)
    pairs, where = np.unique(np.column_stack([m, p]), axis=0, return_inverse=True)
    per_pair = np.array([steps(algorithm(rules, size, int(q)), int(q))[:2] for size, q in pairs]).reshape(-1, 2)
    coefficients = per_pair[np.ravel(where)]
    return np.column_stack([coefficients[:, 0], coefficients[:, 1] * m])
