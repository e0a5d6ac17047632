"""Run a run's grading service as its own process: `python -m a2rl_bench.tasks.serve_grading --harness-dir ... --workspace ...`.

The benchmark flow normally hosts the service in-process; this entry point serves a run directory on its
own (after a crash, or for an agent started by hand). Restarting it on the same harness directory resumes
the evaluations the previous process left unfinished. It lives in `tasks` because it resolves the run's task.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path

from a2rl_bench.grading.clock import BudgetClock
from a2rl_bench.grading.server import GradingServer
from a2rl_bench.grading.service import GradingContext, GradingService, grading_devices
from a2rl_bench.records import RunConfig
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.benchmarks import get_task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m a2rl_bench.tasks.serve_grading", description=__doc__)
    parser.add_argument("--harness-dir", type=Path, required=True, help="run's harness dir (ledger lives here)")
    parser.add_argument("--workspace", type=Path, required=True, help="run's workspace")
    parser.add_argument("--config", type=Path, required=True, help="RunConfig as JSON")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--base-model-dir", type=Path, required=True,
                        help="the run's base model: submissions must match it, and its tokenizer and chat template "
                             "render every prompt (a submission's own are never used)")  # fmt: skip
    parser.add_argument("--token-file", type=Path, required=True, help="file holding the bearer token")
    parser.add_argument("--port-file", type=Path, required=True, help="the chosen port is written here")
    parser.add_argument("--results", type=Path, default=None,
                        help="the run's results store: every ledger entry's head is anchored there and its row "
                             "recorded, as the flow's own grader does (without it, what this process appends cannot "
                             "be verified, and the run's summary withholds its numbers)")  # fmt: skip
    args = parser.parse_args(argv)

    config = RunConfig.model_validate_json(args.config.read_text())
    ctx = GradingContext(args.run_id, config, args.workspace, args.harness_dir,
                         base_model_dir=args.base_model_dir, devices=grading_devices(config.grading_workers),
                         store=ResultsStore(args.results) if args.results else None, task=get_task(config.task))
    service = GradingService(ctx, BudgetClock(config.budget_s))
    service.clock.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with GradingServer(service, token=args.token_file.read_text().strip(),
                       request_log=args.harness_dir / "requests.jsonl") as server:
        args.port_file.write_text(json.dumps({"port": server.port, "url": server.url}))
        stop.wait()
        service.close()


if __name__ == "__main__":
    main()
