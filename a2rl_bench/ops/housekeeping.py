"""What killed processes leave half-written in the machine-wide caches, removed when a run starts.

A SIGKILL skips every `finally`: a base-model conversion leaves its build directory (`.<model>.tmp-*`, GBs), an
evaluation leaves its result file (`run-<pid>-<ns>.json`) or the cache's temporary (`<key>.<pid>.<tid>.tmp`).
Only what no live process can still be writing is removed: a build directory whose build lock is free, an
evaluation file whose writer's pid is gone and that is older than any evaluation may take (containers sharing
the cache have pid namespaces of their own, so a pid alone does not prove its writer dead).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from a2rl_bench.isolation import procs
from a2rl_bench.locks import LockTimeout, exclusive_lock
from a2rl_bench.paths import eval_cache_dir, models_dir

BUILD_DIR = re.compile(r"^\.(?P<target>.+)\.tmp-[^/]+$")
EVAL_OUT = re.compile(r"^run-(?P<pid>\d+)-\d+\.json$")
CACHE_TMP = re.compile(r"^.+\.(?P<pid>\d+)\.\d+\.tmp$")
STALE_AFTER_S = 2 * 3600.0
"""Older than an evaluation's time limit (a2rl_bench.inference.evaluation: 3600 s), twice over."""


def clean_stale_temp(models: Path | None = None, eval_cache: Path | None = None) -> list[Path]:
    """Remove abandoned model build directories and evaluation temporaries. Returns what was removed."""
    removed = [p for p in _stale_builds(models or models_dir()) if _remove(p)]
    for path in (eval_cache or eval_cache_dir()).iterdir():
        match = EVAL_OUT.match(path.name) or CACHE_TMP.match(path.name)
        if match and path.is_file() and _old(path) and not procs.pid_alive(int(match["pid"])) and _remove(path):
            removed.append(path)
    return removed


def _stale_builds(root: Path) -> list[Path]:
    stale = []
    for path in root.iterdir():
        match = BUILD_DIR.match(path.name)
        if match and path.is_dir() and _lock_free(root / f".{match['target']}.lock"):
            stale.append(path)
    return stale


def _lock_free(lock: Path) -> bool:
    """Whether no process holds the build lock (`a2rl_bench.base_models.build.build_once`); a build in progress holds
    it."""
    try:
        with exclusive_lock(lock, deadline=time.monotonic()):  # one try, no wait
            return True
    except LockTimeout:
        return False


def _old(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > STALE_AFTER_S
    except OSError:
        return False


def _remove(path: Path) -> bool:
    try:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    except OSError:
        return False
    return True
