"""Schema fuzzing of the grading API: a live grader, schemathesis against its /openapi.json.

    PYTHONPATH=. .venv/bin/python bench/fuzz_grader.py --seconds 120

Starts a real `GradingServer` on a workspace holding a valid tiny checkpoint (`output/v1`, the schema's
example path) next to hostile entries (a FIFO named like a checkpoint, a link loop, a link out of the
workspace), then runs `schemathesis run` with every check (but positive_data_acceptance) for `--seconds`,
authenticated with the run's token. Evaluation is an offline stand-in (a constant scorer): the fuzzer tests
the HTTP layer and the checkpoint checks, not model inference. The grader's own request log is the count: requests, 5xx, and
statuses that the OpenAPI document does not list for that operation. Prints one table; exit 1 if any 5xx or
undocumented status (or schemathesis itself failed).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from a2rl_bench.inference.evaluation import EvalSpec
from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl_bench.records import EvalResult, RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.tiny_model
from tests.tiny_model import build_tiny_model  # noqa: E402

CHECKS = "all"
EXCLUDED_CHECKS = "positive_data_acceptance"
"""Schema-valid `model_path`s mostly name no checkpoint, and a refused checkpoint is a 400 by design."""


@dataclass
class FuzzResult:
    requests: int
    server_errors: int
    undocumented: list[str]
    statuses: dict[str, int]
    schemathesis_rc: int
    seconds: float
    schemathesis_tail: str

    @property
    def ok(self) -> bool:
        return self.server_errors == 0 and not self.undocumented


def _constant(model_dir: Path, weights_hash: str, spec: EvalSpec, device=None) -> EvalResult:
    """Offline stand-in for inference: the fuzzer is about the API."""
    return EvalResult(task=spec.task, split=spec.split, score=50.0, n=4, n_correct=2, evaluator_id="constant",
                      weights_hash=weights_hash)  # fmt: skip


def _workspace(root: Path, tiny: Path) -> Path:
    ws = root / "workspace"
    shutil.copytree(tiny, ws / "models" / "base")
    shutil.copytree(tiny, ws / "output" / "v1")
    hostile = ws / "output" / "fifo"
    hostile.mkdir()
    os.mkfifo(hostile / "config.json")
    os.mkfifo(hostile / "model.safetensors")
    (ws / "output" / "loop").symlink_to("loop")
    (ws / "output" / "out").symlink_to("/etc")
    return ws


def _documented(schema: dict) -> dict[tuple[str, re.Pattern], set[str]]:
    table = {}
    for path, ops in schema["paths"].items():
        pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$")
        for method, op in ops.items():
            table[(method.upper(), pattern)] = set(op.get("responses", {}))
    return table


def _count(log: Path, schema: dict) -> tuple[int, int, list[str], dict[str, int]]:
    documented = _documented(schema)
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    statuses = collections.Counter(str(x["status"]) for x in lines)
    undocumented = set()
    for x in lines:
        ops = [codes for (method, pattern), codes in documented.items()
               if method == x["method"] and pattern.match(x["route"] or "")]  # fmt: skip
        # Routes or methods outside the document (404/405 from routing) are not operations: not counted.
        if ops and str(x["status"]) not in ops[0] and "default" not in ops[0]:
            undocumented.add(f'{x["method"]} {x["route"][:60]} -> {x["status"]}')
    server_errors = sum(n for code, n in statuses.items() if code.startswith("5") or code == "0")
    return len(lines), server_errors, sorted(undocumented), dict(sorted(statuses.items()))


def run_fuzz(seconds: float, max_examples: int | None = None, workdir: Path | None = None) -> FuzzResult:
    """Fuzz a fresh live grader for about `seconds`; the grader's request log is the record."""
    root = Path(tempfile.mkdtemp(prefix="a2rl-fuzz-", dir=workdir))
    try:
        tiny = build_tiny_model(root / "tiny")
        ws = _workspace(root, tiny)
        harness = root / "harness"
        config = RunConfig(max_submissions=5)
        ctx = GradingContext("fuzz-run", config, ws, harness, {"validation": 10.0}, base_model_dir=tiny)
        service = GradingService(ctx, BudgetClock(3600), evaluate=_constant)
        service.clock.start()
        log = harness / "requests.jsonl"
        start = time.perf_counter()
        with GradingServer(service, request_log=log) as server:
            schema = httpx.get(server.url + "/openapi.json").json()
            cmd = [str(Path(sys.executable).with_name("schemathesis")), "run", server.url + "/openapi.json",
                   "-H", f"Authorization: Bearer {server.token}", "--checks", CHECKS,
                   "--exclude-checks", EXCLUDED_CHECKS, "--max-time", str(int(seconds)),
                   "--request-timeout", "20", "--workers", "2", "--continue-on-failure", "--no-color"]  # fmt: skip
            if max_examples:
                cmd += ["--max-examples", str(max_examples)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300, cwd=root)
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200, "grader unhealthy after fuzzing"
        service.close(10)
        requests, errors, undocumented, statuses = _count(log, schema)
        return FuzzResult(requests, errors, undocumented, statuses, proc.returncode, time.perf_counter() - start,
                          (proc.stdout + proc.stderr)[-4000:])  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0, help="fuzzing time (schemathesis --max-time)")
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--verbose", action="store_true", help="print schemathesis' own summary")
    args = parser.parse_args(argv)
    r = run_fuzz(args.seconds, args.max_examples)
    if args.verbose or r.schemathesis_rc != 0:
        print(r.schemathesis_tail)
    print("| requests | 5xx | undocumented statuses | statuses seen | schemathesis exit | seconds |")
    print("|---|---|---|---|---|---|")
    print(f"| {r.requests} | {r.server_errors} | {len(r.undocumented)} | "
          f"{', '.join(f'{k}: {v}' for k, v in r.statuses.items())} | {r.schemathesis_rc} | {r.seconds:.0f} |")
    for u in r.undocumented[:20]:
        print("undocumented:", u)
    return 0 if r.ok and r.schemathesis_rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
