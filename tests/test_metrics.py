"""Post-hoc summary: process metrics on a hand-built ledger, failure classes, route labels, narrative, ingest."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from a2rl_bench.grading.ledger import Ledger
from a2rl_bench.store.ingest import ingest_run_dir, store_process_report
from a2rl_bench.summary.metrics import RunMetrics
from a2rl_bench.summary.process_facts import process_metrics, render_process_markdown, summarize_process
from a2rl_bench.summary.narrative import narrate
from a2rl_bench.summary.route_labels import label_routes
from a2rl_bench.summary.verdicts import explain_failure, failure_class
from a2rl_bench.analysis.run_figure import score_trajectory_png
from a2rl_bench.capture.snapshots import CodeSnapshots
from a2rl_bench.jsonl import append_jsonl
from a2rl_bench.agents.base import LLMCallEvent, ToolCallEvent
from a2rl_bench.records import LedgerEntry, RunConfig
from a2rl_bench.store.results import ResultsStore

RUN = "gsm8k-test-run"
CONFIG = RunConfig(budget_s=100.0, max_submissions=10)
SESSION = {"event": "session-end", "agent_seconds": 90.0, "grading_seconds": 30.0, "ended_by": "exited",
           "exit_code": 0}


def _sub(ledger: Ledger, sid: int, at: float, whash: str, outcome: dict) -> None:
    fields = dict(kind="submission", run_id=RUN, submission_id=sid, model_path=f"output/v{sid}",
                  weights_hash=whash, size_bytes=1000, split="validation", agent_elapsed_s=at)
    ledger.append(**fields, status="queued")
    ledger.append(**fields, **outcome)


def build_ledger(harness: Path, final_score: float = 14.0, anchor=None) -> list[LedgerEntry]:
    """Baseline 10 (val) / 12 (test); submissions: a base copy, an error, 8, 15, and 15 again (cached)."""
    ledger = Ledger(harness / "ledger.jsonl", anchor=anchor)
    for split, score in (("validation", 10.0), ("test", 12.0)):
        ledger.append(kind="baseline", run_id=RUN, split=split, status="scored", score=score, weights_hash="base")
    ledger.append(kind="event", run_id=RUN, detail={"event": "session-start"})
    _sub(ledger, 1, 5.0, "base", {"status": "scored", "score": 10.0, "eval_seconds": 3.0})
    _sub(ledger, 2, 20.0, "h2", {"status": "error", "error": "config.json: not a causal LM", "eval_seconds": 0.5})
    _sub(ledger, 3, 40.0, "h3", {"status": "scored", "score": 8.0, "eval_seconds": 3.0})
    _sub(ledger, 4, 60.0, "h4", {"status": "scored", "score": 15.0, "eval_seconds": 3.0})
    _sub(ledger, 5, 70.0, "h4", {"status": "scored", "score": 15.0, "cached": True, "eval_seconds": 0.0})
    ledger.append(kind="event", run_id=RUN, detail=SESSION)
    ledger.append(kind="final", run_id=RUN, split="test", status="scored", score=final_score, submission_id=4,
                  weights_hash="h4")
    return ledger.entries()


@pytest.fixture
def entries(tmp_path: Path) -> list[LedgerEntry]:
    return build_ledger(tmp_path)


def test_process_metrics_on_a_hand_built_ledger(entries):
    m = process_metrics(entries, CONFIG, SESSION)
    assert (m.n_submissions, m.n_scored, m.n_errors, m.n_cached) == (5, 4, 1, 1)
    assert m.valid_submission_rate == 0.8 and m.nonzero_score_rate == 0.8
    assert m.first_valid_idx == 1 and m.first_valid_delay == 5.0
    assert m.best_feedback == 15.0 and m.best_submission_id == 4  # ties go to the earliest
    assert m.improvement_feedback == 5.0
    assert m.time_to_first_improvement == 60.0 and m.time_to_best == 60.0
    assert m.monotonic_ratio == pytest.approx(1 / 3)  # 10 → 8 → 15 → 15: one rise in three steps
    assert m.copy_model_count == 1 and m.duplicate_submission_count == 1
    assert m.time_used_ratio == 0.9 and m.last_submit_gap == 20.0
    assert m.grading_seconds_share == 0.25 and m.submissions_used_ratio == 0.5
    assert m.eval_seconds_total == 9.5  # cached evaluations cost nothing
    assert m.delta_test == 2.0 and m.selection_gap == 3.0 and m.improved is True
    assert m.score_trajectory == [10.0, None, 8.0, 15.0, 15.0]
    assert m.best_so_far_trajectory == [10.0, 10.0, 10.0, 15.0, 15.0]


def test_process_metrics_without_submissions_or_session_end(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append(kind="baseline", run_id=RUN, split="validation", status="scored", score=10.0)
    m = process_metrics(ledger.entries(), CONFIG, {})
    assert m.n_submissions == 0 and m.valid_submission_rate is None and m.monotonic_ratio is None
    assert m.time_used_ratio is None and m.last_submit_gap is None and m.improved is False


def _metrics(**kw) -> RunMetrics:
    base = dict(n_submissions=3, n_scored=3, baseline_feedback=50.0, best_feedback=50.5, improvement_feedback=0.5,
                delta_test=-0.5, improved=False, copy_model_count=0, submission_ids=[1, 2, 3],
                scored_submission_ids=[1, 2, 3], score_trajectory=[49.0, 50.5, 50.0], feedback_split="validation")
    return RunMetrics(**(base | kw))


@pytest.mark.parametrize(
    ("metrics", "routes", "session", "expected"),
    [
        # improved → none, even if something else looked off
        (_metrics(improved=True, delta_test=3.0), {}, {}, "none"),
        # the agent never started
        (_metrics(n_submissions=0, n_scored=0), {}, {"ended_by": "launch-error", "error": "ENOENT"},
         "infrastructure failure"),
        # the harness crashed mid-session and the session was not resumed
        (_metrics(), {}, {"ended_by": "interrupted", "error": "not resumed"}, "infrastructure failure"),
        # the harness died before the session ended
        (_metrics(), {}, {"run_status": "failed", "run_error": "OSError: disk"}, "infrastructure failure"),
        # every submission failed in the grader, not in the agent's checkpoint
        (_metrics(n_scored=0, scored_submission_ids=[], best_feedback=None), {}, {"ended_by": "exited",
         "submission_errors": ["CUDA out of memory", "interrupted by a grader crash; its snapshot is gone"]},
         "infrastructure failure"),
        # the agent's own checkpoints were broken: its failure, not the harness's
        (_metrics(n_scored=0, scored_submission_ids=[], best_feedback=None), {}, {"ended_by": "exited",
         "submission_errors": ["missing config.json"]}, "early coding failure"),
        (_metrics(n_submissions=0, n_scored=0, scored_submission_ids=[]), {}, {"ended_by": "budget"},
         "early coding failure"),
        # only copies of the base model were scored
        (_metrics(copy_model_count=3), {1: "copy", 2: "copy", 3: "copy"}, {}, "static shortcut"),
        # validation up, hidden test not
        (_metrics(best_feedback=58.0, improvement_feedback=8.0), {1: "SFT"}, {}, "static shortcut"),
        # the best model is far below the base
        (_metrics(best_feedback=20.0, improvement_feedback=-30.0, delta_test=-30.0), {1: "GRPO"}, {},
         "training collapse"),
        # RL submitted, but the policy never moved
        (_metrics(best_feedback=50.0, improvement_feedback=0.0, score_trajectory=[50.0, 50.0, 50.0]),
         {1: "GRPO", 2: "GRPO", 3: "GRPO"}, {}, "rollout construction failure"),
        # trained and scored near the base without improving
        (_metrics(best_feedback=50.0, improvement_feedback=0.0, score_trajectory=[49.0, 49.5, 50.0]),
         {1: "SFT", 2: "SFT+RL"}, {}, "reward/data design failure"),
    ],
)
def test_failure_class_rules(metrics, routes, session, expected):
    verdict = explain_failure(metrics, routes, session)
    assert verdict.label == expected, verdict.reason
    assert failure_class(metrics, routes, session) == expected and verdict.reason


def test_score_trajectory_png_is_a_readable_800x450_image(entries, tmp_path: Path):
    from PIL import Image

    path = score_trajectory_png(entries, tmp_path / "traj.png")
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (800, 450)
    empty = score_trajectory_png(entries[:2], tmp_path / "empty.png")  # baselines only
    with Image.open(empty) as img:
        assert img.size == (800, 450)


def _fake_routes(monkeypatch, labeller):
    module = types.ModuleType("a2rl_bench.grading.route_audit")
    module.route_label = labeller
    monkeypatch.setitem(sys.modules, "a2rl_bench.grading.route_audit", module)


def _snapshot_per_submission(tmp_path: Path) -> CodeSnapshots:
    code = tmp_path / "workspace" / "code"
    code.mkdir(parents=True, exist_ok=True)
    snaps = CodeSnapshots(tmp_path / "harness", code)
    for sid, text in enumerate(["", "SFTTrainer", "SFTTrainer", "GRPOTrainer", "GRPOTrainer"], start=1):
        (code / "train.py").write_text(text)
        snaps.snapshot(f"submission-{sid}")
    return snaps


def test_route_labels_come_from_each_submission_snapshot(entries, tmp_path: Path, monkeypatch):
    snaps = _snapshot_per_submission(tmp_path)
    seen = []

    def labeller(code_dir: Path) -> str:
        seen.append(code_dir)
        text = (code_dir / "train.py").read_text()
        return "GRPO" if "GRPO" in text else "SFT" if "SFT" in text else "none"

    _fake_routes(monkeypatch, labeller)
    labels = label_routes(entries, snaps)
    # #1 has the base model's weights: a copy whatever its code says.
    assert labels.routes == {1: "copy", 2: "SFT", 3: "SFT", 4: "GRPO", 5: "GRPO"}
    assert labels.note is None and len(set(labels.code_shas.values())) == 3
    assert len(seen) == 2  # identical snapshots are labelled once


def test_route_labels_without_the_routes_module_say_why(entries, tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "a2rl_bench.grading.route_audit", None)  # import fails
    labels = label_routes(entries, _snapshot_per_submission(tmp_path))
    assert labels.routes == {1: "copy"} and "a2rl_bench.grading.route_audit" in labels.note


def test_route_labels_with_the_real_static_labeller_and_the_mode_check_view(entries, tmp_path: Path):
    pytest.importorskip("a2rl_bench.grading.route_audit")
    code = tmp_path / "workspace" / "code"
    code.mkdir(parents=True)
    snaps = CodeSnapshots(tmp_path / "harness", code)
    sft = "from trl import SFTTrainer\nSFTTrainer(model=m).train()\n"
    grpo = "from trl import GRPOConfig, GRPOTrainer\nGRPOTrainer(model=m, args=GRPOConfig()).train()\n"
    for sid, text in enumerate(["", sft, sft, grpo, grpo], start=1):
        (code / "train.py").write_text(text)
        snaps.snapshot(f"submission-{sid}")
    labels = label_routes(entries, snaps)
    assert labels.routes == {1: "copy", 2: "SFT", 3: "SFT", 4: "GRPO", 5: "GRPO"}
    # In an sft-only run the GRPO submissions break the mode.
    store = ResultsStore(tmp_path / "results.duckdb")
    store.start_run(RUN, CONFIG.model_copy(update={"mode": "sft-only"}), None, "offline")
    for e in entries:
        if e.kind == "submission":
            store.record_submission(RUN, e)
    store.record_routes(RUN, labels.routes, labels.code_shas)
    violations = store.query("SELECT submission_id, route FROM mode_violations ORDER BY 1")
    assert violations.values.tolist() == [[4, "GRPO"], [5, "GRPO"]]


def test_summarize_process_writes_files_and_a_markdown_section(entries, tmp_path: Path, monkeypatch):
    monkeypatch.delenv("A2RL_NARRATIVE_MODEL", raising=False)
    harness = tmp_path / "harness"
    report = summarize_process(RUN, harness, entries, CONFIG, SESSION, snapshots=None, run_status="completed")
    assert report.failure_class == "none" and report.narrative is None
    assert json.loads((harness / "process.json").read_text())["failure_class"] == "none"
    assert not (harness / "narrative.md").exists()
    assert not (harness / "score_trajectory.png").exists()  # the flow's summary step draws it (layers)
    md = render_process_markdown(report)
    assert "| valid submission rate (scored / submitted) | 0.80 |" in md and "**none**" in md


def test_narrative_is_off_unless_a_model_is_configured(monkeypatch):
    monkeypatch.delenv("A2RL_NARRATIVE_MODEL", raising=False)
    assert narrate({"x": 1}, client=object()) is None  # never touches the client


def test_narrative_through_the_anthropic_sdk_on_the_loopback_server(entries, tmp_path: Path, monkeypatch):
    import anthropic

    from tests.anthropic_loopback import AnthropicLoopback

    monkeypatch.setenv("A2RL_NARRATIVE_MODEL", "claude-test")
    story = "The agent trained with SFT and improved the hidden test score by 2 points."
    with AnthropicLoopback(script=[story]) as server:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="test-key", max_retries=0)
        report = summarize_process(RUN, tmp_path / "harness", entries, CONFIG, SESSION, narrative_client=client)
    assert report.narrative == story and report.narrative_model == "claude-test"
    assert "LLM-written" in (tmp_path / "harness" / "narrative.md").read_text()
    assert report.failure_class == "none"  # the facts are computed before, and apart from, the narrative
    (request,) = server.requests
    assert request.body["model"] == "claude-test" and '"failure_class": "none"' in request.prompt
    assert "do not invent" in request.body["system"]


def test_a_failing_narrative_call_leaves_the_facts_standing(entries, tmp_path: Path, monkeypatch):
    import anthropic

    from tests.anthropic_loopback import AnthropicLoopback

    monkeypatch.setenv("A2RL_NARRATIVE_MODEL", "claude-test")
    with AnthropicLoopback() as server:
        server.fail_next(529, times=1)
        client = anthropic.Anthropic(base_url=server.base_url, api_key="test-key", max_retries=0)
        report = summarize_process(RUN, tmp_path / "harness", entries, CONFIG, SESSION, narrative_client=client)
    assert report.narrative_model == "deterministic (no LLM)" and report.failure_class == "none"
    assert "OverloadedError" in report.narrative_note
    assert "written from the facts, no LLM" in (tmp_path / "harness" / "narrative.md").read_text()


def _run_dir(tmp_path: Path, store: ResultsStore) -> Path:
    run_dir = tmp_path / RUN
    harness = run_dir / "harness"
    harness.mkdir(parents=True)
    build_ledger(harness, anchor=store.ledger_anchor(RUN))  # as the harness writes it: every head anchored
    (harness / "manifest.json").write_text(json.dumps({"run_id": RUN, "config": CONFIG.model_dump(mode="json")}))
    snaps = CodeSnapshots(harness, run_dir / "workspace" / "code")
    for sid in range(1, 6):
        snaps.snapshot(f"submission-{sid}")
    for i in range(3):
        append_jsonl(harness / "llm_calls.jsonl", LLMCallEvent(call=i + 1, model="m", input_tokens=100 * (i + 1)))
    append_jsonl(harness / "tool_calls.jsonl", ToolCallEvent(call=1, tool="bash", input={"cmd": "python train.py"}))
    _write_eval(harness, "baseline-0-test", [False] * 8)
    _write_eval(harness, "final-4-test", [True] * 8)
    (harness / "evaluations" / "not-an-eval.json").write_text("{")  # skipped with a warning, nothing else lost
    (harness / "leak_audit.json").write_text(json.dumps({"leaked_items": 2}))
    (harness / "resources.jsonl").write_text(
        '{"seq": 0, "at": "2026-01-01T00:00:00Z", "elapsed_s": 0.0, "n_procs": 2, "cpu_percent": 150.0, '
        '"rss_bytes": 1000000, "workspace_bytes": 5000}\n'
    )
    return run_dir


def _dump(store: ResultsStore) -> dict:
    tables = ["runs", "submissions", "evaluations", "item_results", "events", "metrics", "llm_calls", "tool_calls",
              "resources"]
    return {t: store.query(f"SELECT * FROM {t} ORDER BY ALL").to_json(orient="records", date_format="iso")
            for t in tables}


def test_reingesting_a_run_changes_nothing(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "a2rl_bench.grading.route_audit", None)
    store = ResultsStore(tmp_path / "results.duckdb")
    run_dir = _run_dir(tmp_path, store)
    first = ingest_run_dir(store, run_dir)
    before = _dump(store)
    ingest_run_dir(store, run_dir)
    assert _dump(store) == before
    assert first.failure_class == "none"
    run = store.get_run(RUN)
    assert run["delta_test"] == 2.0 and run["failure_class"] == "none" and run["status"] == "completed"
    counts = {t: len(json.loads(rows)) for t, rows in before.items()}
    assert counts["submissions"] == 5 and counts["evaluations"] == 2 + 4 + 1 and counts["llm_calls"] == 3
    assert counts["tool_calls"] == 1 and counts["resources"] == 1
    assert store.query("SELECT count(*) AS n FROM submissions WHERE code_sha IS NOT NULL")["n"][0] == 5
    m = store.query("SELECT name, value, text FROM metrics WHERE run_id = ?", [RUN]).set_index("name")
    assert m.loc["valid_submission_rate", "value"] == 0.8 and m.loc["failure_class", "text"] == "none"
    assert json.loads(m.loc["score_trajectory", "text"]) == [10.0, None, 8.0, 15.0, 15.0]
    assert m.loc["leaked_items", "value"] == 2  # the leak audit's count survives re-ingesting
    assert counts["item_results"] == 16
    assert store.query("SELECT count(*) AS n FROM item_pairs")["n"][0] == 8


def test_store_process_report_is_idempotent_next_to_live_writes(entries, tmp_path: Path):
    store = ResultsStore(tmp_path / "results.duckdb")
    harness = tmp_path / "harness"
    harness.mkdir()
    append_jsonl(harness / "llm_calls.jsonl", LLMCallEvent(call=1, model="m", input_tokens=5))
    store.start_run(RUN, CONFIG, harness, "offline")
    for e in entries:
        if e.kind == "submission":
            store.record_submission(RUN, e)
    report = summarize_process(RUN, harness, entries, CONFIG, SESSION, write_files=False, narrative=False)
    report.routes = {4: "SFT"}
    for _ in range(2):
        store_process_report(store, report, harness)
    assert store.get_run(RUN)["failure_class"] == "none"
    assert store.query("SELECT count(*) AS n FROM llm_calls")["n"][0] == 1
    assert store.query("SELECT route FROM submissions WHERE submission_id = 4")["route"][0] == "SFT"
    n_metrics = store.query("SELECT count(*) AS n FROM metrics")["n"][0]
    assert n_metrics == len(report.metrics.model_dump()) + 1  # + failure_reason


def _write_eval(harness: Path, key: str, correct: list[bool]) -> None:
    from a2rl_bench.records import EvalResult, ItemResult

    items = [ItemResult(item_id=f"q{i}", completion="", prediction=None, target="", correct=c)
             for i, c in enumerate(correct)]
    split = key.rsplit("-", 1)[1]
    result = EvalResult(task="gsm8k", split=split, score=100 * sum(correct) / len(correct), n=len(correct),
                        n_correct=sum(correct), evaluator_id="e", items=items)
    (harness / "evaluations").mkdir(parents=True, exist_ok=True)
    (harness / "evaluations" / f"{key}.json").write_text(result.model_dump_json())


def test_one_item_of_32_is_no_significant_change_and_no_static_shortcut(tmp_path: Path, monkeypatch):
    """1/32 vs 0/32 on test and a one-item validation gain: neither `improved` nor `static shortcut`."""
    monkeypatch.delenv("A2RL_NARRATIVE_MODEL", raising=False)
    harness = tmp_path / "harness"
    ledger = Ledger(harness / "ledger.jsonl")
    for split, score in (("validation", 0.0), ("test", 0.0)):
        ledger.append(kind="baseline", run_id=RUN, split=split, status="scored", score=score, weights_hash="base")
    _sub(ledger, 1, 5.0, "h1", {"status": "scored", "score": 100 / 32, "eval_seconds": 3.0})
    ledger.append(kind="event", run_id=RUN, detail=SESSION)
    ledger.append(kind="final", run_id=RUN, split="test", status="scored", score=100 / 32, submission_id=1)
    _write_eval(harness, "baseline-0-test", [False] * 32)
    _write_eval(harness, "baseline-0-validation", [False] * 32)
    _write_eval(harness, "final-1-test", [True] + [False] * 31)
    _write_eval(harness, "submission-1-validation", [True] + [False] * 31)
    report = summarize_process(RUN, harness, ledger.entries(), CONFIG, SESSION, write_files=False, narrative=False)
    m = report.metrics
    assert m.delta_test == pytest.approx(3.125) and m.delta_test_ci_low < 0 < m.delta_test_ci_high
    assert m.delta_test_p_value == 1.0 and m.delta_test_n_items == 32
    assert m.verdict == "no significant change" and m.improved is False
    assert report.failure_class not in ("none", "static shortcut")
    # 12 of 32 gained, none lost: significant.
    _write_eval(harness, "final-1-test", [True] * 12 + [False] * 20)
    report = summarize_process(RUN, harness, ledger.entries(), CONFIG, SESSION, write_files=False, narrative=False)
    assert report.metrics.verdict == "improved" and report.failure_class == "none"
    assert "95%" in report.failure_reason


def test_a_narrative_model_without_a_key_gives_the_deterministic_narrative_and_a_note(entries, tmp_path, monkeypatch):
    monkeypatch.setenv("A2RL_NARRATIVE_MODEL", "claude-test")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    report = summarize_process(RUN, tmp_path / "harness", entries, CONFIG, SESSION)
    assert report.narrative_model == "deterministic (no LLM)" and "submission" in report.narrative
    assert "unavailable" in report.narrative_note and report.failure_class == "none"
    assert "no LLM" in (tmp_path / "harness" / "narrative.md").read_text()
    assert "## Narrative" in render_process_markdown(report)


def test_the_metrics_are_typed_and_only_what_a_run_measured_is_written(entries, tmp_path: Path, monkeypatch):
    """`RunMetrics`: a misspelt or mistyped metric is an error; a group that does not apply (no resource samples,
    no RL stage) is absent from process.json and the store, and process.json reads back into the same model."""
    monkeypatch.delenv("A2RL_NARRATIVE_MODEL", raising=False)
    with pytest.raises(ValueError):
        RunMetrics(n_submisions=3)
    with pytest.raises(ValueError):
        RunMetrics().add({"n_scored": "many"})
    harness = tmp_path / "harness"
    report = summarize_process(RUN, harness, entries, CONFIG, SESSION, narrative=False)
    written = json.loads((harness / "process.json").read_text())["metrics"]
    assert "rss_peak_bytes" not in written and "rl_share" not in written and "llm_requests" not in written
    assert written["n_submissions"] == 5 and written["failure_class"] == report.failure_class
    assert list(written) == list(report.metrics.model_dump())
    assert RunMetrics.model_validate(written) == report.metrics
