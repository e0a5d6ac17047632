"""Typed records that cross a boundary: config in, evaluations, ledger entries and run summaries out.

Everything here is a pydantic model so it can be written to JSON (ledger, report) and DuckDB (store)
without hand-written converters.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, Field

Split = Literal["validation", "test"]
Protocol = Literal["heldout", "paper"]
Mode = Literal["free", "sft-only", "rl-only"]
RunStatus = Literal["running", "completed", "failed", "interrupted"]
SubmissionStatus = Literal["queued", "running", "scored", "error"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class RunConfig(BaseModel):
    """What defines a run. `config_hash` covers every field that changes what is measured."""

    task: str = "gsm8k"
    """Benchmark task id (see `a2rl tasks`)."""
    variant: Literal["offline", "full"] = "offline"
    """Data variant: `offline` ships in pinned packages, `full` loads the paper's data by public id."""
    agent: str = "reference-sft"
    """Agent scaffold id (see agents/)."""
    driver: str = "none"
    """Driver LLM of the agent: a saved DriverConfig block's name or a model id; `none` for scripted agents."""
    mode: Mode = "free"
    strict_mode: bool = False
    """Refuse submissions whose code breaks the mode (default: accept and flag them)."""
    base_model: str = "smollm2-135m-instruct"
    """A base model key from a2rl.models, or a local HF checkpoint directory."""
    seed: int = 0
    budget_s: float = 120.0
    """Agent wall-clock budget in seconds; grading time does not count."""
    protocol: Protocol = "heldout"
    max_submissions: int = 20
    val_limit: int | None = 16
    """Evaluate only the first N validation items (None = all). The report says so."""
    test_limit: int | None = 32
    """Evaluate only the first N hidden-test items (None = all). The report says so."""
    eval_batch_size: int = Field(default=16, ge=1)
    """Prompts per generate call in the grader (interactive tasks: episodes stepped together)."""
    eval_backend: Literal["transformers", "vllm"] = "transformers"
    sandbox: Literal["auto", "required", "off"] = "auto"
    """bubblewrap around the agent: `auto` falls back to a visibly weaker mode (rlimits, scrubbed environment,
    quota) where bubblewrap cannot run; `required` refuses to start without it."""
    max_workspace_bytes: int = 100 * 1024**3
    grading_workers: int = 1
    """Parallel evaluations; on a GPU machine each worker gets its own GPU."""
    max_checkpoint_bytes: int = 64 * 1024**3

    def config_hash(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


class ItemResult(BaseModel):
    """One evaluated example."""

    item_id: str
    prompt: str = ""
    completion: str
    prediction: str | None
    """What the evaluator extracted from the completion (e.g. the final number)."""
    target: str
    correct: bool
    value: float | None = None
    """Graded value where it is not just right/wrong (a judge's win = 1, tie = 0.5, loss = 0, a reward);
    None with correct=False means the item could not be graded (e.g. the judge gave no verdict)."""
    detail: dict = Field(default_factory=dict)


class EvalResult(BaseModel):
    """The outcome of evaluating one checkpoint on one split."""

    task: str
    split: Split
    score: float
    """Metric on a 0-100 scale."""
    n: int
    n_correct: int
    evaluator_id: str
    """Identifies evaluator version + config; part of the evaluation cache key."""
    weights_hash: str = ""
    generated_tokens: int = 0
    duration_s: float = 0.0
    cached: bool = False
    detail: dict = Field(default_factory=dict)
    """Task-specific split-level figures (e.g. raw and length-controlled win rates)."""
    items: list[ItemResult] = Field(default_factory=list)


class LedgerEntry(BaseModel):
    """One line of the grading ledger (append-only JSONL outside the workspace)."""

    seq: int
    """Position in the ledger, 0-based."""
    kind: Literal["baseline", "submission", "final", "event"]
    run_id: str
    at: datetime = Field(default_factory=utcnow)
    submission_id: int | None = None
    model_path: str | None = None
    """As sent by the agent."""
    resolved_path: str | None = None
    weights_hash: str | None = None
    size_bytes: int | None = None
    split: Split | None = None
    status: SubmissionStatus | None = None
    score: float | None = None
    cached: bool = False
    eval_seconds: float | None = None
    agent_elapsed_s: float | None = None
    """Agent budget clock when the submission arrived."""
    error: str | None = None
    detail: dict = Field(default_factory=dict)
    prev_hash: str = ""
    """sha256 of the previous ledger line: makes edits and deletions detectable."""


class RunSummary(BaseModel):
    """The headline numbers of one run, computed from stored raw scores at report time."""

    run_id: str
    config: RunConfig
    status: RunStatus
    protocol: Protocol
    variant_label: str
    baseline_val: float | None
    baseline_test: float | None
    best_val: float | None
    best_submission_id: int | None
    final_submission_id: int | None
    final_test: float | None
    delta_test: float | None
    """final_test - baseline_test."""
    n_submissions: int
    n_scored: int
    agent_seconds: float
    grading_seconds: float
    wall_seconds: float
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    mode_breaches: int = 0
    """Submissions whose code broke the run's mode (flagged by the grader; refused only in strict mode)."""
