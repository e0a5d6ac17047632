"""bench/gpu_alfworld.py, the GPU table's driver, in the parts that need no GPU: the order the runs start in and
a collect that waits without ending the runs (a call of the GPU tool lasts 10 minutes; the runs last longer)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import gpu_alfworld  # noqa: E402


def test_each_setting_runs_on_every_card():
    """start_all fills the cards round-robin in this order: with 2 cards, both settings of a table on both cards
    (one setting per card would confound the setting with its card's load)."""
    order = gpu_alfworld.run_order(["agent:sft-only", "agent:free"], [0, 1, 2, 3])
    assert sorted(order) == sorted((m, s) for m in ("agent:sft-only", "agent:free") for s in range(4))
    for mode in ("agent:sft-only", "agent:free"):
        cards = {i % 2 for i, (m, _) in enumerate(order) if m == mode}
        assert cards == {0, 1}, (mode, order)


def test_a_collect_with_wait_only_leaves_the_runs_running(tmp_path):
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        state = {"started_at": time.time(), "facts": {},
                 "runs": [{"name": "r", "pid": run.pid, "results": str(tmp_path / "r.duckdb"), "gpu": None,
                           "log": str(tmp_path / "r.log")}]}  # fmt: skip
        (tmp_path / gpu_alfworld.STATE).write_text(json.dumps(state))
        code = gpu_alfworld.main(["--collect", "--wait-only", "0", "--deadline-s", "0", "--work", str(tmp_path),
                                  "--out", str(tmp_path / "out")])  # fmt: skip
        assert code == 5
        assert run.poll() is None  # not interrupted: a later collect goes on with it
        assert not (tmp_path / "out" / "a2rl.duckdb").exists()
    finally:
        run.kill()
        run.wait()


def test_eight_runs_a_card_bound_sfts_memory_and_only_rl_runs_are_tested_post_hoc(tmp_path, monkeypatch):
    """More than four runs a card: SFT's steps in bounded micro-batches (what lets eight fit), unless the caller
    chose; every submission on the hidden test only in runs whose RL share it measures."""
    monkeypatch.delenv("A2RL_SFT_MICRO_TOKENS", raising=False)
    args = gpu_alfworld.parse_args(["--work", str(tmp_path), "--per-gpu", "8"])
    env = gpu_alfworld.run_env(args, "r", 0)
    assert env["A2RL_SFT_MICRO_TOKENS"] == str(gpu_alfworld.SFT_MICRO_TOKENS_SHARED)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["PREFECT_HOME"].startswith(str(tmp_path))
    monkeypatch.setenv("A2RL_SFT_MICRO_TOKENS", "4096")
    assert gpu_alfworld.run_env(args, "r", 0)["A2RL_SFT_MICRO_TOKENS"] == "4096"
    monkeypatch.delenv("A2RL_SFT_MICRO_TOKENS")
    four = gpu_alfworld.parse_args(["--work", str(tmp_path), "--per-gpu", "4"])
    assert "A2RL_SFT_MICRO_TOKENS" not in gpu_alfworld.run_env(four, "r", 0)
    free = gpu_alfworld.run_command(args, "reference-sft-grpo:free", 0, tmp_path, tmp_path / "r.duckdb")
    sft_only = gpu_alfworld.run_command(args, "reference-sft-grpo:sft-only", 0, tmp_path, tmp_path / "r.duckdb")
    assert "--test-every-submission" in free and "--test-every-submission" not in sft_only
    assert free[free.index("--mode") + 1] == "free" and sft_only[sft_only.index("--seed") + 1] == "0"


def test_the_tables_rl_share_is_the_stores_own(tmp_path):
    """The table prints RL's share as the store's `stage_shares` has it (the start the agent declared, where it
    did), never a share it recomputes by another rule: the figure printed on the GPU machine and `a2rl analyze` on
    the merged store cannot disagree."""
    import duckdb

    from a2rl_bench.analysis.synthetic import write_stage_study

    store = tmp_path / "results.duckdb"
    write_stage_study(store)
    with duckdb.connect(str(store)) as con:  # run-1's share as the store would hold it from a declared start
        con.execute("UPDATE metrics SET value = 0.5 WHERE run_id = 'run-1' AND name = 'rl_share_p_value'")
        con.execute("INSERT INTO metrics VALUES ('run-1', 'rl_share_start', NULL, 'declared')")
    shares = gpu_alfworld.rl_shares(store)
    con = duckdb.connect(str(store), read_only=True)
    rows = con.execute("SELECT run_id, rl_share, ci_low, p_value, sft_start FROM stage_shares").fetchall()
    con.close()
    assert len(rows) == 4 and set(shares) == {r[0] for r in rows}
    for run_id, share, low, p, start in rows:
        printed, diffs = shares[run_id]
        assert (printed.delta, printed.ci_low, printed.p_value, printed.start) == (share, low, p, start)
        assert round(100 * sum(diffs.values()) / len(diffs), 6) == round(share, 6)
    assert (shares["run-1"][0].p_value, shares["run-1"][0].start) == (0.5, "declared")
    table = gpu_alfworld.seeds_table(store)
    assert table.count("start inferred") == 3 and "p=0.5 (n=134; start declared)" in table


FAKE_MPS_CONTROL = """#!/bin/sh
# A stand-in for nvidia-cuda-mps-control (no GPU here): -d starts "the daemon" (a file), commands on stdin are
# answered while it runs, quit ends it. Every call is appended to calls.log.
state="$(dirname "$0")/daemon"
echo "$* ${CUDA_MPS_LOG_DIRECTORY:-}" >> "$(dirname "$0")/calls.log"
[ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || echo "pipe $CUDA_MPS_PIPE_DIRECTORY" >> "$(dirname "$0")/calls.log"
if [ "$1" = "-d" ]; then touch "$state"; exit 0; fi
[ -e "$state" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
read -r cmd; echo "$cmd" >> "$(dirname "$0")/calls.log"
case "$cmd" in
  get_server_list) echo 4242 ;;
  get_default_active_thread_percentage) echo 100.0 ;;
  quit) rm -f "$state" ;;
esac
"""


def test_mps_starts_one_daemon_before_the_runs_finds_a_running_one_and_stops_it(tmp_path, monkeypatch):
    """--mps: the daemon is started with its log under --work and CUDA's default pipe directory (agents get no
    CUDA_MPS_* variable from the harness), a running one is reused, and the collect's stop quits it. Without the
    control program the bench says so before it starts anything."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match="nvidia-cuda-mps-control is not on PATH"):
        gpu_alfworld.start_mps(tmp_path / "work", time.monotonic())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / gpu_alfworld.MPS_CONTROL
    fake.write_text(FAKE_MPS_CONTROL)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "elsewhere"))  # not handed on: agents would miss it
    facts = gpu_alfworld.start_mps(tmp_path / "work", time.monotonic())
    assert facts == {"mps": True, "mps_default_active_thread_percentage": "100.0"}
    assert "CUDA_MPS_PIPE_DIRECTORY" not in gpu_alfworld.run_env(gpu_alfworld.parse_args([]), "r", 0)  # as agents
    calls = (bin_dir / "calls.log").read_text().splitlines()
    assert f"-d {tmp_path / 'work' / 'mps-log'}" in calls and (tmp_path / "work" / "mps-log").is_dir()
    assert gpu_alfworld.start_mps(tmp_path / "work", time.monotonic())["mps"]  # already up: not started twice
    assert sum(c.startswith("-d") for c in (bin_dir / "calls.log").read_text().splitlines()) == 1
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "elsewhere"))  # a collect in another shell
    assert gpu_alfworld.stop_mps(time.monotonic()) == "4242"
    assert not [c for c in (bin_dir / "calls.log").read_text().splitlines() if c.startswith("pipe")]  # the default
    assert not (bin_dir / "daemon").exists()
    assert gpu_alfworld.stop_mps(time.monotonic()).startswith("not stopped")  # nothing to stop: said, not raised
