"""Where a run writes, about how much, and what a full disk means: checked before anything is spent.

A run writes in five places: the Prefect home (its server's SQLite database and logs), A2RL_HOME (the converted
base model, task data, the evaluation cache), TMPDIR, the results file's folder and the runs directory (the
workspace's copy of the base model, each submitted checkpoint), and, where any of them is left to its default,
HOME. Each must take a new file and have room for its share; places on one file system share its free space.
A read-only HOME found here costs a second; found by Prefect, it cost a quarter of an hour of retries.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from a2rl_bench.paths import a2rl_home_path, prefect_home_path

MiB = 1024**2
GGUF_TO_FP32 = 7
"""A 4-5 bit GGUF dequantized to fp32 safetensors is about 6.4 times its size; rounded up."""


@dataclass(frozen=True)
class Place:
    """One directory a run writes in, what it is called in the message, and what the run will put there."""

    name: str
    """How the user sets it: `HOME`, `PREFECT_HOME`, `--results`, ..."""
    path: Path
    need_bytes: int
    what: str
    """What the run writes there, for the message."""
    fix: str
    """What to do when it cannot be written."""


def model_bytes(name: str) -> tuple[int, bool]:
    """About how many bytes the base model's checkpoint takes, and whether it is still to be converted into
    A2RL_HOME. (0, False) where it cannot be told (a hub id not yet cached): its own check says more."""
    from a2rl_bench.base_models.build import MARKER
    from a2rl_bench.base_models.registry import REGISTRY, gguf_path

    models = a2rl_home_path() / "models"
    if name in REGISTRY:
        if (models / name / MARKER).is_file():
            return _dir_bytes(models / name), False
        try:
            return gguf_path(REGISTRY[name]).stat().st_size * GGUF_TO_FP32, True
        except (OSError, RuntimeError):
            return 0, False
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.stat().st_size * GGUF_TO_FP32, True
    if path.is_dir():
        return _dir_bytes(path), False
    return 0, False


def _dir_bytes(path: Path) -> int:
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        return 0


def run_places(base_model: str, results: Path, runs_dir: Path) -> list[Place]:
    """The places a run with this base model writes, each with its share (an estimate, rounded up)."""
    size, to_convert = model_bytes(base_model)
    home = Path.home()
    prefect, a2rl_bench = prefect_home_path(), a2rl_home_path()
    under_home = tuple(n for n, p in (("PREFECT_HOME", prefect), ("A2RL_HOME", a2rl_bench)) if _under(p, home))
    tmp = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())  # as set: Python alone would fall back to /tmp

    def set_it(name: str) -> str:
        return f"set it to a writable directory (export {name}=/path/with/space)"

    places = [
        Place("PREFECT_HOME", prefect, 64 * MiB, "the Prefect server's database and logs", set_it("PREFECT_HOME")),
        Place("A2RL_HOME", a2rl_bench, (size if to_convert else 0) + 64 * MiB,
              "the converted base model, task data and the evaluation cache", set_it("A2RL_HOME")),
        Place("TMPDIR", tmp, 32 * MiB, "temporary files", set_it("TMPDIR")),
        Place("--results", results.parent, 16 * MiB, "the results store", "name a file in a writable folder"),
        # The workspace's read-only copy of the base model and at least the first submitted checkpoint.
        Place("--runs-dir", runs_dir, 2 * size + 64 * MiB, "the run directory (the base model's copy, checkpoints)",
              "pass --runs-dir in a writable folder with space"),
    ]  # fmt: skip
    if under_home:  # HOME itself only matters where something is left to default under it
        fix = f"make HOME writable, or set {' and '.join(under_home)} to writable directories elsewhere"
        places.insert(0, Place("HOME", home, 16 * MiB, f"{' and '.join(under_home)} by default", fix))
    return places


def _under(path: Path, parent: Path) -> bool:
    path, parent = path.absolute(), parent.absolute()
    return path == parent or parent in path.parents


def check_places(places: list[Place]) -> str | None:
    """None when every place takes a file and every file system has room for what its places will get; else
    one line naming the path, what the run writes there and what to do."""
    by_device: dict[int, tuple[int, int, list[Place]]] = {}
    for place in places:
        existing = next(p for p in (place.path.absolute(), *place.path.absolute().parents) if p.exists())
        if not existing.is_dir():
            return f"{place.name} {place.path}: {existing} is a file, not a directory; {place.fix}"
        try:
            with tempfile.NamedTemporaryFile(dir=existing, prefix=".a2rl-write-test-"):
                pass
        except OSError as e:
            where = "" if existing == place.path.absolute() else f" (so {place.path} cannot be made)"
            return (f"{place.name} {existing} is not writable{where}: {e.strerror or e}; the run writes "
                    f"{place.what} there; {place.fix}")  # fmt: skip
        device = os.stat(existing).st_dev  # places on one file system share its free space
        need, free, members = by_device.get(device, (0, shutil.disk_usage(existing).free, []))
        by_device[device] = (need + place.need_bytes, free, [*members, place])
    for need, free, members in by_device.values():
        if free < need:
            names = ", ".join(f"{p.name} {p.path}" for p in members)
            return (f"not enough free space for this run: {_size(free)} free where {names} "
                    f"{'lie' if len(members) > 1 else 'lies'}, about {_size(need)} needed "
                    f"({'; '.join(f'{p.what} {_size(p.need_bytes)}' for p in members)}); free some space there, "
                    f"or {members[-1].fix}")  # fmt: skip
    return None


def _size(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / MiB:.0f} MiB"


FULL_WORDS = ("No space left on device", "Disk quota exceeded")
"""ENOSPC and EDQUOT as their text reads in an exception that carries no errno."""


def disk_full(error: BaseException, places: list[Path]) -> str | None:
    """For an error (or one it was caused by) that means a full disk (ENOSPC, EDQUOT): one clause naming the
    path (the file it was writing, else the fullest of `places`) and what to do; else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            free = {p: _free(p) for p in places}
            where = Path(error.filename) if error.filename else min(free, key=lambda p: free[p], default=None)
            if where is None:
                return "the disk is full: free some space, then run again"
            return (f"the disk is full at {where} ({_size(_free(where))} free): free some space there, or point "
                    f"the run elsewhere (--results, --runs-dir, A2RL_HOME), then run again")  # fmt: skip
        if not isinstance(error, OSError) and any(words in str(error) for words in FULL_WORDS):
            # DuckDB (and other libraries) say it in their own exception, without an errno
            return disk_full(OSError(errno.ENOSPC, FULL_WORDS[0]), places)
        error = error.__cause__ or error.__context__
    return None


def _free(path: Path) -> int:
    try:
        existing = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
        return shutil.disk_usage(existing).free
    except (OSError, StopIteration):
        return 0


RESERVE_BYTES = 8 * MiB
"""Set aside at a run's start, given back when it fails: room to write its failed row and report on a full disk."""


def reserve_space(run_id: str, dirs: list[Path]) -> list[Path]:
    """One reserve file of RESERVE_BYTES on each file system of `dirs` (the run's harness directory, the
    results store's folder). Returns the files; a reserve that cannot be made is skipped (the preflight
    checked the space; this only helps the record of a failure)."""
    made: list[Path] = []
    devices: set[int] = set()
    for d in dirs:
        try:
            device = os.stat(d).st_dev
            if device in devices:
                continue
            path = d / f".a2rl-disk-reserve-{run_id}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)  # real blocks, not a sparse file
            finally:
                os.close(fd)
        except OSError:
            continue
        devices.add(device)
        made.append(path)
    return made


def release(reserve: list[Path]) -> None:
    for path in reserve:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
