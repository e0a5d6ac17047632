"""Runs of one host share the prepared task data (A2RL_HOME/task-data). A make-test failure of the outage test:
two runs prepared gsm8k at once, and the second, done first, copied its workspace out of the public folder while
the first was still writing there; the first's temporary vanished under the copy (FileNotFoundError) and failed the
run. Preparation now takes turns on a lock, and the workspace copy leaves writers' temporaries alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from a2rl_bench.locks import exclusive_lock

PREPARE = """
import sys, time
from a2rl_bench.benchmarks import get_task
start = time.monotonic()
prepared = get_task("gsm8k").prepare("offline")
print(round(time.monotonic() - start, 2), sorted(p.name for p in prepared.public_dir.iterdir()))
"""


def test_a_run_waits_for_a_preparation_in_progress_and_finds_it_whole(tmp_path):
    """Another process holds the preparation (its lock); this run's prepare waits for it, then sees only whole
    files. Without the lock it would have written beside the other and copied half of its output."""
    env = dict(os.environ, A2RL_HOME=str(tmp_path / "home"), PYTHONPATH=os.getcwd())
    root = tmp_path / "home" / "task-data" / "gsm8k"
    root.mkdir(parents=True)
    from a2rl_bench.benchmarks import get_task

    lock = root / f".{get_task('gsm8k').prepared_root('offline').name}.lock"
    with exclusive_lock(lock):
        waiter = subprocess.Popen([sys.executable, "-c", PREPARE], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(3.0)  # long enough for an unlocked prepare to have started writing, on busy cores
        assert waiter.poll() is None, "prepare did not wait for the preparation in progress"
        assert not list(root.glob("*/public/*")), "prepare wrote while another held the preparation"
    out, err = waiter.communicate(timeout=300)
    assert waiter.returncode == 0, err
    names = out.split(" ", 1)[1]
    assert "train.jsonl" in names and ".tmp" not in names


def test_two_processes_preparing_at_once_both_get_the_same_whole_data(tmp_path):
    env = dict(os.environ, A2RL_HOME=str(tmp_path / "home"), PYTHONPATH=os.getcwd())
    procs = [subprocess.Popen([sys.executable, "-c", PREPARE], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    assert outs[0][0].split(" ", 1)[1] == outs[1][0].split(" ", 1)[1]
    public = tmp_path / "home" / "task-data" / "gsm8k" / "offline-v1" / "public"
    assert not [p for p in public.iterdir() if p.suffix == ".tmp"]


def test_a_workspace_is_not_given_a_writers_temporary(tmp_path, tiny_model_dir):
    from a2rl_bench.workspace import RunPaths, build_workspace

    public = tmp_path / "public"
    public.mkdir()
    (public / "train.jsonl").write_text('{"id": "a"}\n')
    (public / ".train.jsonl.123.456.tmp").write_text('{"id": "half')  # another run's write, not yet renamed
    (public / "envlib.zip.123.tmp").write_bytes(b"PK half")
    paths = RunPaths.for_run(tmp_path / "runs", "r1")
    build_workspace(paths, public, Path(tiny_model_dir), "desc", "instr")
    assert sorted(p.name for p in (paths.workspace / "data").iterdir()) == ["train.jsonl"]



def test_a_read_only_cache_prepared_already_is_read_without_its_lock(tmp_path, monkeypatch):
    """A cache shared read-only (prepared once, mounted for many hosts) cannot take a lock file: prepare reads it;
    where it is not prepared yet, the error says which file could not be made. (The tests run as root, which
    writes through a mode of 0o555: the file system's refusal is made here, at the lock's open.)"""
    import errno

    import pytest

    from a2rl_bench import locks
    from a2rl_bench.benchmarks import get_task

    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))
    task = get_task("gsm8k")
    prepared = task.prepare("offline")
    real_open = os.open

    def read_only(path, flags, *args):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(locks.os, "open", read_only)
    assert task.prepare("offline").manifest == prepared.manifest
    monkeypatch.setattr(task, "data_version", "never-prepared")
    with pytest.raises(OSError, match="Read-only"):
        task.prepare("offline")


def test_a_preparation_held_too_long_stops_the_waiting_run_with_the_lock_named(tmp_path, monkeypatch):
    """A preparer stopped (SIGSTOP) or hung keeps its lock; a run waiting on it stops after PREPARE_WAIT_S with an
    error that says which lock and what to do, instead of waiting for ever."""
    import pytest

    from a2rl_bench.benchmarks import base, get_task
    from a2rl_bench.locks import LockTimeout

    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(base, "PREPARE_WAIT_S", 1.0)
    task = get_task("gsm8k")
    root = task.prepared_root("offline")
    root.parent.mkdir(parents=True)
    with exclusive_lock(root.parent / f".{root.name}.lock"):  # another preparer's turn, never given back
        with pytest.raises(LockTimeout, match=r"preparing its data for 1 s .*\.offline-v1\.lock"):
            task.prepare("offline")
    assert task.prepare("offline").manifest["task"] == "gsm8k"  # given back: prepared at once
