"""Recording: code snapshots in a harness-owned git repository, resource samples, LLM-call events."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
import pytest

from a2rl_bench.capture.snapshots import CodeSnapshots
from a2rl_bench.capture.resources import (
    ResourceSampler, read_resources, resource_rows, summarize_resources, workspace_pids,
)
from a2rl_bench.capture.calls import read_llm_calls, read_tool_calls, summarize_llm_calls


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "harness").mkdir()
    (tmp_path / "workspace" / "code").mkdir(parents=True)
    return tmp_path


def test_snapshot_commits_code_and_a_repeat_without_changes_commits_nothing(run_dir: Path):
    code = run_dir / "workspace" / "code"
    snaps = CodeSnapshots(run_dir / "harness")
    (code / "train.py").write_text("from trl import SFTTrainer\n")
    first = snaps.snapshot("submission-1")
    again = snaps.snapshot("periodic")
    assert again == first
    assert [r.changed for r in snaps.records()] == [True, False]
    assert snaps.sha_for("submission-1") == first and snaps.sha_for("periodic") == first
    # The repository lives in the harness dir; nothing was added to the agent's code dir.
    assert (run_dir / "harness" / "code.git" / "HEAD").exists()
    assert sorted(p.name for p in code.iterdir()) == ["train.py"]


def test_diff_between_snapshots_shows_the_edit(run_dir: Path):
    code = run_dir / "workspace" / "code"
    snaps = CodeSnapshots(run_dir / "harness")
    (code / "train.py").write_text("lr = 1e-5\n")
    a = snaps.snapshot("submission-1")
    (code / "train.py").write_text("lr = 3e-4\n")
    (code / "reward.py").write_text("def reward(x): return 1.0\n")
    b = snaps.snapshot("submission-2")
    diff = snaps.diff(a, b)
    assert "-lr = 1e-5" in diff and "+lr = 3e-4" in diff and "reward.py" in diff
    assert "2 files changed" in snaps.diff(a, b, stat=True)
    assert snaps.files(b) == ["reward.py", "train.py"]


def test_empty_or_missing_code_dir_still_gives_a_commit(tmp_path: Path):
    (tmp_path / "harness").mkdir()
    snaps = CodeSnapshots(tmp_path / "harness", code_dir=tmp_path / "nowhere")
    sha = snaps.snapshot("start")
    assert len(sha) == 40 and snaps.files(sha) == []
    assert snaps.snapshot("again") == sha
    # Exporting it (route labelling does) gives an empty folder, not a tar error (CI saw this when a racing
    # agent's code/ was mid-rename at snapshot time).
    out = snaps.export(sha, tmp_path / "export")
    assert out.is_dir() and not any(out.iterdir())


def test_big_files_ignored_files_and_agent_git_dirs_are_handled(run_dir: Path):
    code = run_dir / "workspace" / "code"
    (code / ".gitignore").write_text("*.py\n")  # the agent's ignore rules do not hide code from the record
    (code / "train.py").write_text("print('hi')\n")
    (code / "weights.bin").write_bytes(b"\0" * 5000)
    (code / ".git").mkdir()
    (code / ".git" / "config").write_text("[core]\n")
    (code / "empty").mkdir()
    os.symlink("/etc/passwd", code / "passwd-link")
    snaps = CodeSnapshots(run_dir / "harness", max_file_bytes=1000)
    sha = snaps.snapshot("submission-1")
    assert snaps.files(sha) == [".gitignore", "passwd-link", "train.py"]
    assert snaps.records()[-1].skipped == ["weights.bin (5000 bytes > 1000)"]
    # Export writes regular files only: a recorded symlink is never recreated.
    out = snaps.export(sha, run_dir / "export")
    assert sorted(p.name for p in out.iterdir()) == [".gitignore", "train.py"]
    assert (out / "train.py").read_text() == "print('hi')\n"


def test_deleted_files_disappear_from_the_next_snapshot(run_dir: Path):
    code = run_dir / "workspace" / "code"
    snaps = CodeSnapshots(run_dir / "harness")
    (code / "a.py").write_text("a")
    (code / "b.py").write_text("b")
    snaps.snapshot("one")
    (code / "b.py").unlink()
    assert snaps.files(snaps.snapshot("two")) == ["a.py"]


def test_periodic_snapshots_run_in_the_background_and_once_at_the_end(run_dir: Path):
    code = run_dir / "workspace" / "code"
    snaps = CodeSnapshots(run_dir / "harness")
    with snaps.periodic(0.05):
        (code / "x.py").write_text("1")
        deadline = time.monotonic() + 10  # generous: git is slow on a busy machine
        while [r.label for r in snaps.records()].count("periodic") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    labels = [r.label for r in snaps.records()]
    assert labels.count("periodic") >= 2 and labels[-1] == "periodic-end"
    assert snaps.files(snaps.records()[-1].sha) == ["x.py"]


def test_resource_sampler_measures_the_agent_process_tree(run_dir: Path):
    import psutil

    workspace = run_dir / "workspace"
    # A parent that starts a child: both must be counted, found by their cwd inside the workspace.
    script = ("import subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=workspace)
    parent = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + 20  # a busy machine can take seconds to start Python
        while not parent.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        with ResourceSampler(run_dir / "harness", workspace_pids(workspace), interval_s=0.2, workspace=workspace,
                             extra_fn=lambda: {"grading": False}):
            time.sleep(0.7)
    finally:
        for p in [*parent.children(recursive=True), parent]:
            p.kill()
        proc.wait()
    samples = read_resources(run_dir / "harness" / "resources.jsonl")
    assert len(samples) >= 2
    assert max(s.n_procs for s in samples) == 2
    assert max(s.rss_bytes for s in samples) > 1_000_000
    assert samples[0].workspace_bytes is not None and samples[0].extra == {"grading": False}
    assert [s.seq for s in samples] == list(range(len(samples)))
    summary = summarize_resources(samples)
    assert summary["procs_peak"] == 2 and summary["gpu_util_percent_mean"] is None
    rows = resource_rows(samples)
    assert rows[0]["seq"] == 0 and rows[0]["gpu_mem_bytes"] is None


def test_agents_llm_and_tool_call_logs_become_store_rows(tmp_path: Path):
    from a2rl_bench.jsonl import append_jsonl
    from a2rl_bench.agents.base import LLMCallEvent, ToolCallEvent

    calls = tmp_path / "llm_calls.jsonl"
    append_jsonl(calls, LLMCallEvent(call=1, model="claude-x", input_tokens=100, output_tokens=20,
                                     cache_read_tokens=50, cost_usd=0.01, latency_s=1.5))
    append_jsonl(calls, LLMCallEvent(call=2, attempt=1, model="claude-x", status=529, error="overloaded"))
    append_jsonl(calls, LLMCallEvent(call=2, attempt=2, model="claude-x", input_tokens=10, output_tokens=5,
                                     cost_usd=0.002, latency_s=0.5))
    with calls.open("a") as f:
        f.write('{"call": 3, "model": "claude-x", "input_tok')  # torn last line of a killed agent
    rows = read_llm_calls(calls)
    assert [r["seq"] for r in rows] == [0, 1, 2] and rows[1]["status"] == 529 and rows[2]["attempt"] == 2
    assert rows[0]["cache_read_tokens"] == 50 and rows[0]["created_at"]
    totals = summarize_llm_calls(rows)
    assert totals["llm_requests"] == 3 and totals["llm_failed_requests"] == 1
    assert totals["llm_tokens_total"] == 100 + 20 + 50 + 10 + 5 and totals["llm_cost_usd"] == 0.012
    append_jsonl(tmp_path / "tool_calls.jsonl", ToolCallEvent(call=1, tool="bash", input={"cmd": "ls"}, exit_code=0))
    (tool,) = read_tool_calls(tmp_path / "tool_calls.jsonl")
    assert tool["tool"] == "bash" and tool["ok"] is True and '"cmd": "ls"' in tool["input_json"]
    assert read_llm_calls(tmp_path / "missing.jsonl") == [] and summarize_llm_calls([]) == {}


def test_jsonl_lines_split_on_newlines_only(tmp_path):
    """A row whose text holds U+2028 or U+0085 (written raw, as JSON allows) is one row, not two torn ones."""
    from a2rl_bench.jsonl import append_jsonl, read_jsonl, write_jsonl

    rows = [{"q": "one\u2028two\x85three"}, {"q": "four"}]
    write_jsonl(tmp_path / "a.jsonl", rows)
    assert read_jsonl(tmp_path / "a.jsonl") == rows
    append_jsonl(tmp_path / "b.jsonl", rows[0])
    with (tmp_path / "b.jsonl").open("a") as f:
        f.write('{"torn": ')  # a crashed writer's last line
    assert read_jsonl(tmp_path / "b.jsonl", tolerant=True) == rows[:1]
    assert read_jsonl(tmp_path / "missing.jsonl", tolerant=True) == []


def test_a_gpu_shared_with_other_runs_is_recorded_reported_and_stored(tmp_path: Path):
    """Eight runs on one card (the GPU table's way): each sample counts the compute processes outside the agent's
    tree on the GPUs it uses, gradings left out (they are the run's own); median and peak reach the run's
    metrics, its report and the store, so a reader can tell a budget on a shared card from one on its own."""
    from types import SimpleNamespace

    from a2rl_bench.capture.resources import ResourceSample, _gpu_sample
    from a2rl_bench.records import RunConfig
    from a2rl_bench.store.ingest import store_process_report
    from a2rl_bench.store.results import ResultsStore
    from a2rl_bench.summary.process_facts import render_process_markdown, summarize_process

    class Card:  # the NVML calls the sampler makes, answered as a driver does for two cards
        def __init__(self, pids):
            self.pids = pids

        def nvmlDeviceGetCount(self):  # noqa: N802 - NVML's names
            return len(self.pids)

        def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
            return i

        def nvmlDeviceGetUtilizationRates(self, i):  # noqa: N802
            return SimpleNamespace(gpu=90)

        def nvmlDeviceGetMemoryInfo(self, i):  # noqa: N802
            return SimpleNamespace(used=2**30, total=2**37)

        def nvmlDeviceGetComputeRunningProcesses(self, i):  # noqa: N802
            return [SimpleNamespace(pid=p, usedGpuMemory=2**30) for p in self.pids[i]]

    agent = {100, 101}  # the agent's trainer and its rollout worker, both on card 0; card 1 is another job's
    alone, _ = _gpu_sample(Card([[100, 101], [900]]), agent)
    shared, tree_mem = _gpu_sample(Card([[100, 101, *range(200, 207)], [900]]), agent)
    assert [(g.procs, g.agent_procs) for g in shared] == [(9, 2), (1, 0)] and tree_mem == 2 * 2**30
    harness = tmp_path / "harness"
    harness.mkdir()
    def sample(seq: int, gpus, grading: bool = False) -> ResourceSample:
        return ResourceSample(seq=seq, elapsed_s=5 * seq, n_procs=2, cpu_percent=100, rss_bytes=1, gpus=gpus,
                              extra={"grading": grading})  # fmt: skip

    samples = [sample(0, alone), sample(1, shared), sample(2, shared),
               # While the run's own submission is graded its grader shares the card: not counted.
               sample(3, _gpu_sample(Card([[100, 101, *range(200, 215)], [900]]), agent)[0], grading=True),
               # The agent holds no GPU (it is saving): that sample says nothing of sharing.
               sample(4, _gpu_sample(Card([[], [900]]), agent)[0])]  # fmt: skip
    (harness / "resources.jsonl").write_text("".join(s.model_dump_json() + "\n" for s in samples))
    facts = summarize_process("r1", harness, [], RunConfig(), {}, narrative=False)
    assert (facts.metrics.gpu_shared_procs_median, facts.metrics.gpu_shared_procs_peak) == (7, 7)
    assert "| other processes on the agent's GPUs outside gradings (median / peak) | 7 / 7 |" in \
        render_process_markdown(facts)
    store = ResultsStore(tmp_path / "results.duckdb")
    store_process_report(store, facts, harness)
    got = dict(store.query("SELECT name, value FROM metrics WHERE name LIKE 'gpu_shared%'").values.tolist())
    assert got == {"gpu_shared_procs_median": 7, "gpu_shared_procs_peak": 7}
    (harness / "resources.jsonl").write_text(samples[0].model_dump_json() + "\n")
    assert summarize_process("r3", harness, [], RunConfig(), {}, narrative=False).metrics.gpu_shared_procs_peak == 0
