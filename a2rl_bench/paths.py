"""Where a2rl keeps caches (shared across runs) and run directories (one per run), and where it finds its own
files (the task data it ships, a checkout's root): from a checkout and from an installed wheel alike."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

HOSTS_PATTERN = "results/hosts/*/a2rl.duckdb"
"""Where the day-one layout keeps a copy of each host's results directory (docs/scale-out.md); here, not in
a2rl_bench.store.merge, so that `a2rl store merge --help` does not import DuckDB."""


def a2rl_home() -> Path:
    """Machine-wide cache root: converted base models, prepared task data, evaluation cache."""
    path = a2rl_home_path()
    path.mkdir(parents=True, exist_ok=True)
    return path


def a2rl_home_path() -> Path:
    """Where `a2rl_home` is, without creating it (for the checks before a run)."""
    root = os.environ.get("A2RL_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "a2rl"
    )
    return Path(root)


def models_dir() -> Path:
    return _sub("models")


def task_data_dir() -> Path:
    return _sub("task-data")


def eval_cache_dir() -> Path:
    return _sub("eval-cache")


def _sub(name: str) -> Path:
    path = a2rl_home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def prefect_home_path() -> Path:
    """PREFECT_HOME as Prefect reads it (default ~/.prefect), without creating it."""
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def import_root() -> Path:
    """The folder `import a2rl_bench` finds this package in: a checkout's root, or an installed wheel's site-packages
    (what a child process under another interpreter puts on its PYTHONPATH to import the same harness)."""
    return Path(__file__).resolve().parent.parent


def checkout_root() -> Path | None:
    """The repository a2rl runs from, when it runs from a checkout (its plug-in folders `flows/`, ... beside the
    package, `pyproject.toml` at the top); None for an installed wheel, whose files live in site-packages."""
    root = import_root()
    return root if (root / "pyproject.toml").is_file() and (root / "flows" / "__init__.py").is_file() else None


def data_file(*parts: str) -> Path:
    """A file of the task data that ships with a2rl: the repository's `data/` folder, installed by the wheel as the
    package data `a2rl_bench/data/` (a checkout finds it under the same name: a2rl_bench/__init__.py)."""
    node = resources.files("a2rl_bench.data")
    for part in parts:
        node = node / part
    return Path(str(node))


def package_file(package: str, name: str) -> Path:
    """A file shipped inside one of a2rl's packages (e.g. a module copied into an agent's workspace)."""
    return Path(str(resources.files(package) / name))
