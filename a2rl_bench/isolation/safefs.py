"""Walking agent-writable trees with the harness's rights, without following a link the agent swaps in.

A path walk (`os.walk`, `rglob`, `shutil.copytree`, `chown` by path) re-resolves every path it touches: an agent
process that runs meanwhile can turn `code/sub` into a link to `/etc` between the walk's "is this a directory?"
and its next step, and a root walk then re-owns, counts, copies or deletes host files. Every step here is
relative to an open directory descriptor instead: a directory is entered with `O_DIRECTORY | O_NOFOLLOW` (a
swapped-in link fails to open and is skipped), and files are changed through their own descriptor (`fchown`)
or by name relative to the held directory (`unlinkat`, `lchown`), so no path is ever resolved twice.

Standard library only: the sandbox shim (run as `python -I -S`) loads this file by path.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# NONBLOCK: a FIFO swapped in for a file must not hang the harness; NOCTTY: never adopt a terminal.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_DEPTH = 256
"""Deeper directories are not entered (an agent can nest far deeper than there are descriptors)."""


class UnsafePath(OSError):
    """A path the harness was to write through is not what it should be (a link where a directory belongs)."""


@dataclass(frozen=True)
class Entry:
    """One name in a directory being walked: valid while the walk holds `dir_fd` (during the `yield`)."""

    dir_fd: int
    name: str
    rel: str
    """Path relative to the walk's root, '/'-separated."""
    st: os.stat_result
    """lstat of the name when it was listed (a link is a link, never its target)."""

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.st.st_mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.st.st_mode)


def open_dir(path: str | os.PathLike, dir_fd: int | None = None) -> int:
    """A descriptor on the directory `path` itself (a link there raises OSError: ELOOP or ENOTDIR)."""
    return os.open(path, DIR_FLAGS, dir_fd=dir_fd)


def walk(root: str | os.PathLike, prune: Callable[[Entry], bool] | None = None, max_depth: int = MAX_DEPTH,
         one_filesystem: bool = True) -> Iterator[Entry]:  # fmt: skip
    """Every name under `root`, parents before children, sorted by name; directories for which `prune` is true
    are listed but not entered. Names that vanish or turn into links while walked are skipped. The root itself
    must be a real directory (not a link)."""
    fd = open_dir(root)
    try:
        yield from _walk(fd, "", 0, os.fstat(fd).st_dev if one_filesystem else None, prune, max_depth)
    finally:
        os.close(fd)


def _walk(fd: int, prefix: str, depth: int, dev: int | None, prune, max_depth: int) -> Iterator[Entry]:
    try:
        with os.scandir(fd) as it:
            names = sorted(e.name for e in it)
    except OSError:
        return
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:  # gone meanwhile
            continue
        entry = Entry(fd, name, prefix + name, st)
        yield entry
        if not entry.is_dir or depth + 1 >= max_depth or (dev is not None and st.st_dev != dev):
            continue
        if prune is not None and prune(entry):
            continue
        try:
            child = open_dir(name, dir_fd=fd)
        except OSError:  # swapped for a link or a file since the lstat: not ours to enter
            continue
        try:
            if _same(os.fstat(child), st):
                yield from _walk(child, entry.rel + "/", depth + 1, dev, prune, max_depth)
        finally:
            os.close(child)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def open_file(entry_or_dir_fd: Entry | int, name: str | None = None) -> int | None:
    """A read descriptor on a regular file listed by the walk, or None when it is not one (any more): a link,
    a FIFO, a device, gone, or swapped since it was listed."""
    if isinstance(entry_or_dir_fd, Entry):
        dir_fd, name, listed = entry_or_dir_fd.dir_fd, entry_or_dir_fd.name, entry_or_dir_fd.st
    else:
        dir_fd, listed = entry_or_dir_fd, None
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (listed is not None and not _same(st, listed)):
        os.close(fd)
        return None
    return fd


def read_file(entry: Entry, max_bytes: int) -> bytes | None:
    """The whole content of a regular file of at most `max_bytes` (apparent size), else None."""
    return _read_fd(open_file(entry), max_bytes)


def _read_fd(fd: int | None, max_bytes: int) -> bytes | None:
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size > max_bytes:
            return None
        data = f.read(max_bytes + 1)  # the file may grow meanwhile
    return None if len(data) > max_bytes else data


@dataclass
class ChownReport:
    changed: int = 0
    refused: list[str] | None = None
    """Names left as they were: hard links to inodes the new owner does not own, special files."""


def chown_tree(root: str | os.PathLike, uid: int, gid: int, prune: Callable[[Entry], bool] | None = None,
               keep: Callable[[Entry], bool] | None = None) -> ChownReport:  # fmt: skip
    """Give everything under `root` (not `root` itself) to uid:gid. Directories and regular files are changed
    through a descriptor opened without following links, so only inodes inside the tree change owner; a regular
    file with other hard links is left alone unless `uid` already owns it (a link to a host file must not give
    that file away). Links get their own owner changed (never their target's). Special files are left alone.
    `prune`: directories not entered (nor changed); `keep`: names left unchanged."""
    report = ChownReport(refused=[])
    for entry in walk(root, prune=prune):
        if (keep is not None and keep(entry)) or (prune is not None and entry.is_dir and prune(entry)):
            continue
        if (entry.st.st_uid, entry.st.st_gid) == (uid, gid):  # the usual case on later walks: nothing to open
            continue
        if entry.is_link:
            _quiet(os.chown, entry.name, uid, gid, dir_fd=entry.dir_fd, follow_symlinks=False)
            report.changed += 1
            continue
        if entry.is_dir:
            fd = _open_quiet(entry.name, DIR_FLAGS, entry.dir_fd)
        elif entry.is_file:
            fd = open_file(entry)
        else:
            report.refused.append(f"{entry.rel} (not a file, directory or link)")
            continue
        if fd is None:
            continue
        try:
            st = os.fstat(fd)
            if not _same(st, entry.st):
                continue
            if not entry.is_dir and st.st_nlink > 1 and st.st_uid != uid:
                report.refused.append(f"{entry.rel} (a hard link: {st.st_nlink} names)")
                continue
            os.fchown(fd, uid, gid)
            report.changed += 1
        finally:
            os.close(fd)
    return report


def chown_root(root: str | os.PathLike, uid: int, gid: int, mode: int | None = None) -> None:
    """Owner (and mode) of the directory `root` itself, through a descriptor (a link there raises)."""
    fd = open_dir(root)
    try:
        os.fchown(fd, uid, gid)
        if mode is not None:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def remove_tree(path: str | os.PathLike, missing_ok: bool = True) -> None:
    """Delete the directory `path` and everything in it, each name relative to its held parent: a link is
    removed, never followed. `path` itself must not be a link (a link there is removed, not its target)."""
    path = Path(path)
    try:
        parent = open_dir(path.parent)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    try:
        try:
            st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            if missing_ok:
                return
            raise
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path.name, dir_fd=parent)
            return
        _remove_children(parent, path.name, 0)
        os.rmdir(path.name, dir_fd=parent)
    finally:
        os.close(parent)


def _remove_children(parent: int, name: str, depth: int) -> None:
    fd = open_dir(name, dir_fd=parent)
    try:
        with os.scandir(fd) as it:
            names = [e.name for e in it]
        for child in names:
            try:
                st = os.stat(child, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) and depth < 4 * MAX_DEPTH:
                try:
                    _remove_children(fd, child, depth + 1)
                    os.rmdir(child, dir_fd=fd)
                except OSError as e:
                    if e.errno not in (errno.ENOTDIR, errno.ELOOP, errno.ENOENT):
                        raise
                    _quiet(os.unlink, child, dir_fd=fd)  # swapped for a link or a file: remove the name only
            else:
                _quiet(os.unlink, child, dir_fd=fd)
    finally:
        os.close(fd)


def disk_usage(root: str | os.PathLike, prune: Callable[[Entry], bool] | None = None,
               stop_above: int | None = None) -> int:  # fmt: skip
    """Bytes under `root` as the harness must count them: each file at the larger of its allocated blocks and its
    apparent size (a sparse file occupies little but every copy of it, a snapshot or a download, is its full
    size; a preallocated one occupies more than it says), hard links once, links not followed; directories
    count their blocks. Stops counting once past `stop_above`."""
    total, seen = 0, set()
    for entry in walk(root, prune=prune, max_depth=4 * MAX_DEPTH):
        if prune is not None and entry.is_dir and prune(entry):
            continue
        if (entry.st.st_dev, entry.st.st_ino) not in seen:
            seen.add((entry.st.st_dev, entry.st.st_ino))
            allocated = entry.st.st_blocks * 512
            total += max(allocated, entry.st.st_size) if entry.is_file else allocated
            if stop_above is not None and total > stop_above:
                break
    return total


def replace_file(dir_path: str | os.PathLike, name: str, data: bytes, mode: int = 0o644) -> None:
    """Write `name` in the directory `dir_path` as a new file replacing whatever has that name: a link there is
    replaced, never written through (a harness writing its files into an agent-owned `code/` on a retry). The
    directory itself must not be a link (UnsafePath)."""
    try:
        fd = open_dir(dir_path)
    except OSError as e:
        raise UnsafePath(f"{dir_path} is not a plain directory ({e.strerror}; a link left by the agent?): refusing "
                         f"to write {name} there") from e  # fmt: skip
    try:
        tmp = f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as f:
                f.write(data)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            _quiet(os.unlink, tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


def read_link(entry: Entry) -> str | None:
    try:
        return os.readlink(entry.name, dir_fd=entry.dir_fd)
    except OSError:
        return None


def _open_quiet(name: str, flags: int, dir_fd: int) -> int | None:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None


def _quiet(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except OSError:
        pass
