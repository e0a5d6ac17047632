"""One store over several hosts: `a2rl store merge` of per-host stores and their run directories.

Three hosts' stores and run directories written by the run's own code (tests/run_dirs.py: no agent, made-up scores)
once per module, copied for each test: a run killed on host a and started over on host b under the same run id, a
run interrupted on host c and completed on host b. Fast: no Prefect server.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from a2rl_bench.grading.ledger import Ledger, read_ledger
from a2rl_bench.records import RunConfig
from a2rl_bench.run import make_run_id
from a2rl_bench.store.merge import expand_sources, merge_stores
from a2rl_bench.store.results import ResultsStore
from tests.run_dirs import dump_store, write_run

CONFIGS = {seed: RunConfig(seed=seed, budget_s=60) for seed in range(4)}
FLOW_RUNS = {seed: f"{seed:08x}-0000-4000-8000-000000000000" for seed in range(4)}
RUN_IDS = {seed: make_run_id(CONFIGS[seed], FLOW_RUNS[seed]) for seed in range(4)}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """hosts/{a,b,c}/a2rl.duckdb with runs/ beside each: a completes seed 0 and dies during seed 1; b starts seed 1
    over and completes it, completes seed 2, and completes seed 3 after c's attempt at it was interrupted."""
    root = tmp_path_factory.mktemp("hosts")

    def run(host: str, seed: int, **kw) -> None:
        write_run(root / host / "a2rl.duckdb", root / host / "runs", CONFIGS[seed], FLOW_RUNS[seed], **kw)

    run("a", 0)
    run("a", 1, status=None)  # killed mid-session: the row stays `running`, no report
    run("c", 3, status="interrupted")
    for seed in (1, 2, 3):
        run("b", seed)
    return root


@pytest.fixture
def hosts(template: Path, tmp_path: Path) -> Path:
    shutil.copytree(template, tmp_path / "hosts")
    return tmp_path / "hosts"


def merge(hosts: Path, *names: str):
    central = hosts.parent / "central.duckdb"
    return merge_stores(central, [hosts / n / "a2rl.duckdb" for n in names or ("a", "b", "c")]), central


def outcomes(report) -> set[tuple[str, str, str]]:
    return {(o.run_id, Path(o.source).parent.name, o.status) for o in report.outcomes}


def test_every_hosts_runs_merge_into_one_completed_row_per_configuration_and_merging_again_changes_nothing(hosts):
    for workspace in hosts.glob("*/runs/*/workspace"):  # copies of the harness directories are enough
        shutil.rmtree(workspace)
    report, central = merge(hosts)
    assert outcomes(report) == {
        (RUN_IDS[0], "a", "merged"), (RUN_IDS[1], "a", "unfinished"), (RUN_IDS[1], "b", "merged"),
        (RUN_IDS[2], "b", "merged"), (RUN_IDS[3], "b", "merged"), (RUN_IDS[3], "c", "superseded"),
    }  # fmt: skip
    with duckdb.connect(str(central), read_only=True) as con:  # plain SQL sees every host's runs
        rows = con.execute("SELECT run_id, config_hash, status, harness_dir FROM runs ORDER BY seed").fetchall()
        n_setting_runs = con.execute("SELECT sum(n) FROM leaderboard_ci").fetchone()[0]
    assert [r[0] for r in rows] == [RUN_IDS[s] for s in range(4)]
    assert [r[1] for r in rows] == [CONFIGS[s].config_hash() for s in range(4)]
    assert {r[2] for r in rows} == {"completed"} and n_setting_runs == 4
    assert Path(rows[1][3]).is_relative_to(hosts / "b")  # the attempt that completed, not the one host a lost
    assert Path(rows[3][3]).is_relative_to(hosts / "b")

    before = dump_store(central)
    again, _ = merge(hosts)
    assert dump_store(central) == before
    assert {o.status for o in again.outcomes if o.status != "unfinished" and o.status != "superseded"} == {"unchanged"}
    assert again.count("unchanged") == 4

    from a2rl_bench.flows.sweep import completed_hashes

    assert completed_hashes(central) == {c.config_hash() for c in CONFIGS.values()}  # a sweep skips them all


def test_an_attempt_the_store_already_holds_is_not_replaced_by_a_worse_one(hosts):
    merge(hosts, "b")
    report, central = merge(hosts, "c", "a")
    assert (RUN_IDS[3], "c", "superseded") in outcomes(report)  # interrupted: the completed one in the store wins
    assert (RUN_IDS[1], "a", "unfinished") in outcomes(report)
    assert ResultsStore(central).get_run(RUN_IDS[3])["status"] == "completed"


def test_a_tampered_or_torn_run_directory_is_refused_and_leaves_the_store_as_it_was(hosts):
    harness = {s: hosts / host / "runs" / RUN_IDS[s] / "harness" for s, host in ((0, "a"), (2, "b"), (3, "b"))}
    # seed 0: a copy torn mid-line (an interrupted rsync)
    ledger = harness[0] / "ledger.jsonl"
    ledger.write_bytes(ledger.read_bytes()[:-40])
    # seed 2: one score edited in place
    lines = (harness[2] / "ledger.jsonl").read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if '"kind":"submission"' in line and '"status":"scored"' in line)
    lines[k] = lines[k].replace('"score":50.0', '"score":100.0')
    assert '"score":100.0' in lines[k]
    (harness[2] / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    # seed 3: a better final score, written as a whole new consistent chain and report (only the host's anchor knows)
    rewrite_final_score(harness[3], 99.0)

    report, central = merge(hosts, "a", "b")
    refused = {o.run_id: o.detail for o in report.refused}
    assert set(refused) == {RUN_IDS[0], RUN_IDS[2], RUN_IDS[3]}, refused
    assert "cut off" in refused[RUN_IDS[0]]
    assert "hash chain broken" in refused[RUN_IDS[2]]
    assert "does not match its MAC" in refused[RUN_IDS[3]]  # the report's head no longer carries its MAC
    with duckdb.connect(str(central), read_only=True) as con:
        assert con.execute("SELECT run_id FROM runs").fetchall() == [(RUN_IDS[1],)]
        heads = con.execute("SELECT DISTINCT run_id FROM ledger_heads").fetchall()
        children = con.execute("SELECT count(*) FROM evaluations WHERE run_id <> ?", [RUN_IDS[1]]).fetchone()[0]
    assert heads == [(RUN_IDS[1],)] and children == 0  # nothing of a refused run, not even its anchors


def test_a_completed_run_without_its_report_is_an_incomplete_copy(hosts):
    (hosts / "b" / "runs" / RUN_IDS[2] / "harness" / "report.json").unlink()
    report, _ = merge(hosts, "b")
    (refused,) = report.refused
    assert refused.run_id == RUN_IDS[2] and "no report.json" in refused.detail


UNVERSIONED = ("format_version", "provenance", "created_at")
"""What a record of format 0 (report.json before issue 38) lacks."""


def test_a_run_record_of_the_unversioned_format_merges_to_the_same_rows_as_the_current_one(hosts):
    """report.json as every run before issue 38 wrote it (no format version, no provenance) is migrated as it is read:
    its run merges to the very rows of the record the summary step writes now, which carries the manifest's
    provenance."""
    from a2rl_bench.run import Provenance
    from a2rl_bench.summary.record import RUN_RECORD_VERSION, read_run_record

    reports = sorted((hosts / "b" / "runs").glob("*/harness/report.json"))
    current = read_run_record(reports[0])
    assert current.format_version == RUN_RECORD_VERSION and current.created_at is not None
    assert current.provenance == Provenance.of_run(reports[0].parent)  # the manifest's, not a second account
    assert current.provenance.machine.host and current.provenance.packages["duckdb"]
    report, central = merge(hosts, "b")
    rows = dump_store(central)
    for path in reports:
        data = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in data.items() if k not in UNVERSIONED}, indent=2))
    old = read_run_record(reports[0])
    assert old.format_version == RUN_RECORD_VERSION and old.provenance is None and old.summary == current.summary
    central.unlink()
    again, _ = merge(hosts, "b")
    assert outcomes(again) == outcomes(report) and report.count("merged") == 3
    assert dump_store(central) == rows


def test_a_run_record_of_a_newer_format_or_unreadable_is_refused_in_one_line_and_nothing_is_written(hosts):
    from a2rl_bench.store.ingest import ingest_run_dir
    from a2rl_bench.summary.record import RUN_RECORD_VERSION, RecordTooNew

    newer, torn = (hosts / "b" / "runs" / RUN_IDS[s] / "harness" / "report.json" for s in (1, 2))
    newer.write_text(json.dumps(json.loads(newer.read_text()) | {"format_version": RUN_RECORD_VERSION + 1}))
    torn.write_text(torn.read_text()[:200])
    report, central = merge(hosts, "b")
    refused = {o.run_id: o.detail for o in report.refused}
    assert set(refused) == {RUN_IDS[1], RUN_IDS[2]} and report.count("merged") == 1
    assert f"run record format {RUN_RECORD_VERSION + 1} is newer than this harness reads" in refused[RUN_IDS[1]]
    assert "\n" not in refused[RUN_IDS[1]] and refused[RUN_IDS[2]].startswith(str(torn.parent))
    with pytest.raises(RecordTooNew, match="newer than this harness reads"):
        ingest_run_dir(ResultsStore(hosts / "b" / "a2rl.duckdb"), newer.parent)
    with duckdb.connect(str(central), read_only=True) as con:
        assert con.execute("SELECT run_id FROM runs").fetchall() == [(RUN_IDS[3],)]


def test_the_command_line_merges_says_what_it_refused_and_exits_by_it(hosts, capsys):
    from a2rl_bench.cli import main

    central = hosts.parent / "central.duckdb"
    pattern = str(hosts / "*" / "a2rl.duckdb")
    assert main(["store", "merge", "--into", str(central), pattern]) == 0
    out = capsys.readouterr().out
    assert "3 host store(s)" in out and "4 merged" in out and "1 unfinished" in out and "1 superseded" in out
    assert main(["store", "merge", "--into", str(central), pattern]) == 0
    assert "0 merged, 4 unchanged" in capsys.readouterr().out

    shutil.rmtree(hosts / "a" / "runs" / RUN_IDS[0])  # a run directory not copied with its store,
    with duckdb.connect(str(hosts / "a" / "a2rl.duckdb")) as con:  # recorded at a path of its own host
        con.execute("UPDATE runs SET harness_dir = '/srv/a2rl/runs/' || run_id || '/harness'")
    (hosts.parent / "central.duckdb").unlink()
    assert main(["store", "merge", "--into", str(central), pattern]) == 1
    captured = capsys.readouterr()
    assert f"refused     {RUN_IDS[0]}" in captured.out and "run directory not found" in captured.out
    assert "1 run(s) refused" in captured.err
    assert main(["store", "merge", "--into", str(central), str(hosts / "none-*.duckdb")]) == 2
    assert "no host store matches" in capsys.readouterr().err


def test_an_unreadable_host_store_is_refused_whole_and_the_others_merge(hosts):
    (hosts / "c" / "a2rl.duckdb").write_bytes(b"not a duckdb file, or a copy torn mid-write" * 100)
    report, central = merge(hosts)
    (refused,) = report.refused
    assert refused.source.endswith("c/a2rl.duckdb") and "cannot read the store" in refused.detail
    assert report.count("merged") == 4 and ResultsStore(central).get_run(RUN_IDS[3])["status"] == "completed"


def test_sources_are_globbed_deduplicated_and_never_the_target(hosts):
    central = hosts / "a" / "a2rl.duckdb"
    found = expand_sources([str(hosts / "*" / "a2rl.duckdb"), str(hosts / "b" / "a2rl.duckdb")], central)
    assert found == [hosts / "b" / "a2rl.duckdb", hosts / "c" / "a2rl.duckdb"]


def test_a_host_store_is_read_without_being_written(hosts):
    source = hosts / "b" / "a2rl.duckdb"
    before = source.read_bytes()
    merge(hosts, "b")
    assert source.read_bytes() == before


def test_a_worker_with_a_host_store_keeps_its_deployment_runs_there_whatever_store_they_name(monkeypatch, tmp_path):
    from a2rl_bench.run_options import HOST_RESULTS_ENV, run_results

    monkeypatch.delenv(HOST_RESULTS_ENV, raising=False)
    assert run_results(tmp_path / "central.duckdb", deployed=True) == (tmp_path / "central.duckdb", None)
    monkeypatch.setenv(HOST_RESULTS_ENV, str(tmp_path / "host" / "a2rl.duckdb"))
    path, why = run_results(tmp_path / "central.duckdb", deployed=True)
    assert path == tmp_path / "host" / "a2rl.duckdb" and HOST_RESULTS_ENV in why
    # a run started by hand on that host (`a2rl run --results ...`) writes where it was told
    assert run_results(tmp_path / "mine.duckdb", deployed=False) == (tmp_path / "mine.duckdb", None)


def rewrite_final_score(harness: Path, score: float) -> None:
    """A forger who rewrites the ledger end to end (a valid chain) and the report's record of its head."""
    entries = read_ledger(harness / "ledger.jsonl")
    forged = harness / "ledger.forged"
    out = Ledger(forged)
    for e in entries:
        fields = e.model_dump(exclude={"seq", "prev_hash"})
        if e.kind == "final":
            fields["score"] = score
        out.append(**fields)
    forged.replace(harness / "ledger.jsonl")
    report = json.loads((harness / "report.json").read_text())
    head = Ledger(harness / "ledger.jsonl").head()
    report["ledger"].update(entries=head.entries, head_hash=head.hash)
    (harness / "report.json").write_text(json.dumps(report))


def test_the_merge_deployment_names_its_flows_parameters_runs_beside_the_sweeps_and_is_off_until_resumed():
    import inspect

    from a2rl_bench.flows.merge_flow import merge_stores_flow
    from tests.test_run_config import deployments

    merge_dep, nightly = deployments()["merge-stores"], deployments()["nightly-sweep"]
    assert set(merge_dep["parameters"]) <= set(inspect.signature(merge_stores_flow.fn).parameters)
    assert merge_dep["work_pool"]["work_queue_name"] == "sweeps"  # never on a GPU worker's queue
    assert [s["active"] for s in merge_dep["schedules"]] == [False]
    assert merge_dep["parameters"]["sources"] == nightly["parameters"]["config"]["merge_from"]


def _ran_on(store: Path, run_id: str, flow_run_id: str, attempt: int) -> None:
    """What benchmark_run records when an attempt starts (its host then dies: the row stays `running`)."""
    import pandas as pd

    ResultsStore(store).bulk_write("runs", pd.DataFrame([{"run_id": run_id, "flow_run_id": flow_run_id,
                                                          "attempts": attempt, "prefect_state": "Running"}]))


def test_a_run_that_crashed_on_its_host_comes_in_as_crashed_never_as_a_result_and_sql_says_what_to_retry(hosts):
    """#35: once the server shows the attempt over, a run whose host died is in the central store as `crashed`
    (no score, left out of every aggregate), and the README's query lists it with the command that retries it;
    a completed attempt from another host later takes its place."""
    import re

    from a2rl_bench.store.merge import FlowRunState

    _ran_on(hosts / "a" / "a2rl.duckdb", RUN_IDS[1], FLOW_RUNS[1], 1)
    still_running = {FLOW_RUNS[1]: FlowRunState("RUNNING", "Running", 1)}
    report = merge_stores(hosts.parent / "central.duckdb", [hosts / "a" / "a2rl.duckdb"],
                          flow_runs=lambda ids: still_running)
    central = hosts.parent / "central.duckdb"
    assert (RUN_IDS[1], "a", "unfinished") in outcomes(report)  # a live run is not merged
    assert ResultsStore(central).get_run(RUN_IDS[1]) is None

    crashed = lambda ids: {FLOW_RUNS[1]: FlowRunState("CRASHED", "Crashed", 1)}  # noqa: E731
    report = merge_stores(central, [hosts / "a" / "a2rl.duckdb"], flow_runs=crashed)
    assert (RUN_IDS[1], "a", "crashed") in outcomes(report)
    with duckdb.connect(str(central), read_only=True) as con:
        row = con.execute("SELECT status, prefect_state, attempts, flow_run_id, delta_test, final_test, seed "
                          "FROM runs WHERE run_id = ?", [RUN_IDS[1]]).fetchone()  # fmt: skip
        analysed = {r[0] for r in con.execute("SELECT run_id FROM analysed_runs").fetchall()}
        excluded = dict(con.execute("SELECT reason, n_runs FROM excluded_runs").fetchall())
    assert row == ("crashed", "Crashed", 1, FLOW_RUNS[1], None, None, 1)
    assert analysed == {RUN_IDS[0]} and excluded == {"run crashed": 1}
    before = dump_store(central)
    again = merge_stores(central, [hosts / "a" / "a2rl.duckdb"], flow_runs=crashed)
    assert (RUN_IDS[1], "a", "unchanged") in outcomes(again) and dump_store(central) == before

    # The README's query: what ran in the last day, what failed or crashed, and the command to retry each.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (query,) = re.findall(r'con\.sql\("""(SELECT run_id, task, agent, seed, status, prefect_state.*?)"""\)', readme,
                          re.DOTALL)  # fmt: skip
    with duckdb.connect(str(central), read_only=True) as con:
        listed = {r[0]: r for r in con.execute(query).fetchall()}
    assert set(listed) == {RUN_IDS[0], RUN_IDS[1]}
    assert listed[RUN_IDS[1]][4] == "crashed" and listed[RUN_IDS[1]][-1] == f"a2rl retry {FLOW_RUNS[1]}"
    assert listed[RUN_IDS[0]][4] == "completed" and listed[RUN_IDS[0]][-1] is None

    # Retried on host b and completed there: that attempt replaces the crashed record, flow run and all.
    _ran_on(hosts / "b" / "a2rl.duckdb", RUN_IDS[1], FLOW_RUNS[1], 2)
    later = lambda ids: {FLOW_RUNS[1]: FlowRunState("COMPLETED", "Completed", 2)}  # noqa: E731
    report = merge_stores(central, [hosts / n / "a2rl.duckdb" for n in ("a", "b")], flow_runs=later)
    assert (RUN_IDS[1], "b", "merged") in outcomes(report) and (RUN_IDS[1], "a", "superseded") in outcomes(report)
    got = ResultsStore(central).get_run(RUN_IDS[1])
    assert got["status"] == "completed" and got["flow_run_id"] == FLOW_RUNS[1] and got["attempts"] == 2
    again = merge_stores(central, [hosts / n / "a2rl.duckdb" for n in ("a", "b")], flow_runs=later)
    assert {(RUN_IDS[1], "b", "unchanged"), (RUN_IDS[1], "a", "superseded")} <= outcomes(again)  # said every time
