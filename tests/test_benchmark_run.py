"""End to end: the `benchmark-run` flow on the tiny model, a small split and a short budget."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from a2rl_bench.grading.ledger import read_ledger
from a2rl_bench.records import RunConfig
from a2rl_bench.run_options import RunOptions


@pytest.fixture
def small_agent(monkeypatch):
    # Shrink the reference agent's training to a few steps on the tiny model.
    monkeypatch.setenv("A2RL_SFT_MAX_STEPS", "4")
    monkeypatch.setenv("A2RL_SFT_BATCH_SIZE", "4")
    monkeypatch.setenv("A2RL_SFT_MAX_LENGTH", "512")
    monkeypatch.setenv("A2RL_SFT_TRAIN_S", "5")
    monkeypatch.setenv("A2RL_SFT_LR", "5e-3")


def test_benchmark_run_end_to_end(prefect_harness, tiny_model_dir, tmp_path, small_agent):
    from a2rl_bench.flows.benchmark_run import benchmark_run

    results = tmp_path / "results.duckdb"
    config = RunConfig(base_model=str(tiny_model_dir), budget_s=45, val_limit=4, test_limit=6)
    options = RunOptions(results=results, grace_s=5)
    summary = benchmark_run(config, options)

    assert summary.status == "completed", summary.error
    assert summary.n_submissions >= 1 and summary.n_scored >= 1
    assert summary.baseline_val is not None and summary.baseline_test is not None
    assert summary.best_val is not None and summary.final_test is not None
    assert summary.delta_test == pytest.approx(summary.final_test - summary.baseline_test)
    assert summary.agent_seconds <= 45 + 5 + 2  # budget + grace + polling slack
    assert summary.agent_seconds <= 45 and summary.grace_seconds <= 5 + 2  # the budget holds; the grace apart
    assert summary.attempts == 1 and summary.wall_seconds == pytest.approx(sum(summary.phase_seconds.values()), abs=0.01)

    harness = tmp_path / "runs" / summary.run_id / "harness"
    workspace = tmp_path / "runs" / summary.run_id / "workspace"
    # The ledger verifies and holds baseline, submissions and one final evaluation.
    entries = read_ledger(harness / "ledger.jsonl")
    kinds = [e.kind for e in entries]
    assert kinds.count("baseline") == 2 and kinds.count("final") == 1 and "submission" in kinds
    # The agent wrote its code and checkpoints in the workspace; nothing hidden is there.
    assert (workspace / "code" / "train_sft.py").exists() and (workspace / "output" / "v1" / "config.json").exists()
    assert not any(p.name in ("validation.jsonl", "test.jsonl", "ledger.jsonl") for p in workspace.rglob("*"))
    # The report carries the same numbers.
    report = json.loads((harness / "report.json").read_text())
    assert report["summary"]["final_test"] == summary.final_test
    assert "re-split offline" in (harness / "report.md").read_text()
    assert (harness / "process.json").is_file() and (harness / "score_trajectory.png").is_file()  # the summary step
    assert "## Attempts" in (harness / "report.md").read_text()

    with duckdb.connect(str(results), read_only=True) as con:
        row = con.execute(
            "SELECT status, baseline_val, best_val, final_test, n_submissions FROM runs WHERE run_id = ?",
            [summary.run_id],
        ).fetchone()
        n_subs = con.execute("SELECT count(*) FROM submissions WHERE run_id = ?", [summary.run_id]).fetchone()[0]
        n_evals = con.execute("SELECT count(*) FROM evaluations WHERE run_id = ?", [summary.run_id]).fetchone()[0]
    assert row == ("completed", summary.baseline_val, summary.best_val, summary.final_test, summary.n_submissions)
    assert n_subs == summary.n_submissions
    assert n_evals == 2 + summary.n_scored + 1  # baselines + scored submissions + final

    # A second run appends a second row and leaves the first intact; its baseline comes from the cache.
    second = benchmark_run(config.model_copy(update={"budget_s": 15, "seed": 1}), options)
    with duckdb.connect(str(results), read_only=True) as con:
        rows = con.execute("SELECT run_id, final_test FROM runs ORDER BY started_at").fetchall()
    assert [r[0] for r in rows] == [summary.run_id, second.run_id]
    assert rows[0][1] == summary.final_test
    second_baseline = [e for e in read_ledger(tmp_path / "runs" / second.run_id / "harness" / "ledger.jsonl")
                       if e.kind == "baseline"]
    assert all(e.cached for e in second_baseline)


def test_a_failing_run_is_recorded_as_failed(prefect_harness, tiny_model_dir, tmp_path):
    """A run that breaks mid-way still leaves its row, with the error, and a report."""
    from a2rl_bench.tasks.preflight import PreflightError
    from a2rl_bench.flows.benchmark_run import benchmark_run

    results = tmp_path / "results.duckdb"
    with pytest.raises(PreflightError, match="unknown agent"):
        benchmark_run(RunConfig(agent="no-such-agent", base_model=str(tiny_model_dir), val_limit=2, test_limit=2),
                      RunOptions(results=results))
    with duckdb.connect(str(results), read_only=True) as con:
        status, error, harness = con.execute("SELECT status, error, harness_dir FROM runs").fetchone()
    assert status == "failed" and "unknown agent" in error
    assert "unknown agent" in (Path(harness) / "report.md").read_text()


def test_ctrl_c_on_the_cli_records_the_run_as_interrupted_without_a_traceback(tiny_model_dir, tmp_path):
    """What a user gets from Ctrl-C in `a2rl run`: one line saying where the interrupted run is recorded."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from a2rl_bench.ops.load import describe_load, scaled_timeout

    results = tmp_path / "results.duckdb"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "A2RL_SFT_TRAIN_S": "30"}
    env.pop("PREFECT_API_URL", None)  # its own ephemeral server, as a user's first run has
    cmd = [sys.executable, "-m", "a2rl_bench.cli", "run", "--base-model", str(tiny_model_dir), "--budget", "120",
           "--val-limit", "2", "--test-limit", "2", "--results", str(results), "--sandbox", "off"]  # fmt: skip
    # Output to files, not pipes: nothing can block on a full pipe while the test waits.
    with (tmp_path / "out.log").open("w") as out_f, (tmp_path / "err.log").open("w") as err_f:
        # As from a terminal: SIGINT at its default even where the test runner inherited it ignored (a
        # background job of a non-interactive shell does; Python then installs no KeyboardInterrupt handler).
        proc = subprocess.Popen(cmd, env=env, stdout=out_f, stderr=err_f, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    # Interrupt during the agent session: wait for it to start (its own server, the baseline), however long a
    # loaded machine takes; the run's own exit or a start-up far past any load ends the wait with its output.
    started_by = time.monotonic() + scaled_timeout(300)
    while not list((tmp_path / "runs").glob("*/harness/agent.log")):
        if proc.poll() is not None or time.monotonic() > started_by:
            proc.kill()
            pytest.fail(f"the agent session never started ({describe_load()}):\n"
                        + (tmp_path / "err.log").read_text()[-3000:])  # fmt: skip
        time.sleep(0.5)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=scaled_timeout(240))
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"a2rl run did not stop after Ctrl-C ({describe_load()}):\n"
                    + (tmp_path / "err.log").read_text()[-3000:])  # fmt: skip
    err = (tmp_path / "err.log").read_text()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    with duckdb.connect(str(results), read_only=True) as db:
        status, wall, phases = db.execute("SELECT status, wall_seconds, phase_seconds_json FROM runs").fetchone()
    assert status == "interrupted"
    assert wall >= 2 and "agent_session" in json.loads(phases)  # the interrupted phase counts up to the stop


def test_alpacaeval_run_end_to_end_with_a_judge_endpoint(prefect_harness, tiny_model_dir, tmp_path, small_agent,
                                                         monkeypatch):  # fmt: skip
    """`a2rl run --task alpacaeval` with a judge configured: the real anthropic SDK judges every evaluation
    (baseline, submissions, final) over HTTP, here against a loopback Messages API that prefers the longer
    answer."""
    import re

    from a2rl_bench.flows.benchmark_run import benchmark_run
    from tests.anthropic_loopback import AnthropicLoopback

    def prefers_longer(request) -> str:
        a = re.search(r"<response_A>\n(.*?)\n</response_A>", request.prompt, re.DOTALL)
        b = re.search(r"<response_B>\n(.*?)\n</response_B>", request.prompt, re.DOTALL)
        if a is None or b is None:  # a reference answer being written
            return "A reference answer."
        return "[[A]]" if len(a.group(1)) >= len(b.group(1)) else "[[B]]"

    with AnthropicLoopback(responder=prefers_longer) as judge:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("A2RL_JUDGE_BASE_URL", judge.base_url)
        monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))  # empty judge and evaluation caches
        results = tmp_path / "results.duckdb"
        # One submission is judged as the baseline and the final pick are; the session's further rounds would only
        # add judged evaluations that nothing here counts.
        summary = benchmark_run(RunConfig(task="alpacaeval", base_model=str(tiny_model_dir), budget_s=45,
                                          val_limit=2, test_limit=3, max_submissions=1),
                                RunOptions(results=results, grace_s=5))  # fmt: skip
        judged = [r for r in judge.requests if "<response_A>" in r.prompt]

    assert summary.status == "completed", summary.error
    assert summary.baseline_val is not None and summary.final_test is not None
    assert judged and all(r.body["model"] == "claude-sonnet-4-5" for r in judged)
    assert len(judged) >= 2 * (2 + 3)  # both orders for every baseline item at least
    with duckdb.connect(str(results), read_only=True) as db:
        rows = db.execute("SELECT kind, split, score FROM evaluations").fetchall()
    assert {(kind, split) for kind, split, _ in rows} >= {("baseline", "validation"), ("baseline", "test")}
    assert all(0.0 <= score <= 100.0 for *_, score in rows)
    # Per-item outputs and the split-level judge figures stay in the harness dir, outside the workspace.
    for path in (tmp_path / "runs" / summary.run_id / "harness" / "evaluations").glob("*.json"):
        assert {"win_rate", "lc_win_rate", "n_no_verdict"} <= json.loads(path.read_text())["detail"].keys()


def test_every_submission_on_the_hidden_test_after_the_session(prefect_harness, tiny_model_dir, tmp_path,
                                                               monkeypatch):  # fmt: skip
    """`test_every_submission`: after the session each scored submission is also evaluated on the hidden test,
    recorded apart (ledger kind `posthoc`, evaluations of kind `posthoc`) and grouped by the agent's stage label
    (SFT, then GRPO here); the final pick and Δ are those of the ordinary run, and nothing of it happened while
    the agent could ask."""
    from a2rl_bench.flows.benchmark_run import benchmark_run

    knobs = {"A2RL_SFT_MAX_STEPS": "2", "A2RL_SFT_BATCH_SIZE": "2", "A2RL_SFT_LR": "1e-3", "A2RL_SFT_ROUND_S": "12",
             "A2RL_SFT_MAX_LENGTH": "4096", "A2RL_SFT_MAX_ROUNDS": "1", "A2RL_GRPO_MAX_STEPS": "1",
             "A2RL_GRPO_GOALS_PER_STEP": "2", "A2RL_GRPO_NUM_GENERATIONS": "2", "A2RL_GRPO_MAX_EPISODE_STEPS": "2",
             "A2RL_GRPO_ROUND_S": "12"}  # fmt: skip
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    results = tmp_path / "results.duckdb"
    summary = benchmark_run(RunConfig(task="alfworld", agent="reference-sft-grpo", base_model=str(tiny_model_dir),
                                      budget_s=90, val_limit=2, test_limit=3, max_submissions=2,
                                      test_every_submission=True), RunOptions(results=results, grace_s=5))
    assert summary.status == "completed", summary.error
    harness = tmp_path / "runs" / summary.run_id / "harness"
    entries = read_ledger(harness / "ledger.jsonl")
    subs = {e.submission_id: e for e in entries if e.kind == "submission" and e.status == "scored"}
    assert [subs[k].detail.get("stage") for k in sorted(subs)] == ["SFT", "GRPO"]
    posthoc = [e for e in entries if e.kind == "posthoc"]
    assert sorted(e.submission_id for e in posthoc) == sorted(subs) and all(e.split == "test" for e in posthoc)
    session_end = next(e.seq for e in entries if e.kind == "event" and e.detail.get("event") == "session-end")
    assert all(e.seq > session_end for e in posthoc)  # after the agent's session: never seen by the agent
    final = next(e for e in entries if e.kind == "final")
    assert next(e.score for e in posthoc if e.submission_id == final.submission_id) == final.score
    assert summary.final_test == final.score  # the headline is the ordinary final pick's
    with duckdb.connect(str(results), read_only=True) as con:
        rows = con.execute("SELECT submission_id, stage, test_score, is_final_pick FROM submission_tests "
                           "WHERE run_id = ? ORDER BY submission_id", [summary.run_id]).fetchall()  # fmt: skip
        share = con.execute("SELECT value FROM metrics WHERE run_id = ? AND name = 'rl_share'",
                            [summary.run_id]).fetchone()  # fmt: skip
    assert [(r[0], r[1]) for r in rows] == [(1, "SFT"), (2, "GRPO")] and all(r[2] is not None for r in rows)
    assert [r[3] for r in rows] == [k == final.submission_id for k in (1, 2)]
    assert share is not None and share[0] == pytest.approx(rows[1][2] - rows[0][2])
    report = (harness / "report.md").read_text()
    assert "Every submission on the hidden test (analysis only)" in report and "RL's share" in report
    stage_share = json.loads((harness / "report.json").read_text())["stage_share"]
    # the GRPO submission named SFT's as its parent: RL's share is taken from there, and says so
    assert stage_share["rl_submission"] == 2 and stage_share["sft_submission"] == 1 and subs[2].detail["parent"] == 1
    assert "the SFT submission the first RL one names as its parent" in report
    # The analysis: the paper tables' RL section and the drill-down's post-hoc scores.
    from a2rl_bench.flows.analysis_flow import run_analysis

    with duckdb.connect(str(results), read_only=True) as con:
        shares = con.execute("SELECT run_id, rl_share, n_items, sft_start FROM stage_shares").fetchall()
    assert shares == [(summary.run_id, pytest.approx(share[0]), 3, "declared")]
    run_analysis(results, tmp_path / "analysis")
    html = (tmp_path / "analysis" / "report.html").read_text()
    assert "What RL added (hidden test, post hoc)" in html and "hidden_test_posthoc" in html


def test_a_run_reads_whether_it_is_a_deployments_from_its_flow_run(prefect_harness, monkeypatch):
    """`deployed_run` answers from the flow run the engine holds, as Prefect's `deployment.get_id()` answers with an
    API call."""
    from types import SimpleNamespace
    from uuid import uuid4

    from prefect import flow
    from prefect.runtime import deployment

    from a2rl_bench.flows import benchmark_run as module

    @flow
    def probe() -> tuple[bool, str | None]:
        return module.deployed_run(), deployment.get_id()

    assert probe() == (False, None)
    assert module.deployed_run() is False  # outside a flow run
    fake = SimpleNamespace(flow_run=SimpleNamespace(deployment_id=uuid4()))
    monkeypatch.setattr(module.FlowRunContext, "get", lambda: fake)
    assert module.deployed_run() is True
