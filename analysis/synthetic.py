"""A synthetic results store with known answers: a user feature (`a2rl analyze --synthetic RUNS` writes one to
try the analysis before any run, offline stand-in data labelled so), and the tests' and the analysis
benchmark's data.

Runs cover tasks × agents × modes × seeds. By construction:
- Δ test of a run = task effect + agent effect + mode effect (per task) + noise shared by all agents on the
  same (task, mode, seed); so agent k beats agent 0 by exactly `agent_step × k` on every paired run;
- the best mode of task t is mode index (M − 1 − t) mod M and the worst the one after it (mode effects are
  `mode_step` apart, far above the noise of a mean);
- only every `fresh_every`-th run evaluates its baseline afresh (noise sd `baseline_sd[t]`); the others
  repeat the cached score, which carries no information about noise;
- each run has `subs_per_run` submissions, every 7th an evaluation error, and a final pick = best on validation;
- with `n_items` > 0 the hidden-test scores come from per-item results (`item_results`): the base model answers
  the same items of a task the same way in every run (greedy), the final pick gains and loses items at random
  around the run's target Δ, and Δ is then the item-level difference (no longer the exact formula above);
- with `broken_every` > 0 every such run is not an agent result: failed, interrupted, still running, or completed
  with an infrastructure failure (the agent never started), in turn; the analysis must exclude and count them.
Everything is vectorised numpy/pandas, so 100k runs and 1M submissions take seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

VARIANT_LABEL = "offline (synthetic data for tests)"


@dataclass(frozen=True)
class SyntheticSpec:
    tasks: tuple[str, ...] = ("gsm8k", "humaneval", "alfworld")
    agents: tuple[str, ...] = ("agent-a", "agent-b")
    drivers: tuple[str, ...] = ("none",)
    """Driver LLMs: every agent runs with each (driver k adds `driver_step × k` to Δ)."""
    modes: tuple[str, ...] = ("free", "sft-only", "rl-only")
    n_seeds: int = 5
    n_runs: int | None = None
    """Cap on the number of runs (seeds are added until the grid reaches it); None = full grid."""
    subs_per_run: int = 6
    llm_calls_per_run: int = 4
    budget_s: float = 3600.0
    noise_sd: float = 1.0
    agent_step: float = 1.5
    driver_step: float = 2.0
    mode_step: float = 4.0
    fresh_every: int = 3
    n_items: int = 0
    """Hidden-test items with per-item results (0: scores only, as in a store of old runs)."""
    broken_every: int = 0
    """Every k-th run is failed / interrupted / running / an infrastructure failure (0: none)."""
    val_limit: int | None = 16
    seed: int = 0


@dataclass
class SyntheticData:
    frames: dict[str, pd.DataFrame]
    spec: SyntheticSpec
    truth: dict[str, Any] = field(default_factory=dict)


def synthetic_frames(spec: SyntheticSpec = SyntheticSpec()) -> SyntheticData:
    """Build the tables of a results store (runs, submissions, evaluations, llm_calls, metrics) as DataFrames."""
    rng = np.random.default_rng(spec.seed)
    T, M, D = len(spec.tasks), len(spec.modes), len(spec.drivers)
    A = len(spec.agents) * D  # agent × driver combinations; agent = c // D, driver = c % D
    per_seed = T * A * M
    n_seeds = spec.n_seeds if spec.n_runs is None else -(-spec.n_runs // per_seed)
    # Grid order: seed-major, then task, mode, agent — so a cap on n_runs keeps whole seeds first.
    s_idx, t_idx, m_idx, a_idx = (g.ravel() for g in np.meshgrid(
        np.arange(n_seeds), np.arange(T), np.arange(M), np.arange(A), indexing="ij"))  # fmt: skip
    n = len(s_idx) if spec.n_runs is None else min(spec.n_runs, len(s_idx))
    s_idx, t_idx, m_idx, a_idx = s_idx[:n], t_idx[:n], m_idx[:n], a_idx[:n]

    shared_noise = rng.normal(0, spec.noise_sd, size=(n_seeds, T, M))  # same for every agent: exact pairing
    mode_effect = (((t_idx + m_idx) % M) - (M - 1) / 2) * spec.mode_step
    c_idx = a_idx
    a_idx, d_idx = c_idx // D, c_idx % D
    delta = (2.0 * t_idx + spec.agent_step * a_idx + spec.driver_step * d_idx + mode_effect
             + shared_noise[s_idx, t_idx, m_idx])
    base_level = 20.0 + 10.0 * t_idx
    baseline_sd = 0.5 + 0.25 * np.arange(T)
    fresh = (np.arange(n) % spec.fresh_every) == 0
    baseline_test = base_level + np.where(fresh, rng.normal(0, 1, n) * baseline_sd[t_idx], 0.0)
    baseline_val = base_level - 1.0
    selection_bias = 1.0 - 0.5 * a_idx / max(len(spec.agents) - 1, 1)  # validation gains overstate test gains, less for later agents

    run_ids = np.char.add("run-", np.arange(n).astype(str))
    start = pd.Timestamp("2026-01-01", tz="UTC") + pd.to_timedelta(np.arange(n) * 60, unit="s")

    # Submissions: validation scores rising towards the run's validation gain, with some evaluation errors.
    S = spec.subs_per_run
    frac = (np.arange(1, S + 1) / S)[None, :]
    val_gain = (delta + selection_bias)[:, None]
    val_scores = baseline_val[:, None] + val_gain * frac + rng.normal(0, 0.3, size=(n, S))
    errors = ((np.arange(n)[:, None] * S + np.arange(S)[None, :]) % 7) == 6
    val_scores = np.where(errors, np.nan, val_scores)
    elapsed = np.sort(rng.uniform(0, spec.budget_s * 0.95, size=(n, S)), axis=1).round(3)
    best_idx = np.nanargmax(np.where(np.isnan(val_scores), -np.inf, val_scores), axis=1)
    best_val = val_scores[np.arange(n), best_idx]
    final_test = baseline_test + delta
    items = None
    if spec.n_items:
        baseline_test, final_test, items = _items(rng, spec, t_idx, delta)
    test_n = spec.n_items or 200

    runs = pd.DataFrame({
        "run_id": run_ids, "config_hash": [f"cfg{t}{c}{m}" for t, c, m in zip(t_idx, c_idx, m_idx)],
        "task": np.asarray(spec.tasks)[t_idx], "variant": "offline", "variant_label": VARIANT_LABEL,
        "agent": np.asarray(spec.agents)[a_idx], "driver": np.asarray(spec.drivers)[d_idx], "mode": np.asarray(spec.modes)[m_idx],
        "base_model": "tiny", "seed": s_idx.astype(np.int64), "budget_s": spec.budget_s, "protocol": "heldout",
        "status": "completed", "started_at": start, "finished_at": start + pd.Timedelta(seconds=spec.budget_s),
        "baseline_val": baseline_val, "baseline_test": baseline_test, "best_val": best_val,
        "best_submission_id": (best_idx + 1).astype(np.int64), "final_submission_id": (best_idx + 1).astype(np.int64),
        "final_test": final_test, "delta_test": final_test - baseline_test, "n_submissions": np.full(n, S, np.int64),
        "n_scored": (~errors).sum(axis=1).astype(np.int64), "agent_seconds": elapsed[:, -1] + 10.0,
        "grading_seconds": 60.0, "wall_seconds": spec.budget_s + 120.0,
        "failure_class": np.where(final_test > baseline_test, "none", "reward/data design failure"),
        "config_json": json.dumps({"val_limit": spec.val_limit, "test_limit": spec.n_items or None}),
    })  # fmt: skip
    if spec.broken_every:
        _break_runs(runs, spec.broken_every)

    sub_run = np.repeat(run_ids, S)
    sub_created = start.repeat(S) + pd.to_timedelta(elapsed.ravel(), unit="s")
    submissions = pd.DataFrame({
        "run_id": sub_run, "submission_id": np.tile(np.arange(1, S + 1, dtype=np.int64), n),
        "created_at": sub_created,
        "model_path": "output/ckpt", "weights_hash": np.char.add("h", np.arange(n * S).astype(str)),
        "size_bytes": np.int64(1_000_000), "status": np.where(errors.ravel(), "error", "scored"), "split": "validation",
        "score": val_scores.ravel(), "cached": False, "eval_seconds": 5.0, "agent_elapsed_s": elapsed.ravel(),
        "error": np.where(errors.ravel(), "evaluation failed", None),
        "route": np.asarray(["SFT", "SFT", "GRPO"])[np.repeat(m_idx, S) % 3],
    })  # fmt: skip

    evaluations = _evaluations(run_ids, start, baseline_val, baseline_test, fresh, final_test, best_idx, S,
                               submissions, spec.tasks, t_idx, test_n)
    llm_calls = _llm_calls(run_ids, start, spec, rng)
    metrics = pd.DataFrame({
        "run_id": np.repeat(run_ids, 2), "name": np.tile(["valid_submission_rate", "failure_class"], n),
        "value": np.ravel(np.column_stack([runs["n_scored"] / S, np.full(n, np.nan)])),
        "text": np.ravel(np.column_stack([np.full(n, None), runs["failure_class"].to_numpy(dtype=object)])),
    })  # fmt: skip

    frames = {"runs": runs, "submissions": submissions, "evaluations": evaluations, "llm_calls": llm_calls,
              "metrics": metrics}
    if items is not None:
        final_key = "final-" + (best_idx + 1).astype(str) + "-test"
        frames["item_results"] = items(run_ids, final_key)
    truth = {
        "best_mode": {spec.tasks[t]: spec.modes[(M - 1 - t) % M] for t in range(T)},
        "worst_mode": {spec.tasks[t]: spec.modes[(M - t) % M] for t in range(T)},
        "paired_diff": {spec.agents[a]: spec.agent_step * a for a in range(len(spec.agents))},
        "driver_diff": {spec.drivers[d]: spec.driver_step * d for d in range(D)},
        "baseline_sd": {spec.tasks[t]: float(baseline_sd[t]) for t in range(T)},
    }
    return SyntheticData(frames=frames, spec=spec, truth=truth)


def _items(rng, spec: SyntheticSpec, t_idx, delta):
    """Per-item right/wrong of the base model (one answer sheet per task) and of each run's final pick, and the
    0-100 test scores they give. Returns (baseline_test, final_test, a builder of the item_results frame)."""
    n, N, T = len(t_idx), spec.n_items, len(spec.tasks)
    task_level = (20.0 + 10.0 * np.arange(T)) / 100  # as base_level
    sheets = rng.random((T, N)) < task_level[:, None]
    base = sheets[t_idx]  # runs × items
    p = base.mean(axis=1, keepdims=True).clip(0.02, 0.98)
    target = (delta / 100)[:, None]
    gain = np.where(target > 0, np.minimum(target / (1 - p), 1.0), 0.02)
    loss = np.where(target < 0, np.minimum(-target / p, 1.0), 0.02)
    u = rng.random((n, N))
    final = np.where(base, u >= loss, u < gain)
    baseline_test, final_test = 100 * base.mean(axis=1), 100 * final.mean(axis=1)

    def frame(run_ids, final_key) -> pd.DataFrame:
        suffix = np.char.add("-", np.arange(N).astype(str))
        item_ids = np.char.add(np.repeat(np.asarray(spec.tasks)[t_idx], N), np.tile(suffix, n))

        def rows(key, values):
            return pd.DataFrame({"run_id": np.repeat(run_ids, N), "eval_key": key, "split": "test",
                                 "item_id": item_ids, "score": values.ravel().astype(float),
                                 "correct": values.ravel(), "tokens": np.int64(64)})  # fmt: skip
        return pd.concat([rows("baseline-0-test", base), rows(np.repeat(final_key, N), final)], ignore_index=True)

    return baseline_test, final_test, frame


def _break_runs(runs: pd.DataFrame, every: int) -> None:
    """Turn every `every`-th run into one the analysis must not count, cycling through the ways a run breaks."""
    broken = np.flatnonzero(np.arange(len(runs)) % every == every - 1)
    kinds = [("failed", "infrastructure failure"), ("interrupted", "infrastructure failure"),
             ("running", None), ("completed", "infrastructure failure")]  # the last: the agent never started
    for k, i in enumerate(broken):
        status, failure = kinds[k % len(kinds)]
        runs.loc[i, ["status", "failure_class"]] = [status, failure]
        if status != "completed":
            runs.loc[i, ["final_test", "delta_test", "finished_at"]] = [np.nan, np.nan, pd.NaT]
        else:
            runs.loc[i, ["n_submissions", "n_scored", "agent_seconds"]] = [0, 0, 0.0]


def _evaluations(run_ids, start, baseline_val, baseline_test, fresh, final_test, best_idx, S, submissions, tasks,
                 t_idx, test_n=200) -> pd.DataFrame:
    n = len(run_ids)
    evaluator = np.char.add(np.asarray(tasks)[t_idx], "-eval-v1")
    base = pd.DataFrame({
        "run_id": np.repeat(run_ids, 2), "eval_key": np.tile(["baseline-0-validation", "baseline-0-test"], n),
        "kind": "baseline", "submission_id": pd.array([None] * (2 * n), dtype="Int64"),
        "split": np.tile(["validation", "test"], n), "score": np.ravel(np.column_stack([baseline_val, baseline_test])),
        "n": np.tile(np.asarray([200, test_n], dtype=np.int64), n), "evaluator_id": np.repeat(evaluator, 2),
        "weights_hash": "base",
        "cached": np.ravel(np.column_stack([~fresh, ~fresh])), "created_at": start.repeat(2),
    })  # fmt: skip
    scored = submissions[submissions["status"] == "scored"]
    subs = pd.DataFrame({
        "run_id": scored["run_id"], "eval_key": "submission-" + scored["submission_id"].astype(str) + "-validation",
        "kind": "submission", "submission_id": scored["submission_id"], "split": "validation",
        "score": scored["score"], "n": np.int64(200), "evaluator_id": "eval-v1", "weights_hash": scored["weights_hash"],
        "cached": False, "created_at": scored["created_at"],
    })  # fmt: skip
    final = pd.DataFrame({
        "run_id": run_ids, "eval_key": "final-" + (best_idx + 1).astype(str) + "-test", "kind": "final",
        "submission_id": (best_idx + 1).astype(np.int64), "split": "test", "score": final_test, "n": np.int64(test_n),
        "evaluator_id": evaluator, "weights_hash": "final", "cached": False,
        "created_at": start + pd.Timedelta(hours=1),
    })  # fmt: skip
    return pd.concat([base, subs, final], ignore_index=True)


def _llm_calls(run_ids, start, spec: SyntheticSpec, rng) -> pd.DataFrame:
    n, C = len(run_ids), spec.llm_calls_per_run
    if C == 0:
        return pd.DataFrame(columns=["run_id", "seq", "created_at", "model", "input_tokens", "output_tokens"])
    offsets = np.sort(rng.uniform(0, spec.budget_s, size=(n, C)), axis=1)
    return pd.DataFrame({
        "run_id": np.repeat(run_ids, C), "seq": np.tile(np.arange(C, dtype=np.int64), n),
        "created_at": start.repeat(C) + pd.to_timedelta(offsets.ravel(), unit="s"),
        "agent_elapsed_s": offsets.ravel(), "model": "driver-x",
        "input_tokens": rng.integers(1_000, 50_000, n * C), "output_tokens": rng.integers(100, 2_000, n * C),
        "cache_read_tokens": np.int64(0), "cache_write_tokens": np.int64(0), "cost_usd": 0.01, "latency_s": 2.0,
    })  # fmt: skip


def write_synthetic_store(path: Path | str, spec: SyntheticSpec = SyntheticSpec()) -> SyntheticData:
    """Write a synthetic store at `path` (bulk inserts, one per table) and return its frames and truth."""
    data = synthetic_frames(spec)
    _write(path, data.frames)
    data.truth["store"] = str(Path(path))
    data.truth["spec"] = json.loads(json.dumps(spec.__dict__, default=list))
    return data


def demo_spec(n_runs: int) -> SyntheticSpec:
    """The store `a2rl analyze --synthetic N` writes: 6 tasks, 3 agents, 2 drivers, 3 modes, 32 items with per-item
    results, and every 12th run broken (failed, interrupted, running, infrastructure failure)."""
    return SyntheticSpec(tasks=("gsm8k", "humaneval", "alfworld", "webshop", "alpacaeval", "deepsearchqa"),
                         agents=("agent-a", "agent-b", "agent-c"), drivers=("driver-x", "driver-y"),
                         modes=("free", "sft-only", "rl-only"), n_runs=max(1, n_runs), n_items=32, broken_every=12)


# ---- a study of the RL stage: SFT only against free, with every submission on the hidden test ---------------------


@dataclass(frozen=True)
class StageStudySpec:
    """Seeds × {sft-only, free} of one agent on one task, every seed scored on the same `n_items` hidden items; each
    free run submits an SFT checkpoint, then an RL one (its final pick), both evaluated post hoc on the hidden test.

    The outcomes are laid out item by item so that the comparisons have known answers: per seed, the free run's final
    pick gains `mode_nets[s] + mode_pairs` items over the sft-only run's and loses `mode_pairs` (`+` net); its RL
    checkpoint gains `share_nets[s] + share_pairs[s]` over its SFT checkpoint and loses `share_pairs[s]`; different
    seeds' changed items never overlap. The defaults rebuild issue 34's eight-run store (4 seeds of
    reference-sft-grpo, 134 items): free − sft-only = +0.19 [−7.9, +8.3], RL's share over seeds = +2.6 [−8.8, +14.0],
    p = 0.55, and one seed's own RL share +12.7 (20 gained, 3 lost), significant on its own."""

    task: str = "alfworld"
    agent: str = "reference-sft-grpo"
    n_items: int = 134
    mode_nets: tuple[int, ...] = (4, 4, 2, -9)
    mode_pairs: int = 5
    share_nets: tuple[int, ...] = (17, 0, -1, -2)
    share_pairs: tuple[int, ...] = (3, 13, 13, 13)


def stage_study_sheets(spec: StageStudySpec = StageStudySpec()) -> dict[str, np.ndarray]:
    """Right/wrong per item: `base` (n), `sft_only` (k × n), `free_sft` and `free_rl` (k × n; `free_rl` is the final
    pick). Raises ValueError when the changes do not fit in n_items."""
    k, n = len(spec.mode_nets), spec.n_items
    sft = np.full(n, -1)  # the sft-only runs' answers (one deterministic sheet); -1: not fixed yet
    free = np.zeros((k, n), dtype=int)
    owner = np.full(n, -1)  # the seed whose free run differs from sft-only on the item
    pos = 0
    for s, net in enumerate(spec.mode_nets):
        gains, losses = max(net, 0) + spec.mode_pairs, max(-net, 0) + spec.mode_pairs
        if pos + gains + losses > n:
            raise ValueError(f"the mode differences need more than {n} items")
        sft[pos:pos + gains], sft[pos + gains:pos + gains + losses] = 0, 1
        owner[pos:pos + gains + losses] = s
        pos += gains + losses
    used = np.zeros(n, dtype=bool)
    rl_change = np.zeros((k, n), dtype=int)
    for s, (net, pairs) in enumerate(zip(spec.share_nets, spec.share_pairs)):
        for want, count in ((1, max(net, 0) + pairs), (0, max(-net, 0) + pairs)):  # RL gains need a right final pick
            # An item works if this seed's final pick answers it `want`: fixed items where that holds, then free ones.
            final = np.where(owner == s, 1 - sft, sft)
            fits = np.flatnonzero(~used & (sft >= 0) & (final == want))
            spare = np.flatnonzero(~used & (sft < 0))
            chosen = np.concatenate([fits, spare])[:count]
            if len(chosen) < count:
                raise ValueError(f"RL's share needs more than {n} items")
            sft[chosen[np.isin(chosen, spare)]] = want
            used[chosen] = True
            rl_change[s, chosen] = 1 if want == 1 else -1
    rest = sft < 0
    sft[rest] = (np.arange(n)[rest] % 3 == 0).astype(int)
    free = np.where(owner[None, :] == np.arange(k)[:, None], 1 - sft[None, :], sft[None, :])
    base = (np.arange(n) % 5 < 2).astype(int)
    return {"base": base, "sft_only": np.broadcast_to(sft, (k, n)).copy(), "free_rl": free,
            "free_sft": free - rl_change}


def stage_study_frames(spec: StageStudySpec = StageStudySpec()) -> SyntheticData:
    """The store's tables for `StageStudySpec` (runs, submissions, evaluations, item_results, metrics, llm_calls)."""
    from a2rl_bench.summary.stages import SubmissionTest, stage_share

    k = len(spec.mode_nets)
    skeleton = synthetic_frames(SyntheticSpec(tasks=(spec.task,), agents=(spec.agent,), modes=("sft-only", "free"),
                                              n_seeds=k, subs_per_run=2, n_items=spec.n_items, fresh_every=1))
    f = skeleton.frames
    runs, subs, evals = f["runs"].copy(), f["submissions"].copy(), f["evaluations"].copy()
    sheets = stage_study_sheets(spec)
    items = [f"{spec.task}-{i}" for i in range(spec.n_items)]
    free = (runs["mode"] == "free").to_numpy()
    seed = runs["seed"].to_numpy()
    final = np.where(free[:, None], sheets["free_rl"][seed], sheets["sft_only"][seed])
    base_score = 100 * sheets["base"].mean()
    runs["final_submission_id"] = runs["best_submission_id"] = np.where(free, 2, 1)
    runs["baseline_test"], runs["final_test"] = base_score, 100 * final.mean(axis=1)
    runs["delta_test"] = runs["final_test"] - runs["baseline_test"]
    runs["failure_class"] = np.where(runs["delta_test"] > 0, "none", "reward/data design failure")
    subs["stage"] = np.where(np.repeat(free, 2) & (subs["submission_id"] == 2), "GRPO", "SFT")
    subs["route"] = subs["stage"]
    subs["status"], subs["error"] = "scored", None
    subs["score"] = np.where(subs["submission_id"] == 2, 40.0, 35.0)  # validation: the RL checkpoint looks better
    evals = evals[evals["kind"] != "final"]
    evals.loc[(evals["kind"] == "baseline") & (evals["split"] == "test"), "score"] = base_score
    item_rows, eval_rows, metric_rows = [], [], []
    for r, run in enumerate(runs.itertuples(index=False)):
        sid = int(run.final_submission_id)
        sheets_of = {"baseline-0-test": sheets["base"], f"final-{sid}-test": final[r]}
        if free[r]:
            sheets_of |= {"posthoc-1-test": sheets["free_sft"][run.seed], "posthoc-2-test": sheets["free_rl"][run.seed]}
        for key, sheet in sheets_of.items():
            item_rows.append(pd.DataFrame({"run_id": run.run_id, "eval_key": key, "split": "test", "item_id": items,
                                           "score": sheet.astype(float), "correct": sheet.astype(bool),
                                           "tokens": np.int64(64)}))
            kind = key.split("-")[0]
            if kind != "baseline":
                eval_rows.append({"run_id": run.run_id, "eval_key": key, "kind": kind,
                                  "submission_id": int(key.split("-")[1]), "split": "test",
                                  "score": 100 * sheet.mean(), "n": spec.n_items, "evaluator_id": f"{spec.task}-eval-v1",
                                  "weights_hash": f"w{r}-{key}", "cached": False, "created_at": run.finished_at})
        if free[r]:
            tests = [SubmissionTest(submission_id=i, stage=stage, validation=v, test=100 * sheets[s][run.seed].mean())
                     for i, stage, v, s in ((1, "SFT", 35.0, "free_sft"), (2, "GRPO", 40.0, "free_rl"))]
            per_item = {1: sheets["free_sft"][run.seed], 2: sheets["free_rl"][run.seed]}
            share = stage_share(tests, lambda i: dict(zip(items, per_item[i].astype(float))))
            values = {"rl_share": share.delta, "rl_share_ci_low": share.ci_low, "rl_share_ci_high": share.ci_high,
                      "rl_share_p_value": share.p_value, "rl_share_n_items": share.n_items,
                      "rl_share_sft_test": share.sft_test, "rl_share_rl_test": share.rl_test}
            metric_rows += [{"run_id": run.run_id, "name": name, "value": float(v), "text": None}
                            for name, v in values.items()]
            metric_rows.append({"run_id": run.run_id, "name": "rl_share_submissions", "value": None,
                                "text": json.dumps([share.sft_submission, share.rl_submission])})
    frames = dict(f) | {
        "runs": runs, "submissions": subs,
        "evaluations": pd.concat([evals, pd.DataFrame(eval_rows)], ignore_index=True),
        "item_results": pd.concat(item_rows, ignore_index=True),
        "metrics": pd.concat([f["metrics"], pd.DataFrame(metric_rows)], ignore_index=True),
    }
    return SyntheticData(frames=frames, spec=skeleton.spec, truth={"stage_study": spec.__dict__})


def write_stage_study(path: Path | str, spec: StageStudySpec = StageStudySpec()) -> SyntheticData:
    """Write `stage_study_frames` as a store at `path`."""
    data = stage_study_frames(spec)
    _write(path, data.frames)
    return data


def _write(path: Path | str, frames: dict[str, pd.DataFrame]) -> None:
    """A new store at `path` with these tables (bulk inserts, one per table)."""
    from a2rl_bench.store.results import ResultsStore

    store = ResultsStore(path)
    for table, frame in frames.items():
        store.bulk_write(table, frame)
