"""One registry for every kind of plug-in (benchmark tasks, agents): lazy `module:object` references, a collision
check, and Python entry points so that an installed outside package can add one without editing this project.

An outside package declares, in its own pyproject.toml:

    [project.entry-points."a2rl.tasks"]
    my-task = "my_package.task:MyTask"

and after `pip install` the task is listed by `a2rl tasks` and runnable by `a2rl run --task my-task`, or by its
namespaced name `my-dist/my-task` (the distribution's name, normalised, then the entry point's, as Inspect AI names
`package/name`; the built-ins are `a2rl/<name>` too). The short name works while one plug-in declares it; two that
both declare it make that short name an error naming both, and each is still reached by its namespaced name.
Nothing is imported until it is asked for, so listing names stays cheap and a broken plug-in breaks only itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
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

    @property
    def qualified(self) -> str:
        """`<distribution>/<name>`, the name that stays unique when two plug-ins share a short one."""
        return f"{BUILTIN_NAMESPACE if self.source == 'built-in' else namespace(self.source)}/{self.name}"


BUILTIN_NAMESPACE = "a2rl"
"""The namespace of the built-in plug-ins (`a2rl/gsm8k`)."""


def namespace(distribution: str) -> str:
    """A distribution's name as a plug-in namespace: normalised as pip does (PEP 503), `My_Pkg` -> `my-pkg`."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


class Registry(Generic[T]):
    """Names -> lazily imported objects. Built-ins are given as `module:object` strings; entry points of `group`
    are read on first use. A name declared twice (built-in and plug-in, or two plug-ins) is an error that names
    both sources, never a silent override, and raised for that name only (the other plug-ins stay usable)."""

    def __init__(self, kind: str, group: str, builtin: dict[str, str]):
        self.kind = kind
        self.group = group
        self._builtin = {name: PluginRef(name, target, "built-in") for name, target in builtin.items()}
        self._refs: dict[str, PluginRef] | None = None
        self._qualified: dict[str, PluginRef] = {}
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
            self._qualified = {r.qualified: r for r in [*self._builtin.values(), *refs.values(),
                                                        *(r for c in clashes.values() for r in c)]}  # fmt: skip
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
        which = " or ".join(repr(r.qualified) for r in clash)
        return f"{count} {self.kind}s are named {name!r}: {both}; name one by its namespaced name ({which})"

    def ref(self, name: str) -> PluginRef:
        """The plug-in of a short name (`gsm8k`) or a namespaced one (`a2rl/gsm8k`, `my-dist/my-task`)."""
        refs = self._discover()
        if "/" in name and (found := self._qualified.get(name)) is not None:
            return found
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
        return name in self._discover() or name in self._qualified

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
