"""A submitted checkpoint directory as untrusted objects: opened by file descriptor, never through a link.

The grader runs outside the sandbox, as the harness user, over files the agent wrote and may still be
changing. So the directory is opened one component at a time from the workspace root with `O_NOFOLLOW`
(a parent swapped for a link cannot redirect it), every file is opened relative to that directory fd with
`O_NOFOLLOW | O_NONBLOCK` (a link fails, a FIFO opens without blocking and is then refused), and `fstat` on
the open fd decides: a regular file, one link (a hard link could share an inode with a file the agent must
not change after the check), its apparent size counted against the cap. Whatever is read or copied later is
read from those same fds, so a file swapped after the check is not what gets graded.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2rl_bench.grading.errors import SubmissionRejected

FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_JSON_BYTES = 4 * 1024**2
"""config.json / the safetensors index: far larger than any real one."""
MAX_JSON_VALUES = 250_000
"""Values (containers and scalars) one JSON file may hold: what `json.loads` builds is ~100 bytes a value, so this
bounds its memory (~25 MB) whatever the shape; a sharded index names two strings a tensor."""
MAX_ENTRIES = 10_000
"""Top-level names in a checkpoint dir; a sharded 400B checkpoint has a few hundred."""
CHECK_SECONDS = 600.0
"""Time limit for the checks and the copy of one submission (64 GB at ~200 MB/s fits)."""


class Deadline:
    """The time limit of one check; loops over file contents call `check()` between chunks."""

    def __init__(self, seconds: float = CHECK_SECONDS):
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def check(self, what: str) -> None:
        if time.monotonic() > self._end:
            raise SubmissionRejected(f"checking the checkpoint took over {self.seconds:.0f} s ({what})", 408)


def shown(name: str) -> str:
    """An agent-chosen file name as it appears in our messages: quoted, and cut short."""
    return repr(name if len(name) <= 60 else name[:57] + "...")


def refusal(err: OSError, what: str) -> SubmissionRejected:
    """One clear 4xx line for an OS error met while opening agent-made paths."""
    reasons = {
        errno.ELOOP: (f"{what} is a symbolic link, or a link loop: submit regular files only", 400),
        errno.ENAMETOOLONG: (f"{what}: a path component is longer than the filesystem allows", 400),
        errno.ENOENT: (f"{what} does not exist", 404),
        errno.ENOTDIR: (f"{what}: a path component is not a directory (a symbolic link is not followed)", 400),
        errno.EACCES: (f"{what} cannot be read by the grader (permissions)", 400),
        errno.EPERM: (f"{what} cannot be read by the grader (permissions)", 400),
        errno.ENXIO: (f"{what} is not a regular file (a socket or device)", 400),
    }
    fallback = (f"{what} cannot be opened ({errno.errorcode.get(err.errno, 'error')})", 400)
    message, status = reasons.get(err.errno, fallback)
    return SubmissionRejected(message, status)


@dataclass
class OpenFile:
    """A checked regular file of the checkpoint, held open: later reads see the object that was checked."""

    name: str
    fd: int
    size: int

    def read_at(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def read_json(self, max_bytes: int = MAX_JSON_BYTES) -> Any:
        if self.size > max_bytes:
            raise SubmissionRejected(f"{self.name} is {self.size} bytes, over the {max_bytes} bytes allowed")
        raw = self.read_at(0, self.size)
        # Every value but a container's first follows a comma, every key precedes a colon, every container opens
        # with a bracket: this bounds the objects json.loads would build, counted in C before it builds any.
        values = raw.count(b",") + raw.count(b":") + raw.count(b"[") + raw.count(b"{") + 1
        if values > MAX_JSON_VALUES:
            raise SubmissionRejected(f"{self.name} holds over {MAX_JSON_VALUES} JSON values: not a real one")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser's stack
            raise SubmissionRejected(f"{self.name} is not valid JSON") from e

    def copy_to(self, dest: Path, deadline: Deadline, chunk: int = 8 << 20,
                charge: Callable[[int], None] | None = None) -> int:  # fmt: skip
        """Copy exactly the checked size, sparsely: only the file's data extents are read and written, its holes
        stay holes (a sparse file of a few KB on the agent's disk must not become gigabytes in the harness's).
        `charge(n)` is told each block's bytes before it is written (the snapshot quota; it may refuse). A file
        that shrank since is refused (it is being rewritten). Returns the bytes written."""
        written = 0
        with open(dest, "wb") as out:
            for start, end in _data_extents(self.fd, self.size):
                offset = start
                while offset < end:
                    deadline.check(f"copying {self.name}")
                    n = min(chunk, end - offset)
                    if charge is not None:
                        charge(n)
                    block = os.pread(self.fd, n, offset)
                    if not block:
                        raise SubmissionRejected(f"{shown(self.name)} changed while it was copied: submit it again",
                                                 409)  # fmt: skip
                    out.seek(offset)
                    out.write(block)
                    offset += len(block)
                    written += len(block)
            out.truncate(self.size)  # a hole at the end too
        return written


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each stretch of `fd` that holds data, up to `size` (SEEK_DATA / SEEK_HOLE); the whole
    file where the filesystem cannot tell."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole from here on
                return
            yield pos, size  # no SEEK_DATA here: copy densely
            return
        if start >= size:
            return
        try:
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError:
            end = size
        yield start, end
        pos = end


@dataclass
class CheckpointDir:
    """An agent's checkpoint directory held open by fd; close() (or `with`) releases every fd."""

    fd: int
    label: str
    files: dict[str, OpenFile] = field(default_factory=dict)

    @classmethod
    def open(cls, root: Path, resolved: Path, label: str) -> CheckpointDir:
        """Open `resolved` (inside `root`, links already resolved) one component at a time, refusing links."""
        rel = resolved.relative_to(root)
        try:
            fd = os.open(root, DIR_FLAGS)
        except OSError as e:
            raise refusal(e, "the workspace") from e
        try:
            for part in rel.parts:
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
        except OSError as e:
            os.close(fd)
            raise refusal(e, f"model_path {shown(label)}") from e
        return cls(fd, label)

    def entries(self, deadline: Deadline | None = None) -> dict[str, os.stat_result]:
        """Top-level names with their own (not followed) metadata; a directory of more than MAX_ENTRIES
        names is refused (listing millions of agent-made files must not tie up a grader thread)."""
        out = {}
        with os.scandir(self.fd) as it:
            for n, entry in enumerate(it):
                if n >= MAX_ENTRIES:
                    raise SubmissionRejected(f"the checkpoint directory holds over {MAX_ENTRIES} entries: "
                                             "submit a directory with the checkpoint's files only")  # fmt: skip
                if deadline is not None and n % 1000 == 999:
                    deadline.check("listing the checkpoint directory")
                try:
                    out[entry.name] = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed while listing
        return out

    def open_file(self, name: str) -> OpenFile:
        """Open one top-level file for reading; refuse anything but a regular file with one link."""
        if name in self.files:
            return self.files[name]
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=self.fd)
        except OSError as e:
            raise refusal(e, shown(name)) from e
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = f"{shown(name)} is not a regular file (a FIFO, socket, device or directory): submit regular files"
        elif st.st_nlink != 1:
            problem = f"{shown(name)} is a hard link ({st.st_nlink} names for one file): submit a plain copy"
        if problem:
            os.close(fd)
            raise SubmissionRejected(problem)
        self.files[name] = OpenFile(name, fd, st.st_size)
        return self.files[name]

    def close(self) -> None:
        for f in self.files.values():
            os.close(f.fd)
        self.files.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> CheckpointDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
