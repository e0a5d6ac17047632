"""The `merge-stores` flow: every host's finished runs into the central results store (a2rl_bench.store.merge), as a
deployment the server can schedule; the same as `a2rl store merge`."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from a2rl_bench.safetext import cells
from a2rl_bench.run_options import DEFAULT_RESULTS, resolve_results
from a2rl_bench.ops.prefect_local import server_flow_run_lookup
from a2rl_bench.store.merge import HOSTS_PATTERN, expand_sources, merge_stores


@flow(name="merge-stores")
def merge_stores_flow(into: Path = DEFAULT_RESULTS, sources: list[str] | None = None) -> dict[str, int]:
    """Merge the host stores `sources` (paths or glob patterns, relative ones from the repository root; default
    results/hosts/*/a2rl.duckdb) into `into`. Fails, after the table artifact, if a run directory was refused."""
    logger = get_run_logger()
    into = resolve_results(into)
    patterns = sources or [HOSTS_PATTERN]
    found = expand_sources([str(resolve_results(p)) for p in patterns], into)
    if not found:
        logger.info("no host store matches %s: nothing to merge", patterns)
        return {}
    report = merge_stores(into, found, flow_runs=server_flow_run_lookup())
    logger.info("%s", report.summary())
    rows = [{"run": o.run_id, "host store": o.source, "outcome": o.status, "detail": o.detail} for o in report.notable()]
    create_table_artifact(cells(rows) or [{"run": None, "outcome": "all unchanged"}], key="merge-report",
                          description=report.summary())  # fmt: skip
    if report.refused:
        raise RuntimeError(f"{len(report.refused)} run(s) refused: " + "; ".join(
            f"{o.run_id} ({o.source}): {o.detail}" for o in report.refused))  # fmt: skip
    return {status: report.count(status) for status in ("merged", "unchanged", "superseded", "unfinished")}
