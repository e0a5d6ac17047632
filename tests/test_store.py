"""ResultsStore: round trip, idempotent upserts, views, schema versioning, bad files, concurrent writers."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from a2rl_bench.records import EvalResult, LedgerEntry, RunConfig, RunSummary
from a2rl_bench.store.schema import MIGRATIONS, SCHEMA_VERSION, VIEWS
from a2rl_bench.store.results import ResultsStore, StoreError, StoreLockTimeout


def _config(**kw) -> RunConfig:
    return RunConfig(**kw)


def _summary(run_id: str, config: RunConfig, *, baseline: float = 10.0, final: float = 15.0,
             status: str = "completed", n_submissions: int = 2) -> RunSummary:
    return RunSummary(
        run_id=run_id, config=config, status=status, protocol=config.protocol, variant_label="offline",
        baseline_val=9.0, baseline_test=baseline, best_val=14.0, best_submission_id=1,
        final_submission_id=1, final_test=final, delta_test=final - baseline, n_submissions=n_submissions,
        n_scored=n_submissions, agent_seconds=100.0, grading_seconds=20.0, wall_seconds=130.0,
    )


def _submission(run_id: str, sid: int, **kw) -> LedgerEntry:
    fields = dict(seq=sid, kind="submission", run_id=run_id, submission_id=sid,
                  model_path=f"output/ckpt-{sid}", weights_hash=f"h{sid}", size_bytes=5_000_000_000, split="validation", status="scored",
                  score=12.5, eval_seconds=3.0, agent_elapsed_s=40.0)
    return LedgerEntry(**(fields | kw))


def _eval(split: str, score: float) -> EvalResult:
    return EvalResult(task="gsm8k", split=split, score=score, n=64, n_correct=int(score * 0.64),
                      evaluator_id="gsm8k-v1", weights_hash="h1", generated_tokens=1234, duration_s=2.5)


@pytest.fixture
def store(tmp_path: Path) -> ResultsStore:
    return ResultsStore(tmp_path / "nested" / "dir" / "results.duckdb")


def test_round_trip_of_a_run_reads_back_with_sql(store: ResultsStore, tmp_path: Path):
    config = _config(seed=3)
    store.start_run("r1", config, tmp_path / "runs" / "r1", "offline (gsm8k test split)")
    assert store.get_run("r1")["status"] == "running"
    store.record_evaluation("r1", "baseline-test", "baseline", _eval("test", 10.0))
    store.record_submission("r1", _submission("r1", 0, score=11.0))
    store.record_submission("r1", _submission("r1", 1, score=14.0))
    store.record_evaluation("r1", "sub-1-val", "submission", _eval("validation", 14.0), submission_id=1)
    store.record_evaluation("r1", "final-test", "final", _eval("test", 15.0), submission_id=1)
    store.record_event("r1", 0, "agent_started", {"pid": 42, "path": Path("/x")})
    store.finish_run(_summary("r1", config))

    run = store.get_run("r1")
    assert run["status"] == "completed" and run["seed"] == 3 and run["delta_test"] == 5.0
    assert run["started_at"] is not None and run["finished_at"] >= run["started_at"]
    assert run["harness_dir"] == str(tmp_path / "runs" / "r1")
    assert run["variant_label"] == "offline"  # the summary's label is the final word
    assert run["config_hash"] == config.config_hash()

    subs = store.query("SELECT submission_id, score, size_bytes FROM submissions WHERE run_id = ? ORDER BY 1",
                       ["r1"])
    assert subs["score"].tolist() == [11.0, 14.0]
    assert subs["size_bytes"].tolist() == [5_000_000_000] * 2
    evals = store.query("SELECT kind, count(*) AS n FROM evaluations GROUP BY kind ORDER BY kind")
    assert dict(zip(evals["kind"], evals["n"])) == {"baseline": 1, "final": 1, "submission": 1}
    detail = store.query("SELECT detail_json->>'path' AS p FROM events WHERE run_id = 'r1'")
    assert detail["p"].tolist() == ["/x"]


def test_same_submission_twice_leaves_one_row_with_latest_values(store: ResultsStore):
    store.record_submission("r1", _submission("r1", 0, status="queued", score=None))
    store.record_submission("r1", _submission("r1", 0, status="scored", score=33.0, model_path=None))
    df = store.query("SELECT * FROM submissions")
    assert len(df) == 1
    assert df.loc[0, "status"] == "scored" and df.loc[0, "score"] == 33.0
    assert df.loc[0, "model_path"] == "output/ckpt-0"  # a later line that omits the path keeps it


def test_finish_run_twice_leaves_one_run_row(store: ResultsStore):
    config = _config()
    store.start_run("r1", config, None, "offline")
    store.finish_run(_summary("r1", config, status="failed"))
    store.finish_run(_summary("r1", config, final=20.0))
    df = store.runs_df()
    assert len(df) == 1
    assert df.loc[0, "status"] == "completed" and df.loc[0, "final_test"] == 20.0


def test_second_run_adds_a_row_and_leaves_the_first_intact(store: ResultsStore):
    store.start_run("r1", _config(seed=1), None, "offline")
    store.finish_run(_summary("r1", _config(seed=1), final=12.0))
    store.record_submission("r1", _submission("r1", 0))
    store.start_run("r2", _config(seed=2), None, "offline")
    store.record_submission("r2", _submission("r2", 0, score=99.0))
    assert len(store.runs_df()) == 2
    first = store.get_run("r1")
    assert first["status"] == "completed" and first["final_test"] == 12.0
    assert store.query("SELECT score FROM submissions WHERE run_id = 'r1'")["score"].tolist() == [12.5]


def test_delete_run_children_keeps_the_run_row(store: ResultsStore):
    store.start_run("r1", _config(), None, "offline")
    store.record_submission("r1", _submission("r1", 0))
    store.record_event("r1", 0, "x", {})
    store.delete_run_children("r1")
    assert store.get_run("r1") is not None
    left = store.query("SELECT (SELECT count(*) FROM submissions) + (SELECT count(*) FROM events) AS n")
    assert left["n"][0] == 0


def test_leaderboard_means_over_completed_runs(store: ResultsStore):
    for seed, final in [(0, 14.0), (1, 18.0)]:
        config = _config(seed=seed)
        store.start_run(f"a{seed}", config, None, "offline")
        store.finish_run(_summary(f"a{seed}", config, baseline=10.0, final=final, n_submissions=3))
    failed = _config(seed=9)
    store.finish_run(_summary("a9", failed, final=90.0, status="failed"))  # excluded: not completed
    store.finish_run(_summary("b0", _config(agent="other"), final=11.0))

    board = store.query("SELECT * FROM leaderboard WHERE agent = 'reference-sft'")
    assert len(board) == 1
    row = board.iloc[0]
    assert row["n"] == 2 and row["mean_delta"] == pytest.approx(6.0) and list(row["seeds"]) == [0, 1]
    assert row["mean_final_test"] == pytest.approx(16.0) and row["mean_baseline_test"] == pytest.approx(10.0)
    # t-interval over 2 seeds: 6 ± 12.706 · sd/√2, sd of (4, 8) = 2√2
    assert row["ci_low"] == pytest.approx(6.0 - 12.706 * 2.0) and row["ci_high"] == pytest.approx(6.0 + 12.706 * 2.0)
    assert row["n_mode_breaches"] == 0 and str(board["n_mode_breaches"].dtype) == "int64"
    other = store.query("SELECT n, ci_low, interval FROM leaderboard WHERE agent = 'other'").iloc[0]
    assert other["n"] == 1 and other["ci_low"] != other["ci_low"] and other["interval"] == "n = 1: no interval"
    excluded = store.query("SELECT * FROM excluded_runs")
    assert excluded.values.tolist() == [["run failed", 1]]


def test_a_setting_is_everything_but_the_seed(store: ResultsStore):
    """A 120 s / 32-item run and two 3600 s / 300-item runs are two settings (n = 1 and n = 2), not n = 3."""
    from a2rl_bench.setting import SETTING_KEY, item_selection, setting_id

    short = _config(seed=0, budget_s=120.0, test_limit=32)
    longer = [_config(seed=s, budget_s=3600.0, test_limit=300) for s in (1, 2)]
    for i, config in enumerate([short, *longer]):
        store.start_run(f"r{i}", config, None, "offline")
        store.record_evaluation(f"r{i}", "baseline-0-test", "baseline", _eval("test", 10.0))
        store.finish_run(_summary(f"r{i}", config, final=12.0 + i))
    board = store.query("SELECT budget_s, item_selection, n FROM leaderboard ORDER BY budget_s")
    assert board.values.tolist() == [[120.0, "val:16 test:32", 1], [3600.0, "val:16 test:300", 2]]
    keyed = store.query(f"SELECT setting_id, {', '.join(SETTING_KEY)} FROM run_settings ORDER BY run_id")
    for _, row in keyed.iterrows():  # the SQL key and the Python key agree
        assert row["setting_id"] == setting_id(row.to_dict())
    assert keyed["item_selection"][0] == item_selection(16, 32) and keyed["evaluator_id"][0] == "gsm8k-v1"


def test_item_results_are_written_with_their_evaluation_and_rewritten_idempotently(store: ResultsStore):
    from a2rl_bench.records import ItemResult

    items = [ItemResult(item_id=f"q{i}", completion="", prediction=None, target="1", correct=i % 2 == 0,
                        detail={"generated_tokens": 7}) for i in range(4)]
    graded = [ItemResult(item_id="j", completion="", prediction=None, target="", correct=False, value=0.5)]
    result = _eval("test", 50.0).model_copy(update={"items": items + graded})
    for _ in range(2):
        store.record_evaluation("r1", "baseline-0-test", "baseline", result)
    rows = store.query("SELECT item_id, score, correct, coalesce(tokens, -1), split FROM item_results ORDER BY item_id")
    assert rows.values.tolist() == [["j", 0.5, False, -1, "test"], ["q0", 1.0, True, 7, "test"],
                                    ["q1", 0.0, False, 7, "test"], ["q2", 1.0, True, 7, "test"],
                                    ["q3", 0.0, False, 7, "test"]]
    store.record_evaluation("r1", "baseline-0-test", "baseline", result.model_copy(update={"items": items[:1]}))
    assert store.query("SELECT count(*) AS n FROM item_results")["n"][0] == 1  # replaced, not appended


def test_the_leak_audit_metric_survives_the_process_metrics(store: ResultsStore):
    store.record_metrics("r1", {"leaked_items": 3})
    store.record_metrics("r1", {"failure_class": "none", "n_scored": 2})
    names = store.query("SELECT name, value FROM metrics ORDER BY name").values.tolist()
    assert ["leaked_items", 3.0] in names and len(names) == 3


def test_the_stores_noise_is_pythons_binomial_se_and_its_sql_has_no_interval_macros(store: ResultsStore, tmp_path):
    """One home for the interval maths: the stored noise is `binomial_se`'s (the macros `t975` and `binomial_se`
    that computed it in SQL are gone)."""
    from a2rl_bench.summary.intervals import binomial_se

    store.start_run("r1", _config(seed=3), tmp_path / "runs" / "r1", "offline")
    store.record_evaluation("r1", "baseline-test", "baseline", _eval("test", 0.0).model_copy(update={"n": 32}))
    got = store.query("SELECT noise_se, n_items FROM noise_floor WHERE split = 'test'")
    assert got.values.tolist() == [[pytest.approx(binomial_se(0.0, 32)), 32]]
    assert binomial_se(0.0, 32) > 3  # 0 of 32 right still has a sampling error
    assert store.query("SELECT count(*) AS n FROM duckdb_functions() WHERE function_type = 'macro' "
                       "AND function_name IN ('t975', 'binomial_se')")["n"][0] == 0


def test_schema_version_is_one_and_reopening_does_not_migrate_again(tmp_path: Path):
    path = tmp_path / "results.duckdb"
    first = ResultsStore(path)
    first.start_run("r1", _config(), None, "offline")
    applied = first.query("SELECT * FROM schema_version")
    again = ResultsStore(path)
    assert SCHEMA_VERSION == len(MIGRATIONS)
    assert again.query("SELECT * FROM schema_version").equals(applied)
    assert applied["version"].tolist() == list(range(1, SCHEMA_VERSION + 1))
    assert again.get_run("r1") is not None


V10_SCHEMA = Path(__file__).with_name("data") / "store_schema_v10.sql"
"""A version-10 store's schema as that version's migrations made it: each view in the form it had then."""
CATALOG = ("SELECT 'view' AS kind, view_name AS name, sql FROM duckdb_views() WHERE NOT internal UNION ALL "
           "SELECT 'macro', function_name, macro_definition FROM duckdb_functions() "
           "WHERE function_type = 'macro' AND NOT internal ORDER BY ALL")  # fmt: skip


def test_an_old_store_upgraded_reads_exactly_the_views_of_a_new_store(tmp_path: Path):
    """A store of schema version 10 (its views as that version made them, its macros, a run in it) opened by this
    a2rl: its catalog of views and macros is a new store's, and every view gives the rows a new store gives for the
    same run."""
    import duckdb

    old, new = tmp_path / "old.duckdb", tmp_path / "new.duckdb"
    run = ("INSERT INTO runs (run_id, task, variant, agent, mode, status, protocol, seed, baseline_val, baseline_test, "
           "best_val, best_submission_id, final_submission_id, final_test, delta_test, budget_s, config_json) VALUES "
           "('r1', 'gsm8k', 'offline', 'a', 'sft-only', 'completed', 'heldout', 1, 10, 12, 15, 1, 1, 14, 2, 100, '{}')")
    subs = ("INSERT INTO submissions (run_id, submission_id, split, score, status, agent_elapsed_s, route) VALUES "
            "('r1', 1, 'validation', 15.0, 'scored', 10, 'SFT'), ('r1', 2, 'validation', 13.0, 'scored', 80, 'GRPO')")
    with duckdb.connect(str(old)) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ)")
        con.execute(V10_SCHEMA.read_text())
        con.execute("INSERT INTO schema_version SELECT range, now() FROM range(1, 11)")
        con.execute(run)
        con.execute(subs)
    assert "t975" in str(duckdb.connect(str(old)).execute(CATALOG).fetchall())
    ResultsStore(new)
    with duckdb.connect(str(new)) as con:
        con.execute(run)
        con.execute(subs)
    upgraded, fresh = ResultsStore(old), ResultsStore(new)
    fresh.refresh_derived()
    assert upgraded.query(CATALOG).equals(fresh.query(CATALOG))
    assert fresh.query(CATALOG).query("kind == 'view'")["name"].tolist() == sorted(VIEWS)
    for view in VIEWS:
        rows = f"SELECT * FROM {view} ORDER BY ALL"
        assert upgraded.query(rows).equals(fresh.query(rows)), view
    assert len(upgraded.query("SELECT * FROM mode_violations")) == len(upgraded.query("SELECT * FROM analysed_runs")) == 1


def test_each_view_is_defined_once_in_the_schema():
    """Its SQL lives in VIEWS alone: no migration creates or replaces a view, no view is created twice."""
    import re

    source = (Path(__file__).parents[1] / "a2rl_bench" / "store" / "schema.py").read_text()
    created = re.findall(r"CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(\w+)", source)
    assert sorted(created) == sorted(VIEWS) and len(created) == len(set(created))
    assert all(re.match(rf"(?s)(\s*--[^\n]*\n)*\s*CREATE VIEW {name} AS", sql) for name, sql in VIEWS.items())
    for step in MIGRATIONS:
        assert "VIEW" not in (step if isinstance(step, str) else step.sql).upper()


def test_garbage_file_gives_a_clear_error_naming_it(tmp_path: Path):
    path = tmp_path / "results.duckdb"
    path.write_bytes(b"definitely not a database\n" * 200)
    with pytest.raises(StoreError, match="results.duckdb") as info:
        ResultsStore(path)
    assert "not a valid DuckDB database" in str(info.value)


def _write_many(path: str, worker: int, n: int) -> None:
    store = ResultsStore(path)
    for sid in range(n):
        store.record_submission(f"w{worker}", _submission(f"w{worker}", sid))


def test_concurrent_writer_processes_lose_nothing(tmp_path: Path):
    path = str(tmp_path / "results.duckdb")
    ResultsStore(path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(path, w, 25)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 8
    counts = ResultsStore(path).query("SELECT run_id, count(*) AS n FROM submissions GROUP BY run_id")
    assert counts["n"].sum() == 200 and set(counts["n"]) == {25}


def test_busy_lock_times_out_with_a_clear_error(tmp_path: Path):
    import fcntl
    import os

    store = ResultsStore(tmp_path / "results.duckdb", lock_timeout_s=0.3)
    fd = os.open(store.lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # flock conflicts across file descriptions, even in one process
        with pytest.raises(StoreLockTimeout, match="results.duckdb.lock"):
            store.get_run("r1")
    finally:
        os.close(fd)
    assert store.get_run("r1") is None


def test_empty_file_is_initialised_as_a_new_store(tmp_path: Path):
    path = tmp_path / "results.duckdb"
    path.touch()
    assert ResultsStore(path).query("SELECT max(version) AS v FROM schema_version")["v"][0] == SCHEMA_VERSION


def test_a_batch_writes_through_one_connection_all_or_nothing(store: ResultsStore, monkeypatch):
    config = _config()
    store.start_run("r1", config, None, "offline")
    opened = []
    real_open = store._open
    monkeypatch.setattr(store, "_open", lambda *a: opened.append(a) or real_open(*a))
    with store.batch():
        store.record_metrics("r1", {"leaked_items": 0, "n_scored": 2})
        store.record_routes("r1", {1: "SFT"})
        store.finish_run(_summary("r1", config))
        assert store.get_run("r1")["status"] == "completed"  # reads inside the batch see its writes
    assert len(opened) == 1
    with pytest.raises(RuntimeError, match="boom"), store.batch():
        store.record_metrics("r1", {"n_scored": 99})
        raise RuntimeError("boom")
    assert store.query("SELECT value FROM metrics WHERE name = 'n_scored'")["value"][0] == 2  # rolled back


def test_a_new_store_has_small_blocks_and_an_old_one_keeps_its_own(tmp_path: Path):
    """Every write rewrites a few blocks per table it touches: 16 KB blocks write ~15x fewer bytes than 256 KB."""
    import duckdb

    from a2rl_bench.store.results import STORE_BLOCK_SIZE

    new = ResultsStore(tmp_path / "new.duckdb")
    assert new.query("SELECT block_size FROM pragma_database_size()")["block_size"][0] == STORE_BLOCK_SIZE
    duckdb.connect(str(tmp_path / "old.duckdb")).close()
    old = ResultsStore(tmp_path / "old.duckdb")
    assert old.query("SELECT block_size FROM pragma_database_size()")["block_size"][0] == 256 * 1024
    (tmp_path / "empty.duckdb").touch()  # an empty file becomes a new store
    assert ResultsStore(tmp_path / "empty.duckdb").query("SELECT count(*) AS n FROM runs")["n"][0] == 0
