"""Name -> class registries for pluggable parts (frameworks, launchers, executors).

A new part is one new module in the part's package that decorates its class with
`REGISTRY.register`; modules are discovered, not listed. A part may also live outside the
package, in a plugin module named in $HPCBENCH_PLUGINS (module names separated by commas),
imported when a registry is first used, in every process of a sweep (ranks inherit the
variable), so a site can add a launcher or executor without changing hpcbench. Importing a part's module must be
cheap: heavy libraries (torch, tensorflow, ...) are named in the class's `requires` and
imported only when a point uses the part. A part whose library is missing stays listed,
with the import error, which is raised only when a point asks for it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Iterator
from typing import ClassVar, Generic, Protocol, TypeVar

from hpcbench.errors import HpcbenchError


class Part(Protocol):
    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]]


T = TypeVar("T", bound=type)


def import_error(modules: tuple[str, ...]) -> str | None:
    """None if all `modules` import, else the first failure as 'module: error'."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import failure makes the part unavailable
            return f"{module}: {type(exc).__name__}: {exc}"
    return None


def plugins() -> list[str]:
    """The plugin modules named in $HPCBENCH_PLUGINS."""
    return [m.strip() for m in os.environ.get("HPCBENCH_PLUGINS", "").split(",") if m.strip()]


class Registry(Generic[T]):
    def __init__(self, kind: str, package: str) -> None:
        self.kind = kind
        self._package = package
        self._classes: dict[str, T] = {}
        self._broken: dict[str, str] = {}  # module -> why it did not import
        self._discovered = False

    def register(self, cls: T) -> T:
        name = cls.name  # type: ignore[attr-defined]
        if name in self._classes and self._classes[name] is not cls:
            raise HpcbenchError(f"{self.kind} {name!r} registered twice")
        self._classes[name] = cls
        return cls

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self._package)
        for info in pkgutil.iter_modules(package.__path__):
            if info.name.startswith("_") or info.name in ("base", "registry"):
                continue
            self._import(f"{self._package}.{info.name}", info.name)
        for module in plugins():
            self._import(module, module)

    def _import(self, module: str, key: str) -> None:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - recorded, reported by `check`
            self._broken[key] = f"{type(exc).__name__}: {exc}"

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._classes)

    def get(self, name: str) -> T:
        self._discover()
        try:
            return self._classes[name]
        except KeyError:
            raise HpcbenchError(f"unknown {self.kind} {name!r} (known: {', '.join(self.names())})") from None

    def load(self, name: str) -> T:
        """The class, after checking that the libraries it requires import."""
        cls = self.get(name)
        error = import_error(cls.requires)  # type: ignore[attr-defined]
        if error is not None:
            raise HpcbenchError(f"{self.kind} {name!r} is not available here: {error}")
        return cls

    def __iter__(self) -> Iterator[T]:
        self._discover()
        return iter(self._classes[n] for n in sorted(self._classes))

    @property
    def broken(self) -> dict[str, str]:
        self._discover()
        return dict(self._broken)
