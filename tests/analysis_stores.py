"""Small results stores that stress the analysis: twins, zero submissions, broken runs, and random valid stores.

Each store is written through `ResultsStore.bulk_write` with the rows a real run leaves (runs, baseline and final
evaluations with their per-item results, submissions, LLM calls), so every view sees what it would see after
`a2rl run`. Unlike `a2rl_bench.analysis.synthetic` (a big grid with known answers), these are built run by run, so a
test can say exactly which fields two settings share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from a2rl_bench.store.results import ResultsStore

BASE_SETTING: dict[str, Any] = {
    "task": "gsm8k", "variant": "offline", "val_limit": 16, "test_limit": 32, "base_model": "tiny",
    "agent": "agent-a", "driver": "none", "mode": "free", "protocol": "heldout", "budget_s": 120.0,
    "evaluator_id": "gsm8k-v1",
}  # fmt: skip
TWIN_CHANGES: dict[str, dict[str, Any]] = {
    "variant": {"variant": "offline-v2"},
    "item_selection": {"test_limit": 16},
    "base_model": {"base_model": "tiny-2"},
    "agent": {"agent": "agent-b"},
    "driver": {"driver": "driver-x"},
    "mode": {"mode": "sft-only"},
    "protocol": {"protocol": "paper"},
    "budget_s": {"budget_s": 240.0},
    "evaluator_id": {"evaluator_id": "gsm8k-v2"},
}
"""One twin of the base setting per setting field (the task aside): each differs from it in that field only."""


@dataclass
class RunSpec:
    run_id: str
    setting: dict[str, Any]
    seed: int
    base: list[float]
    """The base model's item scores on the hidden test set (0/1, or graded)."""
    final: list[float]
    """The final pick's item scores on the same items (the base model's again when nothing was submitted)."""
    submissions: list[dict[str, Any]] = field(default_factory=list)
    """`agent_elapsed_s`, `score` (validation), `status`, `route` per submission, in order."""
    llm_calls: list[tuple[float, int]] = field(default_factory=list)
    """(agent_elapsed_s, tokens) per LLM call."""
    status: str = "completed"
    failure_class: str | None = None
    baseline_val: float = 0.0

    @property
    def variant_label(self) -> str:
        return f"{self.setting['variant']}: offline stand-in data (test store)"


def item_frames(spec: RunSpec, start: pd.Timestamp) -> tuple[list[dict], list[dict]]:
    """The evaluations and item_results rows of one run: baseline (validation, test) and the final test."""
    s = spec.setting
    n = len(spec.base)
    ids = [f"{s['task']}-{i}" for i in range(n)]
    base_test, final_test = 100 * float(np.mean(spec.base)), 100 * float(np.mean(spec.final))
    final_id = next((i + 1 for i, sub in reversed(list(enumerate(spec.submissions))) if sub["status"] == "scored"),
                    None)  # fmt: skip
    evals = [
        {"run_id": spec.run_id, "eval_key": "baseline-0-validation", "kind": "baseline", "split": "validation",
         "score": spec.baseline_val, "n": s["val_limit"] or 16, "evaluator_id": s["evaluator_id"], "cached": False,
         "created_at": start},
        {"run_id": spec.run_id, "eval_key": "baseline-0-test", "kind": "baseline", "split": "test", "score": base_test,
         "n": n, "evaluator_id": s["evaluator_id"], "cached": False, "created_at": start},
    ]  # fmt: skip
    items = [{"run_id": spec.run_id, "eval_key": "baseline-0-test", "split": "test", "item_id": i, "score": float(v),
              "correct": bool(v == 1)} for i, v in zip(ids, spec.base)]  # fmt: skip
    if spec.status == "completed":
        key = f"final-{final_id or 0}-test"
        evals.append({"run_id": spec.run_id, "eval_key": key, "kind": "final", "split": "test", "score": final_test,
                      "n": n, "evaluator_id": s["evaluator_id"], "cached": final_id is None,
                      "submission_id": final_id, "created_at": start + pd.Timedelta(hours=1)})  # fmt: skip
        items += [{"run_id": spec.run_id, "eval_key": key, "split": "test", "item_id": i, "score": float(v),
                   "correct": bool(v == 1)} for i, v in zip(ids, spec.final)]  # fmt: skip
    return evals, items


def write_store(path: Path, specs: list[RunSpec]) -> Path:
    """Write the runs of `specs` (and nothing else) into a fresh store at `path`."""
    start0 = pd.Timestamp("2026-01-01", tz="UTC")
    runs, subs, evals, items, calls = [], [], [], [], []
    for r, spec in enumerate(specs):
        s = spec.setting
        start = start0 + pd.Timedelta(minutes=10 * r)
        done = spec.status == "completed"
        scored = [(i + 1, sub) for i, sub in enumerate(spec.submissions) if sub["status"] == "scored"]
        best = max(scored, key=lambda t: (t[1]["score"], -t[0])) if scored else None
        base_test, final_test = 100 * float(np.mean(spec.base)), 100 * float(np.mean(spec.final))
        runs.append({
            "run_id": spec.run_id, "task": s["task"], "variant": s["variant"], "variant_label": spec.variant_label,
            "agent": s["agent"], "driver": s["driver"], "mode": s["mode"], "base_model": s["base_model"],
            "seed": spec.seed, "budget_s": s["budget_s"], "protocol": s["protocol"], "status": spec.status,
            "started_at": start, "finished_at": start + pd.Timedelta(hours=1) if done else None,
            "baseline_val": spec.baseline_val, "baseline_test": base_test,
            "best_val": best[1]["score"] if best and s["protocol"] == "heldout" else None,
            "best_submission_id": best[0] if best else None,
            "final_submission_id": scored[-1][0] if scored and done else None,
            "final_test": final_test if done else None, "delta_test": final_test - base_test if done else None,
            "n_submissions": len(spec.submissions), "n_scored": len(scored), "agent_seconds": s["budget_s"],
            "failure_class": spec.failure_class or ("none" if done and final_test > base_test else
                                                   "early coding failure" if not scored else
                                                   "reward/data design failure"),
            "config_json": json.dumps({"val_limit": s["val_limit"], "test_limit": s["test_limit"], "seed": spec.seed}),
        })  # fmt: skip
        for i, sub in enumerate(spec.submissions, start=1):
            subs.append({"run_id": spec.run_id, "submission_id": i, "split": "test" if s["protocol"] == "paper" else
                         "validation", "created_at": start + pd.Timedelta(seconds=sub["agent_elapsed_s"]),
                         "status": sub["status"], "score": sub.get("score"), "agent_elapsed_s": sub["agent_elapsed_s"],
                         "route": sub.get("route"), "cached": False, "weights_hash": f"{spec.run_id}-{i}"})  # fmt: skip
        for seq, (at, tokens) in enumerate(spec.llm_calls):
            calls.append({"run_id": spec.run_id, "seq": seq, "created_at": start + pd.Timedelta(seconds=at),
                          "agent_elapsed_s": at, "model": "driver", "input_tokens": tokens, "output_tokens": 0,
                          "cache_read_tokens": 0, "cache_write_tokens": 0, "cost_usd": tokens * 1e-6})  # fmt: skip
        e, it = item_frames(spec, start)
        evals += e
        items += it
    store = ResultsStore(path)
    for table, rows in (("runs", runs), ("submissions", subs), ("evaluations", evals), ("item_results", items),
                        ("llm_calls", calls)):  # fmt: skip
        if rows:
            store.bulk_write(table, pd.DataFrame(rows))
    return path


def outcomes(rng: np.random.Generator, n: int, p_base: float, gain: float) -> tuple[list[float], list[float]]:
    """Base and final right/wrong on n items: the final pick keeps most base answers and gains about `gain`."""
    base = (rng.random(n) < p_base).astype(float)
    final = np.where(base == 1, rng.random(n) > 0.1, rng.random(n) < gain).astype(float)
    return base.tolist(), final.tolist()


def submissions(rng: np.random.Generator, budget: float, count: int, route: str = "SFT") -> list[dict[str, Any]]:
    times = np.sort(rng.uniform(1, budget * 0.9, count)).round(2)
    return [{"agent_elapsed_s": float(t), "score": float(rng.integers(0, 40)), "status": "scored", "route": route}
            for t in times]  # fmt: skip


def twin_specs(seeds: int = 3, seed: int = 0) -> list[RunSpec]:
    """The base setting and its one-field twins (`TWIN_CHANGES`), `seeds` seeds each, every seed scored on the
    same hidden items of its setting; the base-model twin's base model gets 6 of 32 right (18.75), the others 0.
    Plus the broken runs a real store has: failed, interrupted, running, and a completed infrastructure failure
    whose submission broke its mode (none of them may reach a table)."""
    rng = np.random.default_rng(seed)
    specs = []
    for index, (name, change) in enumerate({"base": {}, **TWIN_CHANGES}.items()):
        setting = BASE_SETTING | change
        n = setting["test_limit"]
        p_base = 6 / 32 if setting["base_model"] == "tiny-2" else 0.0
        base = [1.0] * round(p_base * n) + [0.0] * (n - round(p_base * n))  # greedy: the same answers every seed
        gain = 0.05 + 0.03 * index  # every setting its own level: numbers mixed across settings would show
        for s in range(seeds):
            final = [1.0 if b == 1 else float(rng.random() < gain) for b in base]
            route = "GRPO" if setting["mode"] == "sft-only" and s == 0 else "SFT"  # one mode breach
            specs.append(RunSpec(f"{name}-{s}", setting, s, base, final,
                                 submissions(rng, setting["budget_s"], 2 + s, route),
                                 [(5.0 + 10 * i, 1000 * (i + 1)) for i in range(3)]))  # fmt: skip
    broken = BASE_SETTING | {"agent": "agent-broken"}
    b, f = outcomes(rng, 32, 0.2, 0.3)
    for i, (status, failure) in enumerate([("failed", "infrastructure failure"), ("interrupted", None),
                                           ("running", None), ("completed", "infrastructure failure")]):
        mode = {"mode": "sft-only"} if status == "completed" else {}
        specs.append(RunSpec(f"broken-{status}-{i}", broken | mode, 0, b, f,
                             submissions(rng, 120.0, 1, "GRPO"), status=status, failure_class=failure))
    return specs


def zero_submission_specs() -> list[RunSpec]:
    """What `make run` leaves when the agent made no submission in its budget: one completed run, the base model
    evaluated as the final pick on the same 32 items (Δ = 0), no LLM call that counted."""
    base = [0.0] * 32
    return [RunSpec("run-0", BASE_SETTING, 0, base, list(base), baseline_val=0.0)]


def random_specs(rng: np.random.Generator) -> list[RunSpec]:
    """A random valid store: 0-12 runs over a few settings, any mix of statuses, graded or right/wrong items, with
    or without submissions, LLM calls, variants, paper protocol, budgets; items shared by seeds or not."""
    specs = []
    silent = rng.random() < 0.35  # no run in the store submitted (the `make run` case, with company)
    for r in range(int(rng.integers(0, 13))):
        setting = BASE_SETTING | {
            "task": str(rng.choice(["gsm8k", "humaneval"])), "agent": str(rng.choice(["a", "b"])),
            "variant": str(rng.choice(["offline", "offline-v2"])), "mode": str(rng.choice(["free", "sft-only"])),
            "protocol": str(rng.choice(["heldout", "paper"], p=[0.8, 0.2])),
            "budget_s": float(rng.choice([60.0, 120.0])), "test_limit": int(rng.choice([4, 8])),
        }  # fmt: skip
        n = setting["test_limit"]
        graded = rng.random() < 0.3
        base = (rng.choice([0, 0.5, 1], n) if graded else (rng.random(n) < rng.random()).astype(float)).tolist()
        final = (rng.choice([0, 0.5, 1], n) if graded else (rng.random(n) < rng.random()).astype(float)).tolist()
        subs = submissions(rng, setting["budget_s"], 0 if silent else int(rng.integers(0, 4)),
                           str(rng.choice(["SFT", "GRPO"])))
        if subs and rng.random() < 0.3:
            subs[0] = subs[0] | {"status": "error", "score": None}
        calls = [(float(t), int(rng.integers(0, 5000))) for t in rng.uniform(0, 100, int(rng.integers(0, 3)))]
        status = str(rng.choice(["completed", "failed", "interrupted", "running"], p=[0.7, 0.1, 0.1, 0.1]))
        failure = "infrastructure failure" if rng.random() < 0.1 else None
        specs.append(RunSpec(f"r{r}", setting, int(rng.integers(0, 3)), base, final, subs, calls, status, failure))
    return specs


def with_setting(spec: RunSpec, **change: Any) -> RunSpec:
    return replace(spec, setting=spec.setting | change)
