"""Where a2rl keeps caches (shared across runs) and run directories (one per run)."""

from __future__ import annotations

import os
from pathlib import Path


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
