"""The results store: runs, submissions, evaluations and events in one DuckDB file, safe for many processes.

DuckDB lets only one process open a file read-write, and while it does no other process can open it even
read-only. So every open (read or write) takes an exclusive `flock` on `<db>.lock`, the connection lives for
one short transaction, and nothing stays open between calls. Every write is an upsert on a primary key, so a
retried run replaces its rows instead of duplicating them.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import duckdb

from a2rl_bench.locks import exclusive_lock
from a2rl_bench.store import derived, derived_intervals
from a2rl_bench.store.schema import MIGRATIONS, SCHEMA_VERSION, Step, create_views, drop_views
from a2rl_bench.records import EvalResult, LedgerEntry, RunConfig, RunSummary, utcnow

if TYPE_CHECKING:  # pandas is only needed by readers; writers (the grading service) skip its import time
    import pandas as pd

EvalKind = Literal["baseline", "submission", "final"]



# Block size of new store files (DuckDB's default is 256 KB; every write rewrites a few blocks per table it touches).
STORE_BLOCK_SIZE = 16 * 1024

# Metrics written by a step of their own (the leak audit), which a later `record_metrics` must not delete.
KEPT_METRICS = ("leaked_items", "leak_verdict")

# The tables a run's derived numbers and its group's intervals (`a2rl_bench.store.derived`, `derived_intervals`) come
# from.
DERIVED_FROM = {"runs", "submissions", "evaluations", "item_results"}

# Primary keys of the tables `bulk_write` may write.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "runs": ("run_id",),
    "submissions": ("run_id", "submission_id"),
    "evaluations": ("run_id", "eval_key"),
    "events": ("run_id", "seq"),
    "metrics": ("run_id", "name"),
    "llm_calls": ("run_id", "seq"),
    "resources": ("run_id", "seq"),
    "tool_calls": ("run_id", "seq"),
    "item_results": ("run_id", "eval_key", "item_id"),
}


class StoreError(RuntimeError):
    """The results store file cannot be used (not a DuckDB file, written by a newer a2rl, ...)."""


class StoreLockTimeout(StoreError, TimeoutError):
    """Another process kept the results store busy for longer than the timeout."""


class ResultsStore:
    """One DuckDB results file; each method is a short, locked transaction."""

    def __init__(self, path: Path | str, lock_timeout_s: float = 120.0, read_only: bool = False) -> None:
        """`read_only`: another host's store (a copy, or a read-only mount): never created, migrated or written,
        and read without the lock where its directory does not let us make the lock file."""
        self.path = Path(path).expanduser().resolve()
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.lock_timeout_s = lock_timeout_s
        self.read_only = read_only
        self._local = threading.local()  # a batch belongs to its thread (the grader writes from several)
        if read_only:
            if not self.path.is_file():
                raise StoreError(f"no results store at {self.path}")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(time.monotonic() + lock_timeout_s):
            if not self.path.exists() or self.path.stat().st_size == 0:
                _create(self.path)
        with self._transaction() as con:
            _migrate(con, self.path)

    # ---- writes -------------------------------------------------------------------------------------

    def start_run(
        self, run_id: str, config: RunConfig, harness_dir: Path | str | None, variant_label: str
    ) -> None:
        """Insert or reset a run as 'running'. A retry keeps the first `started_at`."""
        row = _config_columns(config) | {
            "run_id": run_id,
            "variant_label": variant_label,
            "harness_dir": None if harness_dir is None else str(harness_dir),
            "status": "running",
            "started_at": utcnow(),
            "finished_at": None,
            "error": None,
            "updated_at": utcnow(),
        }
        with self._transaction() as con:
            _upsert(con, "runs", ("run_id",), row, keep_existing={"started_at"})
            self._refresh(con, [run_id])

    def finish_run(self, summary: RunSummary) -> None:
        """Write a run's headline numbers and final status (inserts the run if `start_run` never ran)."""
        row = _config_columns(summary.config) | {
            "run_id": summary.run_id,
            "variant_label": summary.variant_label,
            "protocol": summary.protocol,
            "status": summary.status,
            "finished_at": None if summary.status == "running" else utcnow(),
            "baseline_val": summary.baseline_val,
            "baseline_test": summary.baseline_test,
            "best_val": summary.best_val,
            "best_submission_id": summary.best_submission_id,
            "final_submission_id": summary.final_submission_id,
            "final_test": summary.final_test,
            "delta_test": summary.delta_test,
            "n_submissions": summary.n_submissions,
            "n_scored": summary.n_scored,
            "agent_seconds": summary.agent_seconds,
            "grading_seconds": summary.grading_seconds,
            "wall_seconds": summary.wall_seconds,
            "phase_seconds_json": json.dumps(summary.phase_seconds),
            "grace_seconds": summary.grace_seconds,
            "attempts": summary.attempts,
            "error": summary.error,
            "updated_at": utcnow(),
        }
        with self._transaction() as con:
            _upsert(con, "runs", ("run_id",), row)
            self._refresh(con, [summary.run_id])

    def record_submission(self, run_id: str, entry: LedgerEntry) -> None:
        """Upsert one submission from a ledger line.

        The outcome (status, score, cached, eval_seconds, error) always takes the latest line's values; the
        description (path, hash, size, split, arrival) keeps an earlier value when a later line leaves it
        empty, since a "scored" ledger line need not repeat what the "queued" line said.
        """
        if entry.submission_id is None:
            raise ValueError(f"ledger entry seq={entry.seq} ({entry.kind}) has no submission_id")
        if entry.run_id != run_id:
            raise ValueError(f"ledger entry belongs to run {entry.run_id!r}, not {run_id!r}")
        row = {
            "run_id": run_id,
            "submission_id": entry.submission_id,
            "created_at": entry.at,
            "model_path": entry.model_path,
            "weights_hash": entry.weights_hash,
            "size_bytes": entry.size_bytes,
            "split": entry.split,
            "agent_elapsed_s": entry.agent_elapsed_s,
            "status": entry.status,
            "score": entry.score,
            "cached": entry.cached,
            "eval_seconds": entry.eval_seconds,
            "error": entry.error,
            "stage": entry.detail.get("stage"),
        }
        described = {"model_path", "weights_hash", "size_bytes", "split", "agent_elapsed_s", "stage"}
        with self._transaction() as con:
            _upsert(
                con, "submissions", ("run_id", "submission_id"), row,
                keep_existing={"created_at"}, fill_missing=described,
            )
            self._refresh(con, [run_id])

    def record_evaluation(
        self,
        run_id: str,
        eval_key: str,
        kind: EvalKind,
        result: EvalResult,
        submission_id: int | None = None,
    ) -> None:
        """Upsert one evaluation and replace its per-item results (`item_results`), in one transaction: recording
        the same evaluation again leaves the same rows."""
        row = {
            "run_id": run_id,
            "eval_key": eval_key,
            "kind": kind,
            "submission_id": submission_id,
            "split": result.split,
            "score": result.score,
            "n": result.n,
            "n_correct": result.n_correct,
            "evaluator_id": result.evaluator_id,
            "weights_hash": result.weights_hash,
            "generated_tokens": result.generated_tokens,
            "duration_s": result.duration_s,
            "cached": result.cached,
            "created_at": utcnow(),
        }
        items = item_rows(run_id, eval_key, result)
        with self._transaction() as con:
            _upsert(con, "evaluations", ("run_id", "eval_key"), row)
            con.execute("DELETE FROM item_results WHERE run_id = ? AND eval_key = ?", [run_id, eval_key])
            if items:
                con.executemany(f"INSERT INTO item_results ({', '.join(ITEM_COLUMNS)}) VALUES "
                                f"({', '.join('?' for _ in ITEM_COLUMNS)})", [tuple(r.values()) for r in items])
            self._refresh(con, [run_id])

    def record_event(
        self, run_id: str, seq: int, kind: str, detail: Mapping[str, Any], at: datetime | None = None
    ) -> None:
        """Upsert one event; `seq` is the caller's position in its append-only log."""
        row = {
            "run_id": run_id,
            "seq": seq,
            "created_at": at or utcnow(),
            "kind": kind,
            "detail_json": json.dumps(dict(detail), sort_keys=True, default=str),
        }
        with self._transaction() as con:
            _upsert(con, "events", ("run_id", "seq"), row)

    # -- ledger anchors: the head of each run's ledger after every append (a2rl_bench.grading.ledger) --------------
    # Created on first use, not by a migration: an addition that stays out of the schema-version sequence.
    _LEDGER_HEADS = """CREATE TABLE IF NOT EXISTS ledger_heads (
        run_id VARCHAR, seq BIGINT, line_hash VARCHAR, recorded_at TIMESTAMPTZ, PRIMARY KEY (run_id, seq))"""

    def record_ledger_head(self, run_id: str, seq: int, line_hash: str) -> None:
        """Anchor: the ledger's entry `seq` hashes to `line_hash`. Append-only: a row once written is kept
        (a different hash for the same entry later means the ledger was rewritten, which `ledger_head` shows)."""
        with self._transaction() as con:
            con.execute(self._LEDGER_HEADS)
            con.execute("INSERT INTO ledger_heads VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        [run_id, seq, line_hash, utcnow()])  # fmt: skip

    def ledger_head(self, run_id: str) -> Any:
        """The last anchored head of a run's ledger (an `a2rl_bench.grading.ledger.LedgerHead`), or None."""
        from a2rl_bench.grading.ledger import LedgerHead

        with self._transaction() as con:
            con.execute(self._LEDGER_HEADS)
            row = con.execute("SELECT seq, line_hash FROM ledger_heads WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                              [run_id]).fetchone()  # fmt: skip
        return LedgerHead(row[0] + 1, row[1]) if row else None

    def ledger_anchor(self, run_id: str):
        """A `Ledger(anchor=...)` callback that records every new head here."""
        return lambda entry, line_hash: self.record_ledger_head(run_id, entry.seq, line_hash)

    def ledger_heads(self) -> pd.DataFrame:
        """Every anchored head (run_id, seq, line_hash, recorded_at), in ledger order; empty where none was anchored."""
        with self._connect(read_only=True) as con:
            known = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ledger_heads' "
                                "AND table_catalog = current_database()").fetchone()[0]  # fmt: skip
            sql = "SELECT * FROM ledger_heads ORDER BY run_id, seq" if known else (
                "SELECT NULL::VARCHAR AS run_id, NULL::BIGINT AS seq, NULL::VARCHAR AS line_hash, "
                "NULL::TIMESTAMPTZ AS recorded_at WHERE false")  # fmt: skip
            return con.execute(sql).df()

    def adopt_ledger_heads(self, run_id: str, heads: Sequence[tuple[int, str, Any]]) -> None:
        """Replace a run's anchors with `heads` (seq, line_hash, recorded_at): what a merge does when it takes a run's
        rows from another host's store, whose anchors the run directory was just verified against."""
        with self._transaction() as con:
            con.execute(self._LEDGER_HEADS)
            con.execute("DELETE FROM ledger_heads WHERE run_id = ?", [run_id])
            if heads:
                con.executemany("INSERT INTO ledger_heads VALUES (?, ?, ?, ?)",
                                [(run_id, int(seq), line_hash, at) for seq, line_hash, at in heads])  # fmt: skip

    def delete_run_children(self, run_id: str) -> None:
        """Drop a run's submissions, evaluations (and their items) and events (the run row stays), before a clean re-ingest."""
        with self._transaction() as con:
            for table in ("submissions", "evaluations", "item_results", "events"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            self._refresh(con, [run_id])

    def record_metrics(self, run_id: str, metrics: Mapping[str, Any]) -> None:
        """Replace a run's process metrics. Numbers and booleans go to `value`, anything else to `text`
        (lists and dicts as JSON); a `failure_class` entry is also copied to the run's row. Metrics other steps
        write (`KEPT_METRICS`, e.g. the leak audit's count) survive unless `metrics` names them."""
        rows = [(run_id, name, *metric_cells(v)) for name, v in metrics.items()]
        kept = [k for k in KEPT_METRICS if k not in metrics]
        with self._transaction() as con:
            keep = f" AND name NOT IN ({', '.join('?' for _ in kept)})" if kept else ""
            con.execute(f"DELETE FROM metrics WHERE run_id = ?{keep}", [run_id, *kept])
            if rows:
                con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", rows)
            if "failure_class" in metrics:
                con.execute(
                    "UPDATE runs SET failure_class = ? WHERE run_id = ?", [metrics["failure_class"], run_id]
                )
                derived_intervals.refresh(con, [run_id])  # an infrastructure failure leaves its setting's intervals

    def record_routes(
        self, run_id: str, routes: Mapping[int, str], code_shas: Mapping[int, str | None] | None = None
    ) -> None:
        """Set the route label (and code snapshot) of existing submission rows."""
        shas = code_shas or {}
        rows = [(label, shas.get(sid), run_id, sid) for sid, label in routes.items()]
        with self._transaction() as con:
            if rows:
                con.executemany(
                    "UPDATE submissions SET route = ?, code_sha = coalesce(?, code_sha) "
                    "WHERE run_id = ? AND submission_id = ?",
                    rows,
                )

    def replace_run_rows(self, table: str, run_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Replace all of one run's rows in `llm_calls`, `tool_calls` or `resources` (each with a unique `seq`)."""
        if table not in ("llm_calls", "tool_calls", "resources"):
            raise ValueError(f"replace_run_rows writes llm_calls, tool_calls or resources, not {table!r}")
        import pandas as pd

        frame = pd.DataFrame([{**r, "run_id": run_id} for r in rows])
        with self._transaction() as con:
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            if len(frame):
                derived.insert_frame(con, table, frame)

    def bulk_write(self, table: str, frame: Any) -> int:
        """Upsert a pandas DataFrame or Arrow table into `table` in one statement (no row loop).

        A row whose primary key is already stored has the frame's columns overwritten and its other columns
        kept; a new row gets NULL in the columns the frame lacks. Writing the same frame twice is harmless.
        The frame must not repeat a key. Returns the number of rows written.
        """
        if table not in TABLE_KEYS:
            raise ValueError(f"unknown table {table!r}; one of {sorted(TABLE_KEYS)}")
        with self._transaction() as con:
            con.register("frame", frame)
            try:
                derived.refuse_unscored_items(con, table, "frame")
                # INSERT OR REPLACE goes through the key index: ~10x faster than DELETE ... USING + INSERT.
                con.execute(f"INSERT OR REPLACE INTO {table} BY NAME SELECT * FROM frame")
                ((n,),) = con.execute("SELECT count(*) FROM frame").fetchall()
                if table in DERIVED_FROM:
                    self._refresh(con, [r for (r,) in con.execute("SELECT DISTINCT run_id FROM frame").fetchall()])
            finally:
                con.unregister("frame")
        return int(n)

    def replace_run(self, run_id: str, frames: Mapping[str, Any]) -> None:
        """Replace everything stored for one run in the given tables, in one transaction.

        `frames` maps table names (see `TABLE_KEYS`) to DataFrames holding only this run's rows; tables not
        named are left alone. Re-ingesting the same run directory therefore leaves the store unchanged.
        """
        unknown = set(frames) - set(TABLE_KEYS)
        if unknown:
            raise ValueError(f"unknown tables {sorted(unknown)}; known: {sorted(TABLE_KEYS)}")
        with self._transaction() as con:
            for table, frame in frames.items():
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
                if len(frame):
                    derived.insert_frame(con, table, frame)
            if DERIVED_FROM & set(frames):
                self._refresh(con, [run_id])

    def refresh_derived(self) -> None:
        """Recompute every run's derived numbers (`a2rl_bench.store.derived`): after editing stored rows by hand in
        SQL."""
        with self._transaction() as con:
            self._refresh(con, None)

    # ---- reads --------------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        if self._batch is not None:
            self._refresh_stale()
            cur = self._batch.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
            row = cur.fetchone()
            return None if row is None else dict(zip([d[0] for d in cur.description], row))
        with self._connect(read_only=True) as con:
            cur = con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d[0] for d in cur.description], row))

    def runs_df(self) -> pd.DataFrame:
        return self.query("SELECT * FROM latest_runs")

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pd.DataFrame:
        """Run SQL on a read-only connection and return a DataFrame."""
        if self._batch is not None:
            self._refresh_stale()
            return self._batch.execute(sql, params).df()
        with self._connect(read_only=True) as con:
            return con.execute(sql, params).df()

    # ---- connections --------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:  # a store handed to another process: its path and settings
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    @property
    def _batch(self) -> duckdb.DuckDBPyConnection | None:
        return getattr(self._local, "con", None)

    def _refresh(self, con: duckdb.DuckDBPyConnection, run_ids: Sequence[str] | None) -> None:
        """The derived rows and intervals of `run_ids` (every run when None): now, or, inside a batch, once before
        it commits (a grading event writes a submission, an evaluation and an anchor, and refreshes once)."""
        if self._batch is None:
            _refresh_derived(con, run_ids)
        elif run_ids is None or self._local.stale is None:
            self._local.stale = None
        else:
            self._local.stale |= set(run_ids)

    def _refresh_stale(self) -> None:
        """Inside a batch: refresh what its writes made stale (before it commits, and before a read sees it)."""
        stale, self._local.stale = self._local.stale, set()
        if stale is None or stale:
            _refresh_derived(self._batch, None if stale is None else sorted(stale))

    @contextmanager
    def batch(self) -> Iterator[ResultsStore]:
        """Every write inside the block goes through one connection and one transaction (all or nothing), so a
        run's summary rows cost one open, one commit and one lock instead of one each. Reads inside the block see
        the batch's writes. Keep the block short: other processes wait for the lock meanwhile."""
        if self._batch is not None:  # nested: the outer batch already holds the connection
            yield self
            return
        with self._connect(read_only=False) as con:
            con.execute("BEGIN TRANSACTION")
            self._local.con, self._local.stale = con, set()
            try:
                yield self
                self._refresh_stale()
                con.execute("COMMIT")
            finally:
                self._local.con = None

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._batch is not None:
            yield self._batch
            return
        # Closing without COMMIT (on an exception) rolls the transaction back.
        with self._connect(read_only=False) as con:
            con.execute("BEGIN TRANSACTION")
            yield con
            con.execute("COMMIT")

    def _locked(self, deadline: float):
        """The store's inter-process lock (`<db>.lock`), waited for until `deadline` (monotonic)."""
        busy = f"timed out waiting for {self.lock_path}: another process kept the results store {self.path} busy"
        if self.read_only and not os.access(self.lock_path if self.lock_path.exists() else self.path.parent, os.W_OK):
            return nullcontext()  # a read-only copy or mount: no writer on this machine to take turns with
        return exclusive_lock(self.lock_path, deadline, lambda: StoreLockTimeout(busy))

    @contextmanager
    def _connect(self, read_only: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        deadline = time.monotonic() + self.lock_timeout_s
        with self._locked(deadline):
            con = self._open(read_only, deadline)
            try:
                yield con
            finally:
                con.close()

    def _open(self, read_only: bool, deadline: float) -> duckdb.DuckDBPyConnection:
        if self.read_only and not read_only:
            raise StoreError(f"results store {self.path} was opened read-only (another host's store): not written")
        if not read_only and self.path.exists() and self.path.stat().st_size == 0:
            # An empty file (e.g. from mkstemp or `touch`) holds no data; DuckDB refuses it, so start fresh.
            self.path.unlink()
        while True:
            try:
                # DuckDB checkpoints on every close, rewriting the blocks of each table a write touched: new stores
                # have small blocks (`_create`) and `batch()` groups a run's summary rows. Leaving writes in the WAL
                # instead was measured and rejected: every open replays the log, and opens grew to seconds.
                return duckdb.connect(str(self.path), read_only=read_only)
            except duckdb.IOException as e:
                # A process that bypasses our lock (a notebook, the CLI) still holds DuckDB's own file lock.
                if "Could not set lock" not in str(e):
                    raise StoreError(f"cannot open results store {self.path}: {e}") from None
                if time.monotonic() >= deadline:
                    raise StoreLockTimeout(
                        f"results store {self.path} is held open by another process that does not use "
                        f"ResultsStore (close it, e.g. a notebook connection): {e}"
                    ) from None
                time.sleep(0.05)
            except duckdb.Error as e:
                raise StoreError(f"cannot open results store {self.path}: {e}") from None


def _create(path: Path) -> None:
    """A new store file with small blocks and its whole schema, made beside `path` and renamed into place: a store
    is there with its tables or not at all (a disk that fills while it is made leaves no store without `runs`).
    DuckDB checkpoints on every close and rewrites whole blocks of each table a write touched: ~0.8 MB per small
    write with its default 256 KB blocks, ~54 KB with 16 KB blocks (BENCHMARKS.md, "Results store writes"). The
    block size is stored in the file; older stores keep theirs."""
    path.unlink(missing_ok=True)  # an empty file (mkstemp, `touch`) holds no data and DuckDB refuses it
    new = path.with_name(f".{path.name}.new-{os.getpid()}")
    try:
        con = duckdb.connect()
        try:
            con.execute(f"ATTACH '{_sql_literal(str(new))}' AS store (BLOCK_SIZE {STORE_BLOCK_SIZE})")
            con.execute("USE store")
            con.execute("BEGIN TRANSACTION")
            _migrate(con, path)
            con.execute("COMMIT")
            con.execute("USE memory")
            con.execute("DETACH store")
        finally:
            con.close()
        os.replace(new, path)
    except BaseException:
        for leftover in (new, new.with_name(new.name + ".wal")):
            leftover.unlink(missing_ok=True)
        raise


def _sql_literal(text: str) -> str:
    return text.replace("'", "''")


def _migrate(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ)"
    )
    (current,) = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone() or (0,)
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"results store {path} has schema version {current}, newer than this a2rl ({SCHEMA_VERSION}); "
            "upgrade a2rl"
        )
    if current < SCHEMA_VERSION:
        backfills = []
        drop_views(con)
        for version in range(current + 1, SCHEMA_VERSION + 1):
            step = MIGRATIONS[version - 1]
            if sql := (step if isinstance(step, str) else step.sql).strip():
                con.execute(sql)
            if isinstance(step, Step):
                backfills.append(step.backfill)
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, utcnow()])
        create_views(con)  # over the current tables: this version's views, whatever the old ones were
        for backfill in backfills:
            backfill(con)
    derived.refresh_missing(con)
    derived_intervals.refresh_missing(con)


def _refresh_derived(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str] | None) -> None:
    """The derived rows of `run_ids` (every run when None), then the intervals of their groups, which use them."""
    derived.refresh(con, run_ids)
    derived_intervals.refresh(con, run_ids)


def _config_columns(config: RunConfig) -> dict[str, Any]:
    """The `runs` columns that come from a RunConfig."""
    return {
        "config_hash": config.config_hash(),
        "task": config.task,
        "variant": config.variant,
        "agent": config.agent,
        "driver": config.driver,
        "mode": config.mode,
        "base_model": config.base_model,
        "seed": config.seed,
        "budget_s": config.budget_s,
        "protocol": config.protocol,
        "config_json": config.model_dump_json(),
    }


def _upsert(
    con: duckdb.DuckDBPyConnection,
    table: str,
    key: tuple[str, ...],
    row: Mapping[str, Any],
    keep_existing: set[str] | frozenset[str] = frozenset(),
    fill_missing: set[str] | frozenset[str] = frozenset(),
) -> None:
    """INSERT ... ON CONFLICT DO UPDATE for the columns in `row`; columns not in `row` are left alone.

    `keep_existing`: a stored non-NULL value wins (first-seen facts). `fill_missing`: the new value wins
    unless it is NULL. Every other column takes the new value. Names come from this module, never users.
    """
    cols = list(row)

    def assign(col: str) -> str:
        if col in keep_existing:
            return f"{col} = coalesce({table}.{col}, excluded.{col})"
        if col in fill_missing:
            return f"{col} = coalesce(excluded.{col}, {table}.{col})"
        return f"{col} = excluded.{col}"

    updates = ", ".join(assign(c) for c in cols if c not in key)
    sql = (
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )
    con.execute(sql, list(row.values()))


ITEM_COLUMNS = ("run_id", "eval_key", "split", "item_id", "score", "correct", "tokens")


def item_rows(run_id: str, eval_key: str, result: EvalResult) -> list[dict[str, Any]]:
    """`item_results` rows of one evaluation: the graded value where the task gives one, else 1/0 for right/wrong.
    An item id seen twice keeps its last result (the key is one row per item)."""
    rows: dict[str, dict[str, Any]] = {}
    for item in result.items:
        if item.value is not None and not math.isfinite(item.value):  # NaN would make the setting's interval NaN
            raise ValueError(f"evaluation {eval_key!r} of run {run_id!r}: item {item.item_id!r} has the value "
                             f"{item.value} (not a number): refused")
        tokens = item.detail.get("generated_tokens")
        rows[item.item_id] = {
            "run_id": run_id, "eval_key": eval_key, "split": result.split, "item_id": item.item_id,
            "score": float(item.value) if item.value is not None else float(item.correct),
            "correct": bool(item.correct), "tokens": int(tokens) if isinstance(tokens, int) else None,
        }  # fmt: skip
    return list(rows.values())


def metric_cells(value: Any) -> tuple[float | None, str | None]:
    """(value, text) cells of one `metrics` row: numbers and booleans as numbers, the rest as text."""
    if value is None:
        return None, None
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, (int, float)):
        return float(value), None
    if isinstance(value, str):
        return None, value
    return None, json.dumps(value, sort_keys=True, default=str)


def add_interval_functions(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """The library's interval helpers as SQL functions of this connection, for ad-hoc queries over a store:
    `t975(df)` (two-sided 95% t quantile, NULL below 1 degree of freedom) and `binomial_se(score, n)`
    (Agresti-Coull, 0-100 scale). The store itself keeps no such macro (its intervals are computed once, in
    Python, and stored: store/derived_intervals.py); these are the same Python functions, not copies."""
    from a2rl_bench.summary.intervals import binomial_se, t975

    con.create_function("t975", lambda df: None if df < 1 else t975(int(df)), ["BIGINT"], "DOUBLE")
    con.create_function("binomial_se", lambda score, n: None if n < 1 else binomial_se(score, int(n)),
                        ["DOUBLE", "BIGINT"], "DOUBLE")  # fmt: skip
    return con
