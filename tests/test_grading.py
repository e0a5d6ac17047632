"""The grading service: ledger integrity, the budget clock, checkpoint checks and the HTTP API's auth."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest

from a2rl_bench.inference.evaluation import EvalSpec
from a2rl_bench.grading.ledger import LedgerHead, read_ledger
from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService, Ledger, LedgerCorrupted
from a2rl_bench.grading.checkpoint import SubmissionRejected, check_directory, resolve_in_workspace
from a2rl_bench.records import EvalResult, RunConfig


# -- ledger ------------------------------------------------------------------------------------
def test_ledger_is_hash_chained_and_survives_reopen(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    for i in range(3):
        ledger.append(run_id="r", kind="submission", submission_id=i + 1, status="scored", score=float(i))
    reopened = Ledger(path)
    assert [e.score for e in reopened.entries()] == [0.0, 1.0, 2.0]
    assert reopened.entries()[1].prev_hash and reopened.verify() == 3
    reopened.append(run_id="r", kind="event", detail={"event": "x"})
    assert Ledger(path).verify() == 4


def test_ledger_detects_an_edited_score(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append(run_id="r", kind="submission", submission_id=1, status="scored", score=10.0)
    ledger.append(run_id="r", kind="submission", submission_id=2, status="scored", score=20.0)
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["score"] = 99.0
    path.write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    with pytest.raises(LedgerCorrupted, match="hash chain broken"):
        Ledger(path)


def test_ledger_detects_a_deleted_entry(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    for i in range(3):
        ledger.append(run_id="r", kind="event", detail={"i": i})
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[2]]) + "\n")
    with pytest.raises(LedgerCorrupted):
        Ledger(path)


def test_a_torn_last_line_is_reported_not_dropped_and_readers_never_rewrite(tmp_path):
    path = tmp_path / "ledger.jsonl"
    Ledger(path).append(run_id="r", kind="event", detail={"ok": True})
    with path.open("a") as f:
        f.write('{"seq": 1, "kind": "subm')  # the process died mid-write
    before = path.read_bytes()
    ledger = Ledger(path)
    assert len(ledger.entries()) == 1 and str(ledger.torn_tail) == "torn tail: 24 bytes after entry 1"
    assert read_ledger(path) and path.read_bytes() == before  # reading changes nothing
    ledger.append(run_id="r", kind="event", detail={"after": "restart"})  # the writer sets it aside, on record
    entries = Ledger(path).entries()
    assert [e.detail.get("event") for e in entries] == [None, "torn-tail", None]
    assert entries[1].detail["bytes"] == 24 and (tmp_path / "ledger.jsonl.torn-1").read_bytes() == before[-24:]


def _anchored(tmp_path, n: int = 3):
    path, heads = tmp_path / "ledger.jsonl", []
    ledger = Ledger(path, anchor=lambda entry, line_hash: heads.append(LedgerHead(entry.seq + 1, line_hash)))
    for i in range(n):
        ledger.append(run_id="r", kind="final" if i == n - 1 else "event", score=3.125 if i == n - 1 else None)
    assert heads[-1] == ledger.head()
    return path, heads[-1]


def test_an_edited_last_entry_is_caught_by_the_anchored_head(tmp_path):
    path, head = _anchored(tmp_path)
    path.write_text(path.read_text().replace('"score":3.125', '"score":93.125'))
    assert Ledger(path).verify() == 3  # the chain alone cannot see its own end
    with pytest.raises(LedgerCorrupted, match="last entry .* was edited"):
        read_ledger(path, {"the results store": head})


def test_a_truncated_ledger_is_caught_by_the_anchored_head(tmp_path):
    path, head = _anchored(tmp_path)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(LedgerCorrupted, match="cut off its end"):
        read_ledger(path, {"the report": head})
    assert read_ledger(path, {"the report": None})  # nothing recorded: nothing to compare


# -- budget clock ------------------------------------------------------------------------------
def test_budget_clock_does_not_charge_paused_time():
    clock = BudgetClock(10.0)
    clock.start()
    time.sleep(0.1)
    clock.pause()
    time.sleep(0.3)
    clock.resume()
    assert 0.09 <= clock.elapsed() < 0.25
    assert clock.paused_seconds() >= 0.3
    assert clock.remaining() > 9.7


# -- checkpoint checks -------------------------------------------------------------------------
def test_paths_outside_the_workspace_are_refused(tmp_path):
    ws = tmp_path / "ws"
    (ws / "output" / "v1").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.mkdir()
    (ws / "output" / "link").symlink_to(outside)
    assert resolve_in_workspace(ws, "output/v1") == (ws / "output" / "v1").resolve()
    for bad in ("../secret", str(outside), "output/link", "output/../../secret"):
        with pytest.raises(SubmissionRejected, match="outside the workspace"):
            resolve_in_workspace(ws, bad)
    with pytest.raises(SubmissionRejected) as missing:
        resolve_in_workspace(ws, "output/v9")
    assert missing.value.status_code == 404


def test_unmerged_lora_adapter_is_refused_with_a_merge_hint(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"x")
    with pytest.raises(SubmissionRejected, match="merge"):
        check_directory(tmp_path)


def test_incomplete_checkpoints_are_refused(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, ckpt)
    assert check_directory(ckpt)["size_bytes"] > 0
    (ckpt / "tokenizer.json").unlink()  # grading uses the base model's tokenizer: not needed
    assert check_directory(ckpt)["size_bytes"] > 0
    (ckpt / "config.json").unlink()
    with pytest.raises(SubmissionRejected, match="config.json"):
        check_directory(ckpt)


# -- HTTP API ----------------------------------------------------------------------------------
def _constant_evaluator(score: float):
    """Stands in for model inference where a test is about the API, not about evaluation."""

    def evaluate(model_dir: Path, weights_hash: str, spec: EvalSpec, device=None) -> EvalResult:
        return EvalResult(task=spec.task, split=spec.split, score=score, n=4, n_correct=int(score / 25),
                          evaluator_id="constant", weights_hash=weights_hash)

    return evaluate


@pytest.fixture
def service(tmp_path, tiny_model_dir):
    ws = tmp_path / "ws"
    shutil.copytree(tiny_model_dir, ws / "output" / "v1")
    config = RunConfig(max_submissions=2)
    ctx = GradingContext("run-1", config, ws, tmp_path / "harness", baseline={"validation": 25.0})
    svc = GradingService(ctx, BudgetClock(60), evaluate=_constant_evaluator(50.0))
    yield svc
    svc.close(drain_timeout_s=5)


def test_api_refuses_missing_and_wrong_tokens(service):
    with GradingServer(service, token="right-token") as server:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": "Basic right-token"}):
            r = httpx.post(f"{server.url}/submit", json={"model_path": "output/v1"}, headers=headers)
            assert r.status_code == 401, headers
            assert httpx.get(f"{server.url}/budget", headers=headers).status_code == 401
        assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    assert service.submissions() == []


def test_api_submit_scores_and_records_in_the_ledger(service, tmp_path):
    log = tmp_path / "requests.jsonl"
    with GradingServer(service, request_log=log) as server:
        auth = {"Authorization": f"Bearer {server.token}"}
        r = httpx.post(f"{server.url}/submit", json={"model_path": "output/v1", "wait": True}, headers=auth, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "scored" and body["score"] == 50.0 and body["split"] == "validation"
        assert body["baseline_score"] == 25.0 and body["improvement"] == 25.0 and body["total_submissions"] == 1
        assert httpx.get(f"{server.url}/submissions", headers=auth).json()[0]["submission_id"] == 1
        assert httpx.get(f"{server.url}/best", headers=auth).json()["score"] == 50.0
        assert httpx.get(f"{server.url}/budget", headers=auth).json()["submissions_used"] == 1
        bad = httpx.post(f"{server.url}/submit", json={"model_path": "../../etc"}, headers=auth)
        assert bad.status_code == 400 and "outside the workspace" in bad.json()["detail"]
        malformed = httpx.post(f"{server.url}/submit", content=b"{not json", headers=auth)
        assert malformed.status_code == 422
    statuses = [(e.kind, e.status) for e in Ledger(tmp_path / "harness" / "ledger.jsonl").entries()]
    assert statuses == [("submission", "queued"), ("submission", "scored")]
    routes = [json.loads(line)["route"] for line in log.read_text().splitlines()]
    assert routes.count("/submit") == 3


def test_a_submission_names_the_earlier_one_its_training_started_from(service, tmp_path):
    """`parent` (RL's share needs where RL started): an earlier submission's id is recorded as the agent said it;
    any other id, a string or a boolean is refused with a reason, and nothing is queued or charged for it."""
    with GradingServer(service) as server:
        auth = {"Authorization": f"Bearer {server.token}"}

        def submit(**extra):
            return httpx.post(f"{server.url}/submit", json={"model_path": "output/v1", "wait": True, **extra},
                              headers=auth, timeout=30)  # fmt: skip

        for parent in (1, 5):  # no submission yet: no id is an earlier one
            refused = submit(parent=parent)
            assert refused.status_code == 400 and "no earlier submission of this run (it has 0)" in refused.text
        assert submit().status_code == 200
        for bad in (0, -1, "1", True, 1.0):
            assert submit(parent=bad).status_code == 422, bad
        assert submit(parent=2).status_code == 400  # itself: the next id is 2
        assert submit(stage="GRPO", parent=1).status_code == 200
    entries = Ledger(tmp_path / "harness" / "ledger.jsonl").entries()
    scored = [e.detail for e in entries if e.status == "scored"]
    assert [d.get("parent") for d in scored] == [None, 1] and scored[1]["stage"] == "GRPO"
    assert len(service.submissions()) == 2


def test_submission_cap_gives_429(service):
    service.submit("output/v1", wait=True)
    service.submit("output/v1", wait=True)
    with pytest.raises(SubmissionRejected) as capped:
        service.submit("output/v1")
    assert capped.value.status_code == 429


SFT_SCRIPT = """
from trl import SFTConfig, SFTTrainer
trainer = SFTTrainer(model="models/base", args=SFTConfig(output_dir="output/v1"), train_dataset=None)
trainer.train()
"""


@pytest.mark.parametrize("strict", [False, True])
def test_mode_is_checked_on_the_agents_code_at_every_submission(tmp_path, tiny_model_dir, strict):
    ws = tmp_path / "ws"
    shutil.copytree(tiny_model_dir, ws / "output" / "v1")
    (ws / "code").mkdir()
    (ws / "code" / "train.py").write_text(SFT_SCRIPT)
    config = RunConfig(mode="rl-only", strict_mode=strict)
    svc = GradingService(GradingContext("run-m", config, ws, tmp_path / "harness"), BudgetClock(60),
                         evaluate=_constant_evaluator(50.0))
    try:
        if strict:
            with pytest.raises(SubmissionRejected) as refused:
                svc.submit("output/v1")
            assert refused.value.status_code == 403 and svc.submissions() == []
        else:
            svc.submit("output/v1", wait=True)
            detail = svc.submissions()[0].detail
            assert detail["route"] == "SFT" and detail["mode_ok"] is False
    finally:
        svc.close(drain_timeout_s=5)


def test_the_grader_records_each_line_and_evaluation_in_the_results_store_as_the_run_steps_do(tmp_path, tiny_model_dir):
    """Evaluate, append to the ledger, record in the store: one call (`a2rl_bench.grading.record.RunBook`) for the
    grader and the run's steps. A graded submission's rows (the submission, the events, the evaluation) and its
    evaluation file are written by the grader itself, keyed as ingest keys them, its ledger's every head anchored."""
    from a2rl_bench.store.results import ResultsStore

    store = ResultsStore(tmp_path / "results.duckdb")
    ws, harness = tmp_path / "ws", tmp_path / "harness"
    shutil.copytree(tiny_model_dir, ws / "output" / "v1")
    ctx = GradingContext("run-s", RunConfig(max_submissions=2), ws, harness, baseline={"validation": 25.0}, store=store)
    svc = GradingService(ctx, BudgetClock(60), evaluate=_constant_evaluator(50.0))
    try:
        svc.submit("output/v1", wait=True)
        svc.record_event("session-end", agent_seconds=1.0)
    finally:
        svc.close(drain_timeout_s=5)
    rows = store.query("SELECT submission_id, status, score, split, model_path FROM submissions WHERE run_id = 'run-s'")
    assert rows.values.tolist() == [[1, "scored", 50.0, "validation", "output/v1"]]
    evals = store.query("SELECT eval_key, kind, submission_id, score, n FROM evaluations WHERE run_id = 'run-s'")
    assert evals.values.tolist() == [["submission-1-validation", "submission", 1, 50.0, 4]]
    assert store.query("SELECT kind FROM events WHERE run_id = 'run-s'")["kind"].tolist() == ["session-end"]
    saved = EvalResult.model_validate_json((harness / "evaluations" / "submission-1-validation.json").read_text())
    assert saved.score == 50.0 and saved.evaluator_id == "constant"
    assert store.ledger_head("run-s") == svc.ledger.head()


class _CountingConnection:
    """A DuckDB connection that counts the transactions begun on it (`counts["transactions"]`)."""

    def __init__(self, con, counts):
        self._con, self._counts = con, counts

    def execute(self, sql, *args, **kwargs):
        if str(sql).strip().upper().startswith("BEGIN"):
            self._counts["transactions"] += 1
        return self._con.execute(sql, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._con, name)


def test_a_grading_event_is_one_store_transaction_that_refreshes_the_derived_rows_once(tmp_path, monkeypatch):
    """A submission's queued line (its anchor, its row) and its scored outcome (anchor, row, evaluation, items) are
    one DuckDB transaction each, and each computes the run's derived rows and intervals once."""
    from collections import Counter

    from a2rl_bench.grading.record import RunBook
    from a2rl_bench.store import derived, derived_intervals
    from a2rl_bench.store.results import ResultsStore
    from tests.run_dirs import synthetic_eval

    store = ResultsStore(tmp_path / "results.duckdb")
    store.start_run("r", RunConfig(), None, "offline")
    (tmp_path / "harness").mkdir()
    book = RunBook("r", tmp_path / "harness", store)
    counts: Counter = Counter()
    real_open = ResultsStore._open
    monkeypatch.setattr(ResultsStore, "_open", lambda self, *a: _CountingConnection(real_open(self, *a), counts))
    for module, name in ((derived, "derived"), (derived_intervals, "intervals")):
        monkeypatch.setattr(module, "refresh", lambda con, ids=None, f=module.refresh, n=name:
                            (counts.update([n]), f(con, ids))[1])  # fmt: skip
    book.append(kind="submission", submission_id=1, status="queued", split="validation", model_path="output/v1")
    assert counts == {"transactions": 1, "derived": 1, "intervals": 1}
    counts.clear()
    book.record_scored(synthetic_eval("validation", 4, 2), kind="submission", submission_id=1, split="validation")
    assert counts == {"transactions": 1, "derived": 1, "intervals": 1}
    assert store.query("SELECT status, score, model_path FROM submissions").values.tolist() == \
        [["scored", 50.0, "output/v1"]]
    assert store.query("SELECT count(*) AS n FROM item_results")["n"][0] == 4
    assert store.query("SELECT best_so_far FROM submission_derived")["best_so_far"].tolist() == [50.0]
    assert store.ledger_head("r") == book.ledger.head()


def test_the_results_store_anchors_every_head_and_catches_an_edited_final_score(tmp_path):
    from a2rl_bench.store.results import ResultsStore

    store = ResultsStore(tmp_path / "results.duckdb")
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path, anchor=store.ledger_anchor("r"))
    ledger.append(run_id="r", kind="event", detail={"event": "session-start"})
    ledger.append(run_id="r", kind="final", split="test", status="scored", score=3.125)
    assert store.ledger_head("r") == ledger.head()
    assert len(read_ledger(path, {"the results store": store.ledger_head("r")})) == 2
    path.write_text(path.read_text().replace('"score":3.125', '"score":93.125'))
    with pytest.raises(LedgerCorrupted, match="edited"):
        read_ledger(path, {"the results store": store.ledger_head("r")})


def test_a_mac_from_another_hosts_key_cannot_be_checked_here_but_a_forged_one_under_this_key_fails(tmp_path,
                                                                                                   monkeypatch):
    """A sweep over several hosts merges runs whose reports carry their own host's MAC: that is 'cannot tell'
    (their host store's anchors verify them), never 'forged'; a MAC under this machine's key that does not match
    is forged."""
    from a2rl_bench.grading.ledger import LedgerHead, head_mac, mac_matches

    head, other = LedgerHead(5, "a" * 64), LedgerHead(6, "b" * 64)
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "host-a"))
    made_on_a = head_mac("run-1", head)
    assert mac_matches("run-1", head, made_on_a) is True
    assert mac_matches("run-1", other, made_on_a) is False  # same key, another head: forged
    assert mac_matches("run-2", head, made_on_a) is False  # same key, another run
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "host-b"))
    assert head_mac("run-1", head) != made_on_a  # host b has its own key
    assert mac_matches("run-1", head, made_on_a) is None  # made under host a's key: cannot tell here
    key_id_b = head_mac("run-1", head).split(":")[0]
    forged = f"{key_id_b}:{made_on_a.split(':')[1]}"  # claims host b's key
    assert mac_matches("run-1", head, forged) is False


def test_the_agents_clock_runs_again_once_its_grade_is_on_the_ledger_and_is_released_once(tmp_path, tiny_model_dir,
                                                                                            monkeypatch):
    """From a submission's arrival until its outcome's line is on disk the agent's clock stands still: a harness
    killed in between (a retry, a stale attempt stopping itself) leaves the clock where the queued line says, so
    the resumed session's clock and the ledger agree. A store that fails to take the grade's row still lets the
    clock run again, and only once (a second release would end another submission's pause), and the grader's
    worker goes on to the next submission."""
    from a2rl_bench.base_models.hashing import weights_hash
    from a2rl_bench.store.results import ResultsStore

    seen: list[tuple[str | None, bool]] = []  # (what was written, the clock paused then)
    write = Ledger._write

    def watched(self, entry):
        seen.append((entry.status, clock.is_paused))
        return write(self, entry)

    monkeypatch.setattr(Ledger, "_write", watched)

    class FailingStore(ResultsStore):
        def record_evaluation(self, run_id, key, *args, **kwargs):
            seen.append(("evaluation row", clock.is_paused))
            if key == "submission-2-validation":
                raise OSError("the store's disk is full")
            return super().record_evaluation(run_id, key, *args, **kwargs)

    ws = tmp_path / "ws"
    for name in ("v1", "v2"):
        shutil.copytree(tiny_model_dir, ws / "output" / name)
    config = json.loads((ws / "output" / "v2" / "config.json").read_text())
    (ws / "output" / "v2" / "config.json").write_text(json.dumps({**config, "a2rl_test_variant": 2}))
    assert weights_hash(ws / "output" / "v1") != weights_hash(ws / "output" / "v2")  # graded, not a cache hit
    clock = BudgetClock(60)
    clock.start()
    ctx = GradingContext("run-c", RunConfig(max_submissions=3), ws, tmp_path / "harness", baseline={"validation": 25.0},
                         store=FailingStore(tmp_path / "results.duckdb"))  # fmt: skip
    svc = GradingService(ctx, clock, evaluate=_constant_evaluator(50.0))
    try:
        svc.submit("output/v1", wait=True)
        # The line is durable before the agent runs again; its rows are written while it does.
        assert seen == [("queued", True), ("scored", True), ("evaluation row", False)]
        assert not clock.is_paused
        clock.pause()  # another submission's grading, still under way
        svc.submit("output/v2", wait=True)
        assert clock.is_paused, "the failed recording released the other submission's pause"
        clock.resume()
        assert not clock.is_paused
        assert svc.submit("output/v1", wait=True)["status"] == "scored"  # the grader's worker lives on
    finally:
        svc.close(drain_timeout_s=5)
    entries = read_ledger(tmp_path / "harness" / "ledger.jsonl")
    assert [(e.submission_id, e.status) for e in entries] == [(1, "queued"), (1, "scored"), (2, "queued"),
                                                              (2, "scored"), (3, "queued"), (3, "scored")]  # fmt: skip
    assert (tmp_path / "harness" / "evaluations" / "submission-2-validation.json").exists()  # ingest rebuilds the row
