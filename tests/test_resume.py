"""A retried run resumes: the agent session continues with what remains of its budget, once."""

from __future__ import annotations

import json
import time

import pytest

from a2rl_bench.grading.ledger import Ledger, read_ledger
from a2rl_bench.records import RunConfig


@pytest.fixture
def crashed_run(prefect_harness, tiny_model_dir, tmp_path, monkeypatch):
    """A run whose agent session started, spent 25 of its 30 s, and then the harness died."""
    from a2rl_bench.flows.benchmark_run import provision_workspace
    from a2rl_bench.tasks.run_steps import open_run

    monkeypatch.setenv("A2RL_SFT_MAX_STEPS", "2")
    monkeypatch.setenv("A2RL_SFT_MAX_LENGTH", "512")
    monkeypatch.setenv("A2RL_SFT_TRAIN_S", "2")
    config = RunConfig(base_model=str(tiny_model_dir), budget_s=30, val_limit=2, test_limit=2)
    ctx = open_run.fn(config, tmp_path / "results.duckdb", tmp_path / "runs")
    base_model_dir = provision_workspace(ctx)
    Ledger(ctx.paths.harness_dir / "ledger.jsonl").append(
        run_id=ctx.run_id, kind="event", detail={"event": "session-start", "budget_s": 30}
    )
    (ctx.paths.harness_dir / "clock.json").write_text(json.dumps({"elapsed_s": 25.0}))
    return ctx, base_model_dir


def test_interrupted_session_continues_with_the_remaining_budget(crashed_run):
    from a2rl_bench.flows.benchmark_run import agent_session

    ctx, base_model_dir = crashed_run
    t = time.monotonic()
    outcome = agent_session(ctx, {}, base_model_dir, grace_s=3)
    assert outcome.ended_by in ("exited", "budget")
    assert 25.0 <= outcome.agent_seconds <= 30.0 + 3 + 2  # only the 5 s left, plus grace and polling slack
    events = [e.detail.get("event") for e in read_ledger(ctx.paths.harness_dir / "ledger.jsonl") if e.kind == "event"]
    assert events.count("session-resumed") == 1 and events.count("session-end") == 1

    # Retried again after the session ended: the session is not run a second time.
    t = time.monotonic()
    again = agent_session(ctx, {}, base_model_dir, grace_s=3)
    assert time.monotonic() - t < 10
    assert again.agent_seconds == outcome.agent_seconds
    events = [e.detail.get("event") for e in read_ledger(ctx.paths.harness_dir / "ledger.jsonl") if e.kind == "event"]
    assert events.count("session-end") == 1


def test_interrupted_session_can_be_recorded_as_interrupted(crashed_run):
    from a2rl_bench.flows.benchmark_run import agent_session

    ctx, base_model_dir = crashed_run
    outcome = agent_session(ctx, {}, base_model_dir, on_resume="interrupted")
    assert outcome.ended_by == "interrupted" and outcome.agent_seconds == 25.0
    assert not (ctx.paths.workspace / "output" / "v1").exists()  # the agent was not started again
