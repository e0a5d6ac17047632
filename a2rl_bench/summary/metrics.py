"""A run's process metrics as one typed model (`RunMetrics`): what `process.json`, the results store's `metrics`
rows, the failure class, the narrative and the report's process section all read and write.

The metrics come in groups, each from its own step; a group that does not apply to a run (no resource samples, no
LLM calls, no SFT-then-RL pair) is absent, not null: only the fields a run set are written (`process.json`
and the store keep the keys they always had). Every field a step may set is declared here, so a misspelt
metric is an error, not a silent new key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict

from a2rl_bench.records import Sparse, Split


class RunMetrics(Sparse):
    """The process metrics of one run (see the module docstring; times on the agent's budget clock)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    # ---- from the ledger (`a2rl_bench.summary.process_facts.process_metrics`) -------------------------------------
    feedback_split: Split | None = None
    """The split whose scores the agent saw (`a2rl_bench.protocol.feedback`)."""
    n_submissions: int | None = None
    n_scored: int | None = None
    n_errors: int | None = None
    n_unfinished: int | None = None
    n_cached: int | None = None
    valid_submission_rate: float | None = None
    nonzero_score_rate: float | None = None
    first_valid_idx: int | None = None
    first_valid_delay: float | None = None
    baseline_feedback: float | None = None
    best_feedback: float | None = None
    best_submission_id: int | None = None
    improvement_feedback: float | None = None
    time_to_first_improvement: float | None = None
    time_to_best: float | None = None
    monotonic_ratio: float | None = None
    copy_model_count: int | None = None
    duplicate_submission_count: int | None = None
    budget_s: float | None = None
    agent_seconds: float | None = None
    time_used_ratio: float | None = None
    last_submit_gap: float | None = None
    grading_seconds: float | None = None
    grading_seconds_share: float | None = None
    eval_seconds_total: float | None = None
    submissions_used_ratio: float | None = None
    ended_by: str | None = None
    exit_code: int | None = None
    baseline_test: float | None = None
    final_test: float | None = None
    final_submission_id: int | None = None
    delta_test: float | None = None
    selection_gap: float | None = None
    """heldout only: the validation gain of the best submission that did not carry over to the hidden test."""
    improved: bool | None = None
    submission_ids: list[int] | None = None
    scored_submission_ids: list[int] | None = None
    score_trajectory: list[float | None] | None = None
    best_so_far_trajectory: list[float | None] | None = None
    submission_times: list[float | None] | None = None

    # ---- resource samples (`a2rl_bench.capture.resources.summarize_resources`) ----------------------------------
    resource_samples: int | None = None
    cpu_percent_mean: float | None = None
    cpu_percent_peak: float | None = None
    rss_peak_bytes: int | None = None
    procs_peak: int | None = None
    workspace_peak_bytes: int | None = None
    gpu_util_percent_mean: float | None = None
    gpu_mem_peak_bytes: int | None = None
    gpu_shared_procs_median: int | None = None
    """Other compute processes on the GPUs the agent used, outside gradings (median over the samples;
    `a2rl_bench.capture.resources.gpu_shared_procs`): 0 on a card of its own, 7 with seven other runs on it."""
    gpu_shared_procs_peak: int | None = None

    # ---- the agents' LLM calls (`a2rl_bench.capture.calls.summarize_llm_calls`) --------------------------------
    llm_requests: int | None = None
    llm_failed_requests: int | None = None
    llm_tokens_total: int | None = None
    llm_input_tokens: int | None = None
    llm_output_tokens: int | None = None
    llm_cache_read_tokens: int | None = None
    llm_cost_usd: float | None = None
    llm_latency_s_mean: float | None = None

    # ---- item-level intervals (`a2rl_bench.summary.process_facts.item_level_intervals`) --------------------------
    delta_test_ci_low: float | None = None
    delta_test_ci_high: float | None = None
    delta_test_p_value: float | None = None
    delta_test_n_items: int | None = None
    delta_test_interval: str | None = None
    improvement_feedback_ci_low: float | None = None
    improvement_feedback_ci_high: float | None = None
    improvement_feedback_p_value: float | None = None
    improvement_feedback_n_items: int | None = None
    improvement_feedback_interval: str | None = None
    verdict: str | None = None
    """`improved` / `worse` / `no significant change` on Δ test's 95% interval, or `not tested (...)`."""

    # ---- RL's share (`a2rl_bench.summary.stages.stage_metrics`) --------------------------------------------------
    rl_share: float | None = None
    rl_share_ci_low: float | None = None
    rl_share_ci_high: float | None = None
    rl_share_p_value: float | None = None
    rl_share_n_items: int | None = None
    rl_share_sft_test: float | None = None
    rl_share_rl_test: float | None = None
    rl_share_submissions: list[int] | None = None
    rl_share_start: Literal["declared", "inferred"] | None = None
    """How the SFT start was found: the first RL submission's `parent`, or the best SFT submission on validation."""

    # ---- routes and the failure class --------------------------------------------------------------------
    route_counts: dict[str, int] | None = None
    failure_class: str | None = None

    def add(self, values: dict[str, Any]) -> None:
        """Set one step's group of metrics (checked against the declared fields and their types)."""
        for name, value in type(self).model_validate(values).model_dump(exclude_unset=True).items():
            setattr(self, name, value)

    def ci(self, name: str) -> tuple[float | None, float | None]:
        """The 95% interval (low, high) of metric `name` (`delta_test`, `improvement_feedback`, `rl_share`)."""
        return getattr(self, f"{name}_ci_low"), getattr(self, f"{name}_ci_high")
