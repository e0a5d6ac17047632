"""One results store over several hosts: each host's finished runs merged into a central store.

DuckDB has one writer per file, and a file on a network file system is no place for several hosts to write. So
each host's runs write the host's own store (`A2RL_HOST_RESULTS` on its workers), and one process (the merge: `a2rl
store merge`, the `merge-stores` deployment, or a sweep's `merge_from`) is the central store's only writer.

The merge does not copy rows. For every finished run of a host's store it finds the run directory (under `runs/`
beside the host's store, as in a copy of the host's results directory, else where the host recorded it),
checks that the report's ledger head carries a MAC under a key this machine trusts (its own, or the host's,
registered with `a2rl store trust-host`), adopts the ledger heads the host's store anchored, and rebuilds the
run's rows from the directory with `a2rl_bench.store.ingest.ingest_run_dir`, which verifies the ledger against those
anchors and the run's report. All of it in one transaction: a torn or tampered run directory is refused and
leaves the central store as it was. A run that cannot be told (no MAC, an unregistered key) is refused unless the
merge is `--unverified`; then it is marked in every table (its `variant` reads `... [UNVERIFIED]`, a setting of
its own) and never replaces a verified run or its anchors.

A run can have several attempts on several hosts: a flow run retried after its host died starts the run over
elsewhere under the same run id. Per run id the best attempt is merged: completed before failed before
interrupted, then the later one. An attempt still `running` in its host's store is a live run, or one whose host
died with it: the Prefect server tells them apart (its flow run Crashed, Failed or Cancelled, or a later attempt
of it started). An attempt that is over and has nothing better is recorded as `crashed`: the host's row with its
flow run, attempt and Prefect state, never its scores (no leaderboard or Δ counts it); a live one is not merged.
Merging twice changes nothing: an attempt whose anchored head and status the central store already holds is left
alone.
"""

from __future__ import annotations

import glob
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Literal

import duckdb

from a2rl_bench.ops.prefect_api import FlowRunState
from a2rl_bench.paths import HOSTS_PATTERN
from a2rl_bench.store.results import ResultsStore, StoreError
from a2rl_bench.summary.record import RunRecord, read_run_record

STATUS_RANK = {"completed": 3, "failed": 2, "interrupted": 1}
"""Finished statuses; a higher one wins over a later attempt with a lower one."""
MergeStatus = Literal["merged", "unchanged", "refused", "unfinished", "superseded", "crashed"]
EARLIEST = datetime.min.replace(tzinfo=timezone.utc)
OUTCOME_ORDER: tuple[MergeStatus, ...] = ("merged", "unchanged", "crashed", "superseded", "unfinished", "refused")
FLOW_RUN_COLUMNS = ("flow_run_id", "attempts", "prefect_state")
"""What a host's row says about the run's flow run (schema migration 9); the merge carries them over."""


FlowRunLookup = Callable[[list[str]], dict[str, FlowRunState]]
"""flow-run ids → what the server says of each (missing: unknown). a2rl_bench.ops.status.flow_run_states is one."""


class MergeRefused(ValueError):
    """The run directory does not match what its host's store recorded: not merged."""


@dataclass
class Attempt:
    """One host's attempt at one run: its row in the host's store and the ledger heads anchored there."""

    run_id: str
    source: Path
    status: str
    started_at: datetime | None
    harness_dir: str | None
    heads: list[tuple[int, str, Any]] = field(default_factory=list)
    flow_run: dict[str, Any] = field(default_factory=dict)
    """The host row's FLOW_RUN_COLUMNS (those it has)."""

    @property
    def first_hash(self) -> str | None:
        """The hash of the ledger's first line: which attempt this is (a fresh start elsewhere has another)."""
        return self.heads[0][1] if self.heads and self.heads[0][0] == 0 else None

    @property
    def last_head(self) -> tuple[int, str] | None:
        return (int(self.heads[-1][0]), self.heads[-1][1]) if self.heads else None

    def rank(self) -> tuple[int, datetime]:
        return STATUS_RANK.get(self.status, 0), self.started_at or EARLIEST

    def same_attempt(self, other: Attempt) -> bool:
        return self.first_hash is not None and self.first_hash == other.first_hash


@dataclass
class MergeOutcome:
    run_id: str
    source: str
    status: MergeStatus
    detail: str = ""


@dataclass
class MergeReport:
    into: Path
    sources: list[Path]
    outcomes: list[MergeOutcome] = field(default_factory=list)

    def count(self, status: MergeStatus) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def refused(self) -> list[MergeOutcome]:
        return [o for o in self.outcomes if o.status == "refused"]

    def summary(self) -> str:
        counts = ", ".join(f"{self.count(s)} {s}" for s in OUTCOME_ORDER)
        return f"{len(self.sources)} host store(s) into {self.into}: {counts}"

    def notable(self) -> list[MergeOutcome]:
        """Every outcome but `unchanged`, refusals first."""
        return sorted((o for o in self.outcomes if o.status != "unchanged"),
                      key=lambda o: (-OUTCOME_ORDER.index(o.status), o.run_id, o.source))  # fmt: skip


def expand_sources(patterns: list[str] | list[Path], into: Path | str) -> list[Path]:
    """The host stores the patterns (paths or globs) name, without `into` itself, each once, sorted."""
    central = Path(into).expanduser().resolve()
    found = {Path(p).resolve() for pattern in patterns for p in glob.glob(str(Path(pattern).expanduser()))}
    return sorted(p for p in found if p.is_file() and p != central)


def merge_stores(into: Path | str, sources: list[Path], unverified: bool = False,
                 flow_runs: FlowRunLookup | None = None) -> MergeReport:
    """Merge the finished runs of every host store in `sources` into the store `into` (created if missing).
    A run is merged when its report's ledger head carries a MAC under a key this machine trusts (its own, or a
    host's registered with `a2rl store trust-host`); one that cannot be told is refused unless `unverified`,
    which takes it marked (`ingest.unverified_variant`, metric `ledger_verification`) and never in place of a
    verified run. `flow_runs` says which `running` attempts are over (`a2rl_bench.ops.status.server_flow_run_lookup`
    asks the Prefect server; None: nobody to ask, so they stay unfinished)."""
    report = MergeReport(Path(into).expanduser().resolve(), list(sources))
    attempts: list[Attempt] = []
    for source in sources:
        try:
            attempts += read_attempts(source)
        except (StoreError, OSError, ValueError, duckdb.Error) as e:  # one unreadable copy must not stop the others
            report.outcomes.append(MergeOutcome("*", str(source), "refused", f"cannot read the store: {_line(e)}"))
    if not attempts:
        return report
    central = ResultsStore(report.into)
    merged = {a.run_id: a for a in read_attempts(report.into, central)}
    unverified_held = _unverified_runs(central)
    by_run: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_run[a.run_id].append(a)
    ended = _ended_attempts([a for a in attempts if a.status not in STATUS_RANK], flow_runs)
    for run_id in sorted(by_run):
        held = merged.get(run_id)
        report.outcomes += _merge_run(central, by_run[run_id], held, ended, unverified,
                                      held_verified=held is not None and run_id not in unverified_held)  # fmt: skip
    return report


def _unverified_runs(central: ResultsStore) -> set[str]:
    from a2rl_bench.store.ingest import VERIFICATION_METRIC

    rows = central.query("SELECT run_id FROM metrics WHERE name = ? AND text = 'unverified'", [VERIFICATION_METRIC])
    return set(rows["run_id"])


def read_attempts(path: Path, store: ResultsStore | None = None) -> list[Attempt]:
    """Every run in a store with its anchored ledger heads."""
    store = store or ResultsStore(path, read_only=True)
    runs = store.query("SELECT * FROM runs")  # a host on an older schema has no FLOW_RUN_COLUMNS
    heads: dict[str, list[tuple[int, str, Any]]] = defaultdict(list)
    for row in store.ledger_heads().itertuples(index=False):
        heads[row.run_id].append((int(row.seq), row.line_hash, row.recorded_at))
    return [Attempt(r["run_id"], Path(path), r["status"], _time(r["started_at"]), r["harness_dir"],
                    heads.get(r["run_id"], []), {c: _value(r[c]) for c in FLOW_RUN_COLUMNS if c in r})
            for r in runs.to_dict("records")]  # fmt: skip


def _merge_run(central: ResultsStore, attempts: list[Attempt], held: Attempt | None, ended: dict[int, str],
               unverified: bool = False, held_verified: bool = False) -> list[MergeOutcome]:  # fmt: skip
    out: list[MergeOutcome] = []
    finished = [a for a in attempts if a.status in STATUS_RANK]
    for a in attempts:
        if a.status not in STATUS_RANK and id(a) not in ended:
            out.append(MergeOutcome(a.run_id, str(a.source), "unfinished",
                                    f"{a.status} on its host: still going, or its host died mid-run (then retry its "
                                    "flow run: another host starts it over)"))  # fmt: skip
    if not finished:
        over = [a for a in attempts if id(a) in ended]
        if over:
            out.append(_record_crashed(central, max(over, key=Attempt.rank), held, ended))
        return out
    best = max(finished, key=Attempt.rank)
    others = [a for a in finished if a is not best]
    if held is not None and not held.same_attempt(best) and held.rank() > best.rank():
        best, others = None, finished  # the central store already has a better or later attempt
    for a in others:
        where = f"the attempt from {best.source}" if best else "the attempt already in the store"
        out.append(MergeOutcome(a.run_id, str(a.source), "superseded", f"{a.status}; {where} wins"))
    for a in attempts:  # a `running` attempt that is over, with a finished one of its run: it lost
        if id(a) in ended:
            winner = best.status if best else "the attempt already in the store"
            out.append(MergeOutcome(a.run_id, str(a.source), "superseded", f"{ended[id(a)]}; {winner} wins"))
    if best is None:
        return out
    if held is not None and held.same_attempt(best) and held.last_head == best.last_head and held.status == best.status:
        out.append(MergeOutcome(best.run_id, str(best.source), "unchanged"))
        return out
    try:
        verified = _merge_attempt(central, best, unverified, held_verified)
    except MergeRefused as e:
        out.append(MergeOutcome(best.run_id, str(best.source), "refused", _line(e)))
    else:
        note = "" if verified else "UNVERIFIED (--unverified): marked in every table, CSV and figure"
        out.append(MergeOutcome(best.run_id, str(best.source), "merged", note))
    return out


def ledger_trust(record: RunRecord | None, run_id: str) -> bool | None:
    """Whether the run's record carries a MAC of its ledger head under a key this machine trusts: True, False
    (forged or altered), None (cannot tell: no report or MAC, or a key not registered here). The host store's
    anchors do not count: a copy of that store can be rewritten together with the run directory."""
    from a2rl_bench.grading.ledger import LedgerHead, mac_matches

    recorded = record.ledger if record else None
    if not recorded or not recorded.entries or not recorded.head_hash or not recorded.head_mac:
        return None
    return mac_matches(run_id, LedgerHead(recorded.entries, recorded.head_hash), recorded.head_mac)


def _merge_attempt(central: ResultsStore, a: Attempt, unverified: bool = False, held_verified: bool = False) -> bool:
    """Adopt the host's anchors and rebuild the run's rows from its directory, in one transaction, once its ledger
    verifies under a trusted key (`ledger_trust`); returns whether it did (False: taken with `unverified`)."""
    from a2rl_bench.grading.ledger import LedgerCorrupted
    from a2rl_bench.store.ingest import ingest_run_dir

    harness = locate_harness(a)
    report = harness / "report.json"
    if a.status == "completed" and not report.is_file():
        raise MergeRefused(f"{harness} has no report.json, though its host's store says completed: "
                           "an incomplete copy? copy the run directory again")  # fmt: skip
    try:  # the run's record, read once: an unreadable or too new one is refused here, with its reason
        record = read_run_record(report) if report.is_file() else None
    except (OSError, ValueError) as e:
        raise MergeRefused(f"{harness}: {_line(e)}") from e
    trust = ledger_trust(record, a.run_id)
    if trust is False:
        raise MergeRefused(f"{harness}: the report's ledger head does not match its MAC: the ledger and its report "
                           "were changed after the harness wrote them")  # fmt: skip
    if trust is None and not unverified:
        raise MergeRefused(f"{harness}: cannot be verified: its report carries no MAC under a key this machine "
                           "trusts (register the host's key: `a2rl store trust-host <its A2RL_HOME/ledger.key>`; or "
                           "merge with --unverified to take it, marked unverified)")  # fmt: skip
    if trust is None and held_verified:
        raise MergeRefused("an unverified copy never replaces the verified run this store holds (nor its anchors)")
    try:
        with central.batch():
            if trust:
                central.adopt_ledger_heads(a.run_id, a.heads)
                ingest_run_dir(central, harness)
            else:  # checked against nothing but itself: ingested without anchors, then the host's kept beside it
                central.adopt_ledger_heads(a.run_id, [])
                ingest_run_dir(central, harness, unverified_ok=True)
                central.adopt_ledger_heads(a.run_id, a.heads)
            if any(a.flow_run.values()):  # the rebuilt row knows nothing of Prefect; the host's row does
                central.bulk_write("runs", _frame([{"run_id": a.run_id, **a.flow_run}]))
            got = central.get_run(a.run_id)
            if got is None or got["status"] != a.status:
                raise MergeRefused(f"{harness} says {got and got['status']}, its host's store {a.status}")
    except MergeRefused:
        raise
    except (LedgerCorrupted, OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise MergeRefused(f"{harness}: {_line(e)}") from e
    return bool(trust)


def locate_harness(a: Attempt) -> Path:
    """`runs/<run_id>/harness` beside the host's store (a copy of its results directory is copied as one), else
    where the host recorded it (run directories on shared storage)."""
    candidates = [a.source.parent / "runs" / a.run_id / "harness"]
    if a.harness_dir and Path(a.harness_dir) != candidates[0]:
        candidates.append(Path(a.harness_dir))
    for harness in candidates:
        if (harness / "manifest.json").is_file():
            return harness
    raise MergeRefused("run directory not found (looked in " + ", ".join(str(c) for c in candidates) + "): copy "
                       "the host's run directories beside its store, under runs/")  # fmt: skip


# -- attempts that ended on their host without a word (crashed) ---------------------------------------------
def _ended_attempts(unfinished: list[Attempt], flow_runs: FlowRunLookup | None) -> dict[int, str]:
    """id(attempt) → why it is over, for each `running` attempt the Prefect server shows to be over: its flow
    run ended Crashed, Failed or Cancelled, or a later attempt of it started. Unknown ones (no server, no flow
    run recorded) stay unfinished."""
    known = [a for a in unfinished if a.flow_run.get("flow_run_id")]
    if not known:
        return {}
    states = flow_runs(sorted({a.flow_run["flow_run_id"] for a in known})) if flow_runs else {}
    ended = {}
    for a in known:
        now = states.get(a.flow_run["flow_run_id"])
        attempt = int(a.flow_run.get("attempts") or 0)
        if now is None:
            continue
        if now.run_count > attempt:
            ended[id(a)] = f"attempt {attempt} ended on its host (its flow run is at attempt {now.run_count})"
        elif now.state_type in ("CRASHED", "FAILED", "CANCELLED"):
            ended[id(a)] = f"its flow run is {now.state_name}"
    return ended


def _record_crashed(central: ResultsStore, a: Attempt, held: Attempt | None, ended: dict[int, str]) -> MergeOutcome:
    """The attempt's row as its host left it, marked `crashed`, without scores: a record that it ran, never a
    result. A run the central store holds as finished is left alone."""
    if held is not None and held.status in STATUS_RANK:
        return MergeOutcome(a.run_id, str(a.source), "superseded", f"{ended[id(a)]}; the store holds it {held.status}")
    row = ResultsStore(a.source, read_only=True).query("SELECT * FROM runs WHERE run_id = ?", [a.run_id])
    keep = [c for c in row.columns if c in CRASHED_KEEPS or c in FLOW_RUN_COLUMNS]
    record = {c: _value(v) for c, v in row[keep].to_dict("records")[0].items()}
    state = a.flow_run.get("prefect_state")
    record |= {"status": "crashed", "prefect_state": "Crashed" if state in (None, "Running") else state,
               "error": f"crashed on its host: {ended[id(a)]}"}
    if held is not None and held.status == "crashed" and all(held.flow_run.get(c) == record.get(c)
                                                              for c in FLOW_RUN_COLUMNS):  # fmt: skip
        return MergeOutcome(a.run_id, str(a.source), "unchanged")
    with central.batch():
        central.replace_run(a.run_id, {"runs": _frame([record])})
    return MergeOutcome(a.run_id, str(a.source), "crashed", ended[id(a)])


CRASHED_KEEPS = {"run_id", "config_hash", "task", "variant", "agent", "driver", "mode", "base_model", "protocol",
                 "seed", "budget_s", "config_json", "variant_label", "harness_dir", "started_at", "updated_at"}
"""What a crashed attempt's row carries over: what ran, where and when; no score."""


def _frame(rows: list[dict[str, Any]]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows)


def _value(value: Any) -> Any:
    """A pandas cell as a plain value (NaN/NaT → None)."""
    if value is None or (not isinstance(value, str) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


def _time(value: Any) -> datetime | None:
    if value is None or value != value:  # None or NaT
        return None
    value = value.to_pydatetime() if hasattr(value, "to_pydatetime") else value
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())[:400]
