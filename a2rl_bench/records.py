"""Typed records that cross a boundary: config in, evaluations, ledger entries and run summaries out.

Everything here is a pydantic model so it can be written to JSON (ledger, report) and DuckDB (store)
without hand-written converters.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel, ConfigDict, Field, SecretStr, StringConstraints, field_validator, model_serializer,
)

Split = Literal["validation", "test"]
Protocol = Literal["heldout", "paper"]
Mode = Literal["free", "sft-only", "rl-only"]
RunStatus = Literal["running", "completed", "failed", "interrupted"]
SubmissionStatus = Literal["queued", "running", "scored", "error"]


class Sparse(BaseModel):
    """A record that writes only the fields that were set: a part that does not apply to a run is absent from its
    JSON, not null (the files and rows keep the keys they always had)."""

    @model_serializer(mode="wrap")
    def _only_what_was_set(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class DriverFields(BaseModel):
    """The fields of a driver LLM (model id, endpoint, key, per-token prices in USD per million tokens): the
    `DriverConfig` Prefect block is made of them, and `a2rl drivers add` builds its options from them here,
    without importing Prefect (its `--help` stays under a CPU-second)."""

    model: str = Field(description="Model id as the endpoint knows it, e.g. claude-sonnet-4-5.")
    api_key: SecretStr = Field(default=SecretStr(""), description="API key; never enters the agent's workspace.")
    api_key_env: str | None = Field(default=None, description="Or: the environment variable that holds the key.")
    base_url: str | None = Field(default=None, description="A compatible endpoint (vLLM, proxy); empty = vendor's.")
    api: Literal["anthropic", "openai", "gemini"] = Field(
        default="anthropic", description="Wire protocol: anthropic (Messages), openai (OpenAI-compatible: "
        "Responses / Chat Completions, e.g. vLLM) or gemini (Gemini API generateContent).")  # fmt: skip
    input_usd_per_mtok: float = Field(default=0.0, ge=0, description="USD per million uncached input tokens.")
    output_usd_per_mtok: float = Field(default=0.0, ge=0, description="USD per million output tokens.")
    cache_read_usd_per_mtok: float = Field(default=0.0, ge=0, description="USD per million cache-read tokens.")
    cache_write_usd_per_mtok: float = Field(default=0.0, ge=0, description="USD per million cache-write tokens.")


MAX_BUDGET_S = 7 * 24 * 3600.0
"""The longest agent budget a run takes: a week; more is a typo (milliseconds for seconds), not a plan."""
EVAL_BATCH_DEFAULT = 16
"""Prompts decoded together by default where answers may depend on the batch (GPU, CPU bf16): what every grading
used before the CPU fp32 default grew (`a2rl_bench.inference.numerics.eval_batch`)."""
ANALYSIS_ONLY = frozenset({"test_every_submission"})
"""RunConfig fields that add analysis-only evaluations and change nothing the run measures: not in its hash, so
turning one on names the same run (and a retry with it on resumes the run)."""


class RunConfig(BaseModel):
    """What defines a run. `config_hash` covers every field that changes what is measured.

    The single source of a run's settings: the CLI's options (a2rl_bench/run_options.py) are derived from these fields;
    it is the typed `config` parameter of the `benchmark-run` flow (and `run` of the sweep's), so the Prefect UI's
    run form shows it field by field, and prefect.yaml's `config:` validates as it (tests/test_run_config.py).
    Each field's docstring is its help text; its limits are pydantic constraints, so a bad value is refused where
    the config is made (the CLI's option, the form's field, a deployment's parameters at flow-run creation)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    task: str = "gsm8k"
    """benchmark task id (see `a2rl tasks`)"""
    variant: Literal["offline", "full"] = "offline"
    """task data: offline (ships in pinned packages) or full (the paper's data by public id; needs internet)"""
    agent: str = "reference-sft"
    """agent under test (see `a2rl agents`)"""
    driver: str = "none"
    """driver LLM of an LLM agent: a saved DriverConfig block, or a model id used with ANTHROPIC_API_KEY (and
    ANTHROPIC_BASE_URL for a compatible endpoint); `none` for scripted agents"""
    mode: Mode = "free"
    """training mode, checked on the agent's code at every submission"""
    strict_mode: bool = False
    """refuse submissions whose code breaks the mode (default: accept and flag them)"""
    base_model: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = "smollm2-135m-instruct"
    """base model: a registry key, a local HF checkpoint dir, a local .gguf file, or an HF id (needs internet)"""
    seed: int = Field(default=0, ge=0)
    """seed given to the agent"""
    budget_s: float = Field(default=120.0, gt=0, le=MAX_BUDGET_S, allow_inf_nan=False)
    """agent wall-clock budget in seconds (grading excluded)"""
    protocol: Protocol = "heldout"
    """heldout: validation feedback, one hidden-test evaluation; paper: test feedback"""
    max_submissions: int = Field(default=20, ge=1)
    """submission cap"""
    val_limit: int | None = Field(default=16, ge=0)
    """evaluate the first N validation items (0 or None = all); the report says so"""
    test_limit: int | None = Field(default=32, ge=0)
    """evaluate the first N hidden-test items (0 or None = all); the report says so"""
    eval_batch_size: int | None = Field(default=None, ge=1)
    """prompts decoded together by the grader (interactive tasks: episodes stepped together); default: on the CPU
    (fp32, whose answers do not depend on the batch) a split's prompts up to 48 at once, else 16 (GPU and CPU bf16
    answers may depend on it); an evaluation records the batch it used. On a GPU raise it, e.g. 160 for alfworld's
    134 test games. The run's hash counts the default as 16, the batch whose answers it gives on every path"""
    eval_backend: Literal["transformers", "vllm"] = "transformers"
    """inference backend of the grader (vllm: optional GPU extra)"""
    sandbox: Literal["auto", "required", "off"] = "auto"
    """bubblewrap sandbox for the agent: auto falls back to a visibly weaker mode (rlimits, scrubbed
    environment, quota) where it cannot run; required refuses to start without it"""
    max_workspace_bytes: int = Field(default=100 * 1024**3, ge=1)
    """disk quota of the agent's workspace, bytes"""
    grading_workers: int = Field(default=1, ge=1)
    """parallel evaluations; on a GPU machine each worker gets its own GPU"""
    max_checkpoint_bytes: int = Field(default=64 * 1024**3, ge=1)
    """largest checkpoint a submission may be, bytes"""
    test_every_submission: bool = False
    """after the session, also evaluate every scored submission on the hidden test set, for analysis only (the
    test curve, what each training stage added); never shown to the agent, and the final pick stays as it is"""

    @field_validator("val_limit", "test_limit")
    @classmethod
    def _zero_is_all(cls, v: int | None) -> int | None:
        # `0` from a command line or a deployment form means "all", as None does: one config, one hash.
        return v or None

    def config_hash(self) -> str:
        fields = self.model_dump(mode="json", exclude=ANALYSIS_ONLY)
        # The default batch (None: by numeric path) hashes as the 16 it was before: it gives 16's answers on every
        # path (16 itself where answers depend on the batch, a larger one only in fp32 on the CPU, where they do
        # not), so stored runs and a sweep's completed settings keep their meaning.
        fields["eval_batch_size"] = self.eval_batch_size or EVAL_BATCH_DEFAULT
        blob = json.dumps(fields, sort_keys=True)
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
    batch_size: int | None = None
    """Prompts decoded together (interactive tasks: episodes stepped together) by the evaluation that made this
    result; None where the backend batches by itself (vLLM) or the result was made before it was recorded."""
    duration_s: float = 0.0
    """Seconds of the evaluation from its model load; where `shared_with` names other splits, this split's share
    of the one process's time, by items."""
    shared_with: list[Split] = Field(default_factory=list)
    """Other splits of the same checkpoint decoded in the same evaluation process, in its batches (the baseline's
    two splits on `cpu-fp32`: `a2rl_bench.inference.evaluation.evaluate_cached_splits`); [] for one alone."""
    cached: bool = False
    detail: dict = Field(default_factory=dict)
    """Task-specific split-level figures (e.g. raw and length-controlled win rates)."""
    items: list[ItemResult] = Field(default_factory=list)


class LedgerEntry(BaseModel):
    """One line of the grading ledger (append-only JSONL outside the workspace)."""

    seq: int
    """Position in the ledger, 0-based."""
    kind: Literal["baseline", "submission", "final", "posthoc", "event"]
    """`posthoc`: a submission evaluated on the hidden test after the session, for analysis only."""
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
    """The agent's time within its budget (never more than the budget)."""
    grading_seconds: float
    wall_seconds: float
    """Summed over every attempt of the run (the time between attempts not counted)."""
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    """Each phase summed over every attempt."""
    error: str | None = None
    mode_breaches: int = 0
    """Submissions whose code broke the run's mode (flagged by the grader; refused only in strict mode)."""
    grace_seconds: float = 0.0
    """The agent's time past its budget: the grace to stop and make a last submission (not in agent_seconds)."""
    attempts: int = 1
    """How many attempts the run took (1, plus one for each retry that resumed it)."""
