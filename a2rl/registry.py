"""One registry for every kind of plug-in (benchmark tasks, agents): lazy `module:object` references, a collision
check, and Python entry points so that an installed outside package can add one without editing this project.

An outside package declares, in its own pyproject.toml:

    [project.entry-points."a2rl.tasks"]
    my-task = "my_package.task:MyTask"

and after `pip install` the task is listed by `a2rl tasks` and runnable by `a2rl run --task my-task`. Nothing
is imported until it is asked for, so listing names stays cheap and a broken plug-in breaks only itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class PluginError(KeyError):
    """An unknown name, two plug-ins under one name, or a reference that does not import. A KeyError, as a missing
    name always was here; its message is `args[0]`, unquoted."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class PluginRef:
    name: str
    target: str
    """`module:object`."""
    source: str
    """Where the entry came from: 'built-in' or the distribution that declared it."""


class Registry(Generic[T]):
    """Names -> lazily imported objects. Built-ins are given as `module:object` strings; entry points of `group`
    are read on first use. A name declared twice (built-in and plug-in, or two plug-ins) is an error that names
    both sources, never a silent override, and raised for that name only (the other plug-ins stay usable)."""

    def __init__(self, kind: str, group: str, builtin: dict[str, str]):
        self.kind = kind
        self.group = group
        self._builtin = {name: PluginRef(name, target, "built-in") for name, target in builtin.items()}
        self._refs: dict[str, PluginRef] | None = None
        self._clashes: dict[str, list[PluginRef]] = {}
        self._loaded: dict[str, T] = {}

    def _discover(self) -> dict[str, PluginRef]:
        if self._refs is None:
            refs = dict(self._builtin)
            clashes: dict[str, list[PluginRef]] = {}
            for ep in importlib.metadata.entry_points(group=self.group):
                dist = getattr(ep.dist, "name", None) or "an installed package"
                ref = PluginRef(ep.name, ep.value, dist)
                if ep.name in refs and refs[ep.name].target != ref.target:
                    # Refused for this name only, when it is asked for: every other plug-in stays usable.
                    clashes.setdefault(ep.name, [refs[ep.name]]).append(ref)
                refs[ep.name] = ref
            self._refs, self._clashes = refs, clashes
        return self._refs

    def refresh(self) -> None:
        """Read the entry points again (after an install in this process)."""
        self._refs = None
        self._loaded.clear()

    def names(self) -> list[str]:
        return sorted(self._discover())

    def clashes(self) -> dict[str, str]:
        """Names declared more than once, each with the error its lookup raises (a listing shows them apart)."""
        self._discover()
        return {name: self._clash_message(name, clash) for name, clash in self._clashes.items()}

    def _clash_message(self, name: str, clash: list[PluginRef]) -> str:
        both = " and ".join(f"{r.target} ({r.source})" for r in clash)
        count = "two" if len(clash) == 2 else str(len(clash))
        return f"{count} {self.kind}s are named {name!r}: {both}; uninstall or rename one"

    def ref(self, name: str) -> PluginRef:
        refs = self._discover()
        if name not in refs:
            raise PluginError(f"unknown {self.kind} {name!r}; known {self.kind}s: {', '.join(sorted(refs))}")
        if clash := self._clashes.get(name):
            raise PluginError(self._clash_message(name, clash))
        return refs[name]

    def load(self, name: str) -> T:
        if name not in self._loaded:
            ref = self.ref(name)
            module, _, attr = ref.target.partition(":")
            try:
                obj = importlib.import_module(module)
                for part in attr.split(".") if attr else ():
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as error:
                raise PluginError(f"{self.kind} {name!r} ({ref.target}, from {ref.source}) does not load: "
                                  f"{error}") from error
            self._loaded[name] = obj
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._discover()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
