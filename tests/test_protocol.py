"""The protocol's rules, once each (a2rl_bench/protocol): their behaviour (ties, no submission, failed submissions,
paper against heldout), that every caller uses them, and that no copy of them is left elsewhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from a2rl_bench.protocol.breaches import breaks_mode, mode_breaches
from a2rl_bench.protocol.feedback import feedback_split, scored_on_test_in_session, split_baseline
from a2rl_bench.protocol.picking import (BASE_SELECTION, BEST_SELECTION, DECLARED_SELECTION, PAPER_SELECTION,
                                   baseline_test_evaluation, best_so_far, best_submission, final_entry,
                                   final_evaluation_key, final_pick, final_test_evaluation, gain_over_base,
                                   latest_submissions, pick_best)
from a2rl_bench.records import LedgerEntry

ROOT = Path(__file__).resolve().parents[1]
RUN = "protocol-run"


class Ledger:
    """Ledger lines in order, as the grader appends them."""

    def __init__(self) -> None:
        self.entries: list[LedgerEntry] = []

    def add(self, **fields) -> None:
        self.entries.append(LedgerEntry(seq=len(self.entries), run_id=RUN, **fields))

    def sub(self, sid: int, split: str = "validation", score: float | None = None, status: str = "scored",
            **detail) -> None:
        self.add(kind="submission", submission_id=sid, split=split, status="queued", detail=detail)
        self.add(kind="submission", submission_id=sid, split=split, status=status, score=score, detail=detail)


def test_feedback_split_is_validation_unless_paper():
    assert feedback_split("heldout") == "validation"
    assert feedback_split("paper") == "test"


def test_the_latest_line_of_each_submission_counts():
    led = Ledger()
    led.sub(2, score=3.0)
    led.sub(1, score=5.0)
    led.add(kind="submission", submission_id=3, split="validation", status="queued")
    assert [(e.submission_id, e.status) for e in latest_submissions(led.entries)] == [
        (1, "scored"), (2, "scored"), (3, "queued")]


def test_best_ties_go_to_the_earliest_and_failures_never_count():
    led = Ledger()
    led.sub(1, score=7.0)
    led.sub(2, score=9.0)
    led.sub(3, status="error")
    led.sub(4, score=9.0)
    led.sub(5, split="test", score=99.0)  # another split's score is not a validation best
    assert best_submission(led.entries, "validation").submission_id == 2
    assert best_submission(led.entries, "test").submission_id == 5
    assert pick_best([("b", 1.0, 2), ("a", 1.0, 1)], lambda c: c[1], lambda c: c[2])[0] == "a"


def test_no_scored_submission_means_no_best_and_the_base_model_as_final():
    led = Ledger()
    assert best_submission(led.entries, "validation") is None
    led.sub(1, status="error")
    assert best_submission(led.entries, "validation") is None
    pick = final_pick(led.entries, "heldout")
    assert pick.entry is None and pick.selection == BASE_SELECTION
    paper = final_pick(led.entries, "paper")
    assert paper.entry is None and paper.selection == PAPER_SELECTION
    assert pick_best([], float, int) is None


def test_heldout_final_pick_is_the_declared_scored_submission_else_the_best():
    led = Ledger()
    led.sub(1, score=4.0)
    led.sub(2, score=8.0)
    led.sub(3, status="error")
    assert (final_pick(led.entries, "heldout").entry.submission_id, final_pick(led.entries, "heldout").selection) == (
        2, BEST_SELECTION)
    led.add(kind="event", detail={"event": "final-pick", "submission_id": 1})
    pick = final_pick(led.entries, "heldout")
    assert (pick.entry.submission_id, pick.selection) == (1, DECLARED_SELECTION)
    led.add(kind="event", detail={"event": "final-pick", "submission_id": 3})  # failed: the best stands
    assert final_pick(led.entries, "heldout").entry.submission_id == 2


def test_paper_final_pick_is_the_best_test_score_whatever_was_declared():
    led = Ledger()
    led.sub(1, split="test", score=6.0)
    led.sub(2, split="test", score=5.0)
    led.add(kind="event", detail={"event": "final-pick", "submission_id": 2})
    pick = final_pick(led.entries, "paper")
    assert (pick.entry.submission_id, pick.selection) == (1, PAPER_SELECTION)


def test_the_final_entry_and_where_its_items_are():
    led = Ledger()
    assert final_entry(led.entries) is None
    led.add(kind="final", split="test", status="scored", score=3.0, submission_id=2)
    final = final_entry(led.entries)
    assert final.score == 3.0
    assert final_evaluation_key("heldout", final) == "final-2-test"
    assert final_evaluation_key("paper", final) == "submission-2-test"
    led.add(kind="final", split="test", status="scored", score=1.0)
    assert final_evaluation_key("heldout", final_entry(led.entries)) == "final-0-test"


def test_a_breach_is_a_flagged_submission_counted_once():
    led = Ledger()
    led.sub(1, score=1.0, mode_ok=True)
    led.sub(2, score=1.0, mode_ok=False)
    led.sub(3, score=1.0)  # not checked: no breach
    assert [e.submission_id for e in mode_breaches(led.entries)] == [2]
    assert breaks_mode({"mode_ok": False}) and not breaks_mode(None) and not breaks_mode({"mode_ok": None})


def test_the_session_scores_the_test_set_only_under_paper_and_a_gain_is_measured_on_its_split():
    assert scored_on_test_in_session("paper") and not scored_on_test_in_session("heldout")
    assert not scored_on_test_in_session(None)
    assert split_baseline("test", 10.0, 20.0) == 20.0 and split_baseline("validation", 10.0, 20.0) == 10.0
    assert split_baseline(None, 10.0, 20.0) == 10.0


def test_best_so_far_holds_the_best_score_and_the_gain_never_goes_below_the_base_model():
    assert best_so_far([None, 12.0, 9.0, None, 15.0]) == [None, 12.0, 12.0, 12.0, 15.0]
    assert gain_over_base(12.0, 10.0) == 2.0 and gain_over_base(8.0, 10.0) == 0.0
    assert gain_over_base(None, 10.0) == 0.0 and gain_over_base(12.0, None) == 0.0


def test_the_final_picks_test_items_come_from_its_final_evaluation_or_under_paper_its_own():
    evals = [("baseline", None, "test", "baseline-0-test"), ("submission", 2, "test", "submission-2-test"),
             ("submission", 2, "validation", "submission-2-validation"), ("final", 2, "test", "final-2-test")]
    assert final_test_evaluation("heldout", 2, evals) == "final-2-test"
    assert final_test_evaluation("paper", 2, evals[:3]) == "submission-2-test"
    assert final_test_evaluation("heldout", 2, evals[:3]) is None  # heldout: a submission's own test run is not it
    assert final_test_evaluation("paper", None, evals[:3]) is None
    assert baseline_test_evaluation(evals) == "baseline-0-test" and baseline_test_evaluation(evals[1:]) is None


# ---- every caller uses the rules, and no copy is left ------------------------------------------------------

CALLERS = {
    "a2rl_bench.protocol.feedback": {"feedback_split": ["a2rl_bench/summary/headline.py",
                                                  "a2rl_bench/summary/process_facts.py",
                                                  "a2rl_bench/grading/service.py", "a2rl_bench/store/derived.py",
                                                  "analysis/tables.py"],
                               "scored_on_test_in_session": ["tasks/run_steps.py"],
                               "split_baseline": ["a2rl_bench/store/derived.py"]},
    "a2rl_bench.protocol.picking": {
        "latest_submissions": ["a2rl_bench/summary/headline.py", "a2rl_bench/summary/process_facts.py",
                               "a2rl_bench/grading/service.py", "a2rl_bench/summary/record.py",
                               "a2rl_bench/summary/stages.py", "a2rl_bench/store/ingest.py", "tasks/run_steps.py"],
        "best_submission": ["a2rl_bench/summary/headline.py", "a2rl_bench/summary/process_facts.py",
                            "a2rl_bench/grading/service.py"],
        "final_pick": ["tasks/run_steps.py"],
        "best_so_far": ["a2rl_bench/summary/process_facts.py", "a2rl_bench/store/derived.py"],
        "gain_over_base": ["a2rl_bench/store/derived.py"],
        "final_test_evaluation": ["a2rl_bench/store/derived.py"],
        "baseline_test_evaluation": ["a2rl_bench/store/derived.py"],
        "final_entry": ["a2rl_bench/summary/headline.py", "a2rl_bench/summary/process_facts.py"],
        "pick_best": ["a2rl_bench/summary/stages.py"],
    },
    "a2rl_bench.protocol.breaches": {"mode_breaches": ["a2rl_bench/summary/headline.py"],
                                     "breaks_mode": ["a2rl_bench/ops/progress.py"]},
}


def _imports(path: Path) -> set[tuple[str, str]]:
    tree = ast.parse(path.read_text())
    return {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}


@pytest.mark.parametrize("module", sorted(CALLERS))
def test_the_callers_import_the_rule(module):
    missing = [f"{path} does not import {name} from {module}"
               for name, paths in CALLERS[module].items() for path in paths
               if (module, name) not in _imports(ROOT / path)]  # fmt: skip
    assert missing == []


COPIES = {
    "the feedback split": re.compile(r'"test" if .*"paper"|"paper" else "validation"|== "paper", "test"'),
    "the session scored on the test set": re.compile(r'config\.protocol == "paper"'),
    "the best so far": re.compile(r"max\(running, "),
    "the split's baseline": re.compile(r'baseline_test if \w+ == "test"'),
    "the best pick (ties to the earliest)": re.compile(r"-\w+\.submission_id\)"),
    "the latest line per submission": re.compile(r"latest\[\w+\.submission_id\] = "),
    "the final entry": re.compile(r'e\.kind == "final" and e\.score is not None'),
    "the breach flag": re.compile(r'\.get\("mode_ok"\) is False'),
}


def test_no_copy_of_a_rule_outside_the_protocol_package():
    files = [p for pkg in ("a2rl_bench", "tasks", "flows", "analysis", "agents", "benchmarks", "blocks")
             for p in (ROOT / pkg).rglob("*.py") if "protocol" not in p.relative_to(ROOT).parts[:2]]
    copies = [f"{p.relative_to(ROOT)}:{n}: a copy of {rule}" for p in files
              for n, line in enumerate(p.read_text().splitlines(), 1)
              for rule, pattern in COPIES.items() if pattern.search(line)]  # fmt: skip
    assert copies == []


# The same rules written in SQL: the views and macros a store has now (the migrations that made older ones are
# history, never edited) must join the numbers `a2rl_bench.store.derived` computed with the rules above.
SQL_COPIES = {  # matched against the SQL with its parentheses dropped (DuckDB stores views re-parenthesised)
    "the feedback split": re.compile(r"protocol = 'paper' THEN 'test'", re.I),
    "the split's baseline": re.compile(r"split = 'test' THEN \w*\.?baseline_test", re.I),
    "the best so far": re.compile(r"max \w*\.?score OVER", re.I),
    "the final pick's evaluation": re.compile(r"kind = 'final' (OR|DESC)", re.I),
    "the gain floored at 0": re.compile(r"greatest coalesce (max )?\w*\.?(score|best_so_far) -", re.I),
    # the interval maths of `a2rl_bench.summary.intervals`, stored per setting by `a2rl_bench.store.derived_intervals`
    "the t quantile": re.compile(r"\bt975\b|12\.706"),
    "the normal z of a 95% interval": re.compile(r"\b1\.96\b"),
    "the binomial standard error": re.compile(r"\bbinomial_se\b|\* 1(\.0)? - \w", re.I),
    "a standard error or half-width (a square root)": re.compile(r"\bsqrt\b", re.I),
    "a variance over seeds or items": re.compile(r"\bvar_samp\b", re.I),
}


CATALOG_SQL = ("SELECT view_name AS name, sql FROM duckdb_views() WHERE NOT internal UNION ALL "
               "SELECT function_name, macro_definition FROM duckdb_functions() WHERE function_type = 'macro' "
               "AND NOT internal")


def _sql_copies(rows: list[tuple[str, str]]) -> list[str]:
    return [f"{name}: a copy of {rule}" for name, text in rows for rule, pattern in SQL_COPIES.items()
            if pattern.search(" ".join(re.sub(r"[()]", " ", str(text)).split()))]  # fmt: skip


def test_no_copy_of_a_rule_in_the_stores_sql(tmp_path):
    import duckdb

    from a2rl_bench.store.results import ResultsStore

    store = ResultsStore(tmp_path / "a2rl.duckdb")
    sql = store.query(CATALOG_SQL)
    assert {"scaling_curve", "item_pairs", "budget_deltas", "setting_intervals", "noise_floor"} <= set(sql["name"])
    assert _sql_copies(list(zip(sql["name"], sql["sql"]))) == []
    with duckdb.connect() as con:  # the scan finds each copy where version 10's views still held it
        con.execute((Path(__file__).with_name("data") / "store_schema_v10.sql").read_text())
        found = " ".join(_sql_copies(con.execute(CATALOG_SQL).fetchall()))
    assert [rule for rule in SQL_COPIES if rule not in found] == []


# The interval maths written again in Python (a z, a t quantile, a standard error): `a2rl_bench.summary.intervals` is
# its one home; the places that compute numbers a user reads must call it. The store's SQL is scanned above.
PY_INTERVAL_COPIES = {
    "the normal z of a 95% interval": re.compile(r"\b1\.96\b"),
    "the t quantile": re.compile(r"12\.706|\.ppf\(|\bt\.interval\("),
    "a standard error (a spread over the root of a count)": re.compile(
        r"/\s*(?:math\.|np\.|numpy\.)?sqrt\("  # sd / sqrt(n)
        r"|/\s*\(?[\w.()]+\)?\s*\*\*\s*\(?0?\.5\b"  # sd / n ** 0.5
        r"|sqrt\([^()]*(?:\([^()]*\)[^()]*)*/\s*\w+\)"),  # sqrt(var / n)
    "the binomial standard error": re.compile(r"\*\s*\(\s*1(?:\.0)?\s*-\s*\w+\s*\)\s*/"),
}
NUMBER_PACKAGES = ("a2rl_bench/summary", "a2rl_bench/store", "a2rl_bench/grading", "a2rl_bench/cli", "a2rl_bench/ops",
                   "analysis", "tasks", "flows")
INTERVAL_HOME = "a2rl_bench/summary/intervals.py"
HISTORY = {"a2rl_bench/store/schema.py": "the store's migrations, SQL kept as it ran (the catalog is scanned instead)"}
COMPARISON_ONLY = {("analysis/coverage.py", "t_over_seeds_bounds"): "the old leaderboard's t-interval, for comparison"}


def _python_interval_copies(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        text = path.read_text()
        owner = {}  # line -> enclosing function, for the comparisons kept on purpose
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                owner.update({n: node.name for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)})
        for n, line in enumerate(text.splitlines(), 1):
            code = line.split("#")[0]
            for rule, pattern in PY_INTERVAL_COPIES.items():
                if pattern.search(code) and (rel, owner.get(n)) not in COMPARISON_ONLY:
                    found.append(f"{rel}:{n}: a copy of {rule}")
    return found


def test_no_copy_of_the_interval_maths_in_python(tmp_path):
    files = [p for pkg in NUMBER_PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    files += sorted((ROOT / "a2rl_bench").glob("*.py"))
    files = [p for p in files if str(p.relative_to(ROOT)) not in {INTERVAL_HOME, *HISTORY}]
    assert _python_interval_copies(files) == []
    planted = tmp_path / "planted.py"  # the scan itself: each way of writing an interval again is found
    planted.write_text("def ci(mean, sd, n, p, var, k):\n    half = 1.96 * sd / n ** 0.5\n"
                       "    se = math.sqrt(var / k)\n    q = scipy.stats.t.ppf(0.975, k - 1)\n"
                       "    b = 100 * sqrt(p * (1 - p) / n)\n    return mean - sd / np.sqrt(len(x))\n")  # fmt: skip
    found = " ".join(_python_interval_copies([planted]))
    assert [rule for rule in PY_INTERVAL_COPIES if rule not in found] == [], found
    assert len(_python_interval_copies([planted])) >= 5
