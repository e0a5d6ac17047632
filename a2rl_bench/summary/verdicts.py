"""Failure class of a run: an operational label, like the paper's A.11 labels, with its reason.

Failure class (first rule that matches wins; operational, not semantic, like the paper's A.11 labels):

| # | class | rule |
|---|---|---|
| 1 | `none` | the run improved: the 95% item-level interval of Δ test is above 0 (or, with no final test score, the best feedback score's) |
| 2 | `infrastructure failure` | the agent could not be launched; or no baseline was recorded; or the session was interrupted by a harness crash; or the run failed (a harness error), or was interrupted before the agent session ended; or every submission failed with a grader-side error (`INFRA_ERROR_MARKERS`) |
| 3 | `environment` | no submission was scored and the machine starved the run: the session took `STARVED_START_S` or more to start the agent, or the load per core while the agent ran averaged `STARVED_LOAD` or more (`environment_fault`); or, whatever was scored (checked before rule 1), the session ended before 90% of its budget just after other processes had filled the agent's GPU (`gpu_crowded`, from the harness's NVML samples: an out-of-memory death the machine caused) |
| 4 | `static shortcut` | every scored submission has the base model's weights (route `copy`) |
| 5 | `early coding failure` | no submission was scored: the agent never closed one train → submit → score cycle |
| 6 | `static shortcut` | heldout: the validation score improved significantly but the hidden test score did not (no transfer) |
| 7 | `training collapse` | the best scored submission is below baseline by more than max(1 point, 10% of baseline), and significantly |
| 8 | `rollout construction failure` | an RL route (GRPO, PPO, RLOO, RL, SFT+RL) was submitted, and every RL submission errored or scored exactly the baseline (the policy never moved) |
| 9 | `inconclusive` | the feedback split is too small to say the models stayed near the baseline: its 95% interval of the best gain is wider than ±`NEAR_HALF_WIDTH` points (e.g. a 1-item validation set) |
| 10 | `reward/data design failure` | otherwise: models trained and scored, near the baseline (within that interval), without improving |

Every reason names the numbers it rests on (scores, intervals and their item counts, submission counts).
"Significantly": the 95% interval from the paired per-item comparison with the base model on the same items
(`a2rl_bench.summary.intervals.paired_item_interval`) excludes 0. Runs without per-item results fall back to the sign,
and the
reason says the change was not tested. Infrastructure failure is kept apart from the agent's failures: it says the harness, not the agent, failed.
`environment` likewise says the machine failed the agent (a starved machine): both are left out of every aggregate
and a sweep runs their configuration again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from a2rl_bench.summary.metrics import RunMetrics

FailureClass = Literal[
    "none",
    "infrastructure failure",
    "environment",
    "early coding failure",
    "static shortcut",
    "training collapse",
    "rollout construction failure",
    "inconclusive",
    "reward/data design failure",
]
RL_ROUTES = frozenset({"GRPO", "PPO", "RLOO", "RL", "SFT+RL"})  # as a2rl_bench.grading.route_audit.RL_LABELS
# Error texts of failed evaluations that point at the grader or the machine, not at the agent's checkpoint.
INFRA_ERROR_MARKERS = ("grader crash", "cuda out of memory", "no space left on device", "cuda error",
                       "nccl", "evaluator error", "connection refused")  # fmt: skip
COLLAPSE_MIN_POINTS = 1.0
COLLAPSE_FRACTION = 0.10
STARVED_START_S = 60.0
"""Seconds from the session's start to the agent's launch beyond which the machine, not the agent, lost the run."""
STARVED_LOAD = 4.0
"""Mean load per core while the agent ran at or above which each runnable process got a quarter core or less."""
NOT_THE_AGENTS = ("infrastructure failure", "environment")
"""Failure classes that say the harness or the machine failed: left out of aggregates, run again by sweeps."""
NEAR_HALF_WIDTH = 25.0
"""The widest 95% interval (half-width, points) of the best feedback gain that can still show "near the baseline":
a 1-item validation set ([0, 100] for one item gained) cannot."""


class FailureVerdict(NamedTuple):
    label: FailureClass
    reason: str


def explain_failure(
    metrics: RunMetrics, routes: Mapping[int, str], session_detail: Mapping[str, Any]
) -> FailureVerdict:
    """Apply the rule table of the module docstring. `session_detail` may also carry `run_status` and
    `run_error` (the run's final status and harness error) and `submission_errors` (error texts)."""
    m = metrics
    n, n_scored = m.n_submissions or 0, m.n_scored or 0
    base = m.baseline_feedback
    if session_detail.get("run_status") == "failed":  # a harness error is never the agent's result
        return FailureVerdict("infrastructure failure", f"the run failed: {session_detail.get('run_error')}")
    if why := session_detail.get("gpu_crowded"):  # cut short by a full card: its scores are not what it would get
        return FailureVerdict("environment", f"the machine cut the run short: {why}")
    if _significant(m, "delta_test", above=True):
        what = f"Δ test = {m.delta_test:+.2f}" if m.delta_test is not None else (
            f"best {m.feedback_split} score {m.best_feedback} > baseline {base}")
        return FailureVerdict("none", f"improved: {what}{_ci(m, 'delta_test')}")
    errors = [str(x).lower() for x in session_detail.get("submission_errors", [])]
    if session_detail.get("ended_by") == "launch-error":
        why = f"the agent could not be launched: {session_detail.get('error')}"
        return FailureVerdict("infrastructure failure", why)
    if base is None:
        return FailureVerdict("infrastructure failure", "no baseline score was recorded")
    if session_detail.get("ended_by") == "interrupted":
        why = f"the session was interrupted by a harness crash: {session_detail.get('error')}"
        return FailureVerdict("infrastructure failure", why)
    if session_detail.get("run_status") in ("failed", "interrupted") and not session_detail.get("ended_by"):
        why = f"the run {session_detail['run_status']} before the agent session ended"
        return FailureVerdict("infrastructure failure", f"{why}: {session_detail.get('run_error')}")
    if n_scored == 0 and errors and all(any(k in x for k in INFRA_ERROR_MARKERS) for x in errors):
        return FailureVerdict("infrastructure failure", f"all {len(errors)} submissions failed with a grader-side error")
    if n_scored == 0 and (why := session_detail.get("environment_fault")):
        return FailureVerdict("environment", f"no submission scored, and {why}")
    scored_ids = m.scored_submission_ids or []
    if scored_ids and all(routes.get(sid) == "copy" for sid in scored_ids):
        return FailureVerdict("static shortcut", f"all {len(scored_ids)} scored submissions are the base model "
                              "(weights or route `copy`)")
    if n_scored == 0:
        why = "no submission" if n == 0 else f"{n} submission(s), none scored"
        return FailureVerdict("early coding failure", f"{why}: no train → submit → score cycle completed")
    if m.delta_test is not None and _significant(m, "improvement_feedback", above=True):
        return FailureVerdict(
            "static shortcut",
            f"validation improved by {m.improvement_feedback:+.2f}{_ci(m, 'improvement_feedback')} but the hidden "
            f"test by {m.delta_test:+.2f}{_ci(m, 'delta_test')}, not significantly",
        )
    tol = max(COLLAPSE_MIN_POINTS, COLLAPSE_FRACTION * abs(base))
    best = m.best_feedback
    if best is not None and best < base - tol and _significant(m, "improvement_feedback", above=False):
        return FailureVerdict("training collapse", f"best score {best:.2f} is below baseline {base:.2f} by > {tol:.2f}"
                              f"{_ci(m, 'improvement_feedback')}")
    trajectory = m.score_trajectory or []
    rl = [sid for sid, label in routes.items() if label in RL_ROUTES]
    if rl:
        scores = dict(zip(m.submission_ids or [], trajectory))
        rl_scores = [scores.get(sid) for sid in rl]
        if all(s is None or s == base for s in rl_scores):
            return FailureVerdict(
                "rollout construction failure",
                f"RL submissions {rl} errored or scored exactly the baseline {base:.2f} (scores {rl_scores}): the "
                "policy never moved",
            )
    routes_seen = sorted(set(routes.values())) or ["unlabelled"]
    gain = f", gain {m.improvement_feedback:+.2f}" if m.improvement_feedback is not None else ""
    scores = f"best {m.feedback_split or 'feedback'} score {_num(best)}, baseline {_num(base)}{gain}"
    test = f"; hidden test Δ {m.delta_test:+.2f}{_ci(m, 'delta_test')}" if m.delta_test is not None else ""
    low, high = m.ci("improvement_feedback")
    if low is not None and high is not None and low == low and (high - low) / 2 > NEAR_HALF_WIDTH:
        return FailureVerdict(
            "inconclusive",
            f"{scores}{_ci(m, 'improvement_feedback')}: that interval is wider than ±{NEAR_HALF_WIDTH:g} points, too "
            f"wide to tell a design failure from a small feedback set{test}; routes {routes_seen}",
        )
    return FailureVerdict(
        "reward/data design failure",
        f"trained models scored near the baseline ({scores}{_ci(m, 'improvement_feedback')}){test}; "
        f"routes {routes_seen}",
    )


def environment_fault(start_delay_s: float | None, loads: list[float], agent_cpu_s: float | None,
                      agent_s: float | None) -> str | None:
    """Why the machine starved the run (the reason's clause), or None: the session's start delay (the harness's
    `session-start` event), the load per core sampled while the agent ran and the agent's CPU time against its
    clock (`a2rl_bench.capture.resources`)."""
    load = sum(loads) / len(loads) if loads else None
    slow_start = start_delay_s is not None and start_delay_s >= STARVED_START_S
    if not slow_start and (load is None or load < STARVED_LOAD):
        return None
    parts = [f"the session took {start_delay_s:.0f} s to start its agent" if start_delay_s is not None else None,
             f"the load per core averaged {load:.1f} over {len(loads)} samples while the agent ran"
             if load is not None else None,
             f"the agent got {agent_cpu_s:.0f} CPU-s in {agent_s:.0f} s of its clock" if agent_cpu_s is not None
             and agent_s else None]  # fmt: skip
    return "the machine starved the run: " + "; ".join(p for p in parts if p)


def failure_class(
    metrics: RunMetrics, routes: Mapping[int, str], session_detail: Mapping[str, Any]
) -> FailureClass:
    """The failure class label alone (see `explain_failure`)."""
    return explain_failure(metrics, routes, session_detail).label


def _significant(m: RunMetrics, name: str, above: bool) -> bool:
    """Whether metric `name` is above (or below) 0 beyond its 95% item-level interval. Without per-item results
    (older runs, hand-built ledgers) only the sign can be used; the reason then says it was not tested."""
    low, high = m.ci(name)
    if low is not None and high is not None and low == low:
        return low > 0 if above else high < 0
    value = getattr(m, name)
    if name == "delta_test" and value is None:  # no final test score: the best feedback score decides
        value = m.improvement_feedback
    return value is not None and (value > 0 if above else value < 0)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _ci(m: RunMetrics, name: str) -> str:
    low, high = m.ci(name)
    if low is not None and high is not None and low == low:
        return f" [95% {low:+.2f}, {high:+.2f}, n={getattr(m, f'{name}_n_items')} items]"
    return " (not tested for significance: no item-level results)"
