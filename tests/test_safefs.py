"""Root walks over agent-writable trees never follow a link an agent swaps in while they run (#13.4).

A background process plays the agent: in a loop it turns a workspace directory into a link to a host
directory and back. The ownership walk, the cleanup, the quota count and the code snapshot run against it
many times; no host file outside the workspace may change owner, mode or existence, nor be counted or copied.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import stat
import time
from pathlib import Path

import pytest

from a2rl_bench.isolation import safefs
from a2rl_bench.capture.snapshots import CodeSnapshots
from a2rl_bench.isolation.sandbox import _give_workspace, workspace_bytes

AGENT_UID = 1_000_123_457
HOST_SECRET = b"host secret, not the agent's\n"


def _swap_forever(parent: str, name: str, target: str, stop) -> None:
    """The hostile agent's background job: `parent/name` is a directory, then a link to `target`, and so on."""
    os.chdir(parent)
    real = f".{name}.real"
    while not stop.is_set():
        try:
            os.rename(name, real)
            os.symlink(target, name)
            time.sleep(0.0002)  # each state lasts long enough for a walk to meet it
            os.unlink(name)
            os.rename(real, name)
            time.sleep(0.0002)
        except OSError:
            pass


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """Host files the agent must never reach: root's, one of them setuid, one with a secret."""
    host = tmp_path / "host"
    (host / "deeper").mkdir(parents=True)
    for f in ("tool", "deeper/tool"):
        (host / f).write_bytes(b"#!/bin/sh\n")
        os.chmod(host / f, 0o4755)
    (host / "secret.py").write_bytes(HOST_SECRET)
    (host / "big.bin").write_bytes(os.urandom(4 * 1024 * 1024))
    os.chown(host, 0, 0)
    return host


def _host_state(host: Path) -> dict[str, tuple[int, int, int]]:
    return {str(p.relative_to(host)): (p.lstat().st_uid, p.lstat().st_gid, p.lstat().st_mode)
            for p in [host, *host.rglob("*")]}  # fmt: skip


@pytest.fixture
def swapping(tmp_path: Path, host: Path):
    """A workspace whose `code/sub` an agent process keeps swapping for a link to `host`."""
    ws = tmp_path / "workspace"
    sub = ws / "code" / "sub"
    (sub / "deeper").mkdir(parents=True)
    for f in ("tool", "deeper/tool", "secret.py"):
        (sub / f).write_text("the agent's own\n")
    (ws / "models" / "base").mkdir(parents=True)
    (ws / "data").mkdir()
    stop = multiprocessing.Event()
    agent = multiprocessing.get_context("fork").Process(target=_swap_forever,
                                                        args=(str(ws / "code"), "sub", str(host), stop))  # fmt: skip
    agent.start()
    time.sleep(0.2)
    yield ws
    stop.set()
    agent.join(10)
    if agent.is_alive():
        agent.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="the ownership walk runs as root only")
def test_the_root_ownership_walk_never_reowns_a_host_file(swapping: Path, host: Path):
    before = _host_state(host)
    cfg = {"uid": AGENT_UID, "workspace": str(swapping),
           "read_only": [str(swapping / "models" / "base"), str(swapping / "data")]}  # fmt: skip
    given = 0
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        _give_workspace(cfg)
        given += 1
        assert _host_state(host) == before, f"a host file changed after {given} walks"
    assert given >= 20
    print(f"{given} ownership walks, host unchanged")
    # What is the agent's became its own; the harness's inputs did not.
    assert (swapping / "code").lstat().st_uid == AGENT_UID
    assert (swapping / "models" / "base").lstat().st_uid == 0 and (swapping / "data").lstat().st_uid == 0
    assert stat.S_IMODE(swapping.lstat().st_mode) == 0o1770


def test_cleanup_quota_and_snapshots_never_follow_a_swapped_link(swapping: Path, host: Path, tmp_path: Path):
    before = _host_state(host)
    own_bytes = safefs.disk_usage(swapping)
    snaps = CodeSnapshots(tmp_path / "harness", swapping / "code")
    (tmp_path / "harness").mkdir()
    deadline = time.monotonic() + 4
    rounds = 0
    while time.monotonic() < deadline:
        # The quota walk counts the workspace only (the host dir holds 4 MiB more than it).
        assert workspace_bytes(swapping) < own_bytes + 1024**2
        sha = snaps.snapshot(f"r{rounds}")
        # A snapshot holds the agent's files only, never the host's read through the link.
        for rel in snaps.files(sha):
            assert not rel.endswith("big.bin")
        rounds += 1
    assert rounds >= 5
    out = snaps.export(snaps.sha_for("r0"), tmp_path / "export")
    assert all(HOST_SECRET not in p.read_bytes() for p in out.rglob("*") if p.is_file())

    # Cleanup of a tree with a directory being swapped: the workspace goes, the host stays whole.
    for i in range(20):
        copy = swapping / "code" / f"junk{i}"
        (copy / "a" / "b").mkdir(parents=True)
        (copy / "a" / "b" / "f").write_text("x")
        os.symlink(host, copy / "a" / "link")
        safefs.remove_tree(copy)
        assert not copy.exists()
    for _ in range(100):  # the agent keeps adding names while the tree goes: "not empty" until it loses
        try:
            safefs.remove_tree(swapping / "code")
            break
        except OSError as e:
            assert e.errno == errno.ENOTEMPTY
    assert not (swapping / "code").exists()
    assert _host_state(host) == before


def test_chown_tree_refuses_hard_links_to_inodes_it_would_give_away(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    outside = tmp_path / "outside"
    outside.write_text("root's")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.link(outside, ws / "hardlink")
    (ws / "own").write_text("x")
    os.mkfifo(ws / "fifo")
    report = safefs.chown_tree(ws, AGENT_UID, AGENT_UID)
    assert outside.stat().st_uid == 0
    assert (ws / "own").stat().st_uid == AGENT_UID
    assert any("hardlink" in r for r in report.refused) and any("fifo" in r for r in report.refused)


def test_walk_lists_links_as_links_and_never_enters_them(tmp_path: Path, host: Path):
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f.py").write_text("ok")
    os.symlink(host, ws / "link")
    entries = {e.rel: e for e in safefs.walk(ws)}
    assert set(entries) == {"d", "d/f.py", "link"} and entries["link"].is_link
    with pytest.raises(OSError):
        list(safefs.walk(ws / "link"))  # the root itself must not be a link


def test_a_retried_install_replaces_links_the_agent_left_instead_of_writing_through_them(tmp_path: Path, host: Path):
    from a2rl_bench.agents.reference_sft.adapter import ReferenceSFT

    ws = tmp_path / "ws"
    (ws / "code").mkdir(parents=True)
    os.symlink(host / "secret.py", ws / "code" / "agent.py")  # left by the agent of the first attempt
    ReferenceSFT().install(ws)
    assert (host / "secret.py").read_bytes() == HOST_SECRET
    assert not (ws / "code" / "agent.py").is_symlink() and b"def " in (ws / "code" / "agent.py").read_bytes()

    (ws / "code").rename(ws / "code.real")
    os.symlink(host, ws / "code")  # the whole directory swapped for a link: refused, nothing written
    with pytest.raises(safefs.UnsafePath, match="refusing to write agent.py"):
        ReferenceSFT().install(ws)
    assert sorted(p.name for p in host.iterdir()) == ["big.bin", "deeper", "secret.py", "tool"]
