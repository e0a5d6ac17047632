"""Pack an interactive task's environment as `envlib.zip` for agents' workspaces (importable straight from the zip).

The zip holds the shared modules here, the modules the task declares (its `AgentEnvironment`, built-in and plug-in
tasks alike) and `_tasks.py`, the task's entry in envlib's registry: `envlib.make_env(task, ...)`,
`envlib.prompter(task)` and `envlib.MAX_STEPS[task]` look the task up there.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

SHARED_MODULES = ("__init__", "api", "base", "bm25", "react")
"""Shipped for every task: the loop, the interface and BM25. Not the evaluator glue (`task.py`, `export.py`,
`splits.py`), which imports the harness."""
REGISTRY_MODULE = "_tasks"


@dataclass(frozen=True)
class AgentEnvironment:
    """What an interactive task gives agents in `data/envlib.zip` beside the shared modules.

    `modules`: importable module names, each a single file shipped as `envlib/<last part>.py` (so inside the zip
    a relative import such as `from .base import TextEnv` reaches the shared modules). `factory` and `prompter` are
    `module:function` with `module` one of those last parts: `factory(data_dir)` returns a factory of fresh
    environments (reading the public files it needs from `data_dir`), `prompter(goal, observation, turns)` the chat
    messages of the next step."""

    modules: tuple[str, ...]
    factory: str
    prompter: str

    def shipped_files(self) -> dict[str, Path]:
        """`envlib/` file name -> source file of each declared module; a clash or a missing module is an error."""
        files: dict[str, Path] = {}
        for module in self.modules:
            name = module.rpartition(".")[2]
            if name in SHARED_MODULES or name == REGISTRY_MODULE or f"{name}.py" in files:
                raise ValueError(f"environment module {module!r} would replace envlib/{name}.py; rename it")
            spec = importlib.util.find_spec(module)
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                raise ValueError(f"environment module {module!r} is not a Python file that imports")
            files[f"{name}.py"] = Path(spec.origin)
        for ref in (self.factory, self.prompter):
            if f"{ref.partition(':')[0]}.py" not in files or not ref.partition(":")[2]:
                raise ValueError(f"{ref!r} is not 'module:function' with module one of {sorted(files)}")
        return files


def envlib_bytes(task_id: str, max_steps: int, environment: AgentEnvironment) -> bytes:
    """The zip holding package `envlib` for one task; fixed timestamps, so the bytes are reproducible."""
    src = Path(__file__).parent
    files = {f"{name}.py": src / f"{name}.py" for name in SHARED_MODULES} | environment.shipped_files()
    entry = {"factory": environment.factory, "prompter": environment.prompter, "max_steps": max_steps}
    registry = ('"""The interactive task of this workspace, as its evaluator declares it."""\n\n'
                f"TASKS = {json.dumps({task_id: entry}, indent=4, sort_keys=True)}\n")  # JSON is a Python literal
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        texts = {name: path.read_text() for name, path in sorted(files.items())}
        for name, text in (texts | {f"{REGISTRY_MODULE}.py": registry}).items():
            zf.writestr(zipfile.ZipInfo(f"envlib/{name}", date_time=(2026, 1, 1, 0, 0, 0)), text)
    return buffer.getvalue()


def write_envlib(dest: Path, task_id: str, max_steps: int, environment: AgentEnvironment) -> Path:
    """Write `dest` (a .zip) holding package `envlib`, unless it already holds these very modules."""
    data = envlib_bytes(task_id, max_steps, environment)
    if dest.exists() and dest.read_bytes() == data:
        return dest
    tmp = dest.with_suffix(f".zip.{os.getpid()}.tmp")  # concurrent writers each replace whole
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest
