"""A sweep's complete points derived (per_point.py), from the cache (cache.py) where it holds them.

`load` walks the point files as `tables.load` does, in the same order and with the same
warnings. A file whose cache entry fits is not read; any other file is read, checked, derived,
and its entry written (where it was complete, and the same file before and after it was read).
The point files themselves are read again only where a sweep-wide step needs them (`data`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hpcbench.analysis import cache, collectives, derive_pool, per_point, tables
from hpcbench.analysis.per_point import PointTables
from hpcbench.errors import HpcbenchError
from hpcbench.store.reader import PointData


@dataclass
class DerivedSweep:
    directory: Path
    points: list[PointTables] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    keys: list[tuple[str, list[int]]] = field(default_factory=list)  # each point's file name and identity
    store: cache.Store | None = None
    target_accuracy: float | None = None
    read: dict[int, PointData] = field(default_factory=dict)  # by index into `points`: the files read

    @property
    def cache_stats(self) -> cache.CacheStats:
        return self.store.stats if self.store is not None else cache.CacheStats()

    def data(self) -> list[PointData]:
        """Every point's file, read where it was not yet; a file changed since its entry was
        used is derived again, so the tables and the arrays stay the same point's."""
        for i, p in enumerate(self.points):
            if i not in self.read:
                self._read_again(i, p)
        return [self.read[i] for i in range(len(self.points))]

    def with_collectives(self) -> None:
        """Every point's collectives per mesh axis (a sweep with a layout shows all its points')."""
        for i, p in enumerate(self.points):
            if p.collectives is None:
                data = self.read[i] if i in self.read else self._read_again(i, self.points[i])
                p = self.points[i]
                p.collectives = collectives.of_point(data)
                identity = cache.identity(p.path)
                if self.store is not None and identity is not None and identity == self.keys[i][1]:
                    self.store.put(identity, p)

    def _read_again(self, i: int, p: PointTables) -> PointData:
        before = cache.identity(p.path)
        warnings: list[str] = []
        data = tables.read_checked(p.path, warnings)
        if data is None:
            raise HpcbenchError(f"{p.path}: changed while it was analysed ({'; '.join(warnings)}); analyse again")
        self.read[i] = data
        if before != self.keys[i][1] or cache.identity(p.path) != before:  # not the file its entry was
            self.points[i] = self._derive(i, data, p.collectives is not None, before)
        return data

    def _derive(self, i: int, data: PointData, with_collectives: bool, identity: list[int] | None) -> PointTables:
        return self._derived(i, data, per_point.derive(data, self.target_accuracy, with_collectives), identity)

    def _derived(self, i: int, data: PointData, derived: PointTables, identity: list[int] | None) -> PointTables:
        """`derived`, the tables of point `i` read as `data` from a file whose identity was
        `identity` before it was read, kept in the cache where it is still that file."""
        after = cache.identity(data.path)
        if self.store is not None and identity is not None and after == identity:
            self.store.put(identity, derived)
        self.keys[i] = (data.path.name, after or [])
        return derived


def load(
    directory: Path | str,
    on_file: tables.FileHook | None = None,
    use_cache: bool = True,
    target_accuracy: float | None = None,
) -> DerivedSweep:
    """Every complete point of a sweep, derived; the others skipped with tables.load's warnings.
    Files without a cache entry are read and derived by worker processes where there are many
    (derive_pool.py), in the same order, with the same tables."""
    directory = Path(directory)
    if not directory.is_dir():
        raise HpcbenchError(f"{directory}: no such sweep directory")
    store = cache.Store(directory, target_accuracy) if use_cache else None
    sweep = DerivedSweep(directory, store=store, target_accuracy=target_accuracy)
    attempts = tables.attempts_of(directory)
    files = tables.point_files(directory)
    absent = {p for p in files if store is None or store.absent(p)}
    ahead = set(derive_pool.pooled([p for p in files if p in absent]))
    with derive_pool.derived([p for p in files if p in ahead], target_accuracy) as results:
        for done, path in enumerate(files):
            if on_file is not None:
                on_file(done, len(files))
            before = cache.identity(path)
            if store is not None and before is not None and path in absent:
                store.stats.misses += 1  # as store.get counts a file without an entry
            if path in ahead:  # read and derived by a worker
                data, warnings, derived = next(results)
                sweep.warnings.extend(warnings)
                if data is None or derived is None:
                    continue
                sweep.read[len(sweep.points)] = data
                sweep.keys.append((path.name, []))
                found = sweep._derived(len(sweep.points), data, derived, before)
            else:
                entry = store is not None and before is not None and path not in absent
                cached = store.get(path, before) if store is not None and before is not None and entry else None
                if cached is not None:
                    sweep.keys.append((path.name, before or []))
                    found = cached
                else:
                    data = tables.read_checked(path, sweep.warnings)
                    if data is None:
                        continue
                    sweep.read[len(sweep.points)] = data
                    sweep.keys.append((path.name, []))
                    found = sweep._derive(len(sweep.points), data, False, before)
            sweep.warnings.extend(tables.attempt_warnings(path, attempts))
            sweep.points.append(found)
    if on_file is not None:
        on_file(len(files), len(files))
    if store is not None:
        store.prune(files)
    return sweep
