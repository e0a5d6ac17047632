"""The plug-in contracts: what the library calls on a benchmark task, an agent and a driver LLM.

The library may not import the plug-ins (`.importlinter`), so it names them by these protocols instead of `Any`:
`a2rl_bench.benchmarks.base.BenchmarkTask`, `a2rl_bench.agents.base.Agent` and `a2rl_bench.agents.base.LLMDriver` are the base classes that
satisfy them (tests/test_contracts.py checks every built-in task and agent). A plug-in from an outside package
may subclass those bases or implement the protocol on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from a2rl_bench.records import ItemResult, Split

Item = dict[str, Any]
"""One evaluation item, as the task's prepared JSONL holds it."""
Messages = list[dict[str, str]]
"""Chat messages (`role`, `content`)."""


@runtime_checkable
class DecodingSettings(Protocol):
    """A task's pinned decoding (part of its evaluator id)."""

    @property
    def max_new_tokens(self) -> int: ...

    @property
    def temperature(self) -> float: ...

    @property
    def stop(self) -> tuple[str, ...]: ...


@runtime_checkable
class BenchmarkTask(Protocol):
    """What grading (`GradingContext.task`) and inference (`EvalSpec.evaluator`, `evaluate`) call on a task.
    A task class must also be constructible without arguments: the evaluation process rebuilds it from its
    `module:Class` (`a2rl_bench.inference.evaluation.task_from_ref`)."""

    @property
    def id(self) -> str: ...

    @property
    def decoding(self) -> DecodingSettings: ...

    def evaluator_id(self) -> str:
        """Names the prompt, decoding and scoring: part of every cache key."""
        ...

    def preflight(self) -> None:
        """Raise before the model is loaded when something the evaluator needs is missing (a judge)."""
        ...

    def load_split(self, variant: str, split: Split, limit: int | None = None) -> list[Item]: ...

    def build_prompt(self, item: Item) -> Messages: ...

    def run_episodes(self, model_dir: Any, items: list[Item], batch_size: int,
                     on_done: Callable[[int], None] | None = None) -> list[ItemResult] | None:  # fmt: skip
        """Interactive tasks play whole episodes with `model_dir` (the loaded model, or for vLLM its folder);
        None means one generation per item via `build_prompt`."""
        ...

    def score_items(self, items: list[Item], completions: list[str]) -> list[ItemResult]: ...

    def aggregate(self, results: list[ItemResult]) -> float:
        """The task's metric on a 0-100 scale."""
        ...

    def summarize(self, results: list[ItemResult]) -> dict: ...


@runtime_checkable
class Agent(Protocol):
    """A scaffold under test, as the harness installs and starts it."""

    id: str
    uses_llm: bool

    def install(self, workspace: Path) -> None: ...

    def command(self, workspace: Path) -> list[str]: ...

    def launch_env(self, env: Any) -> dict[str, str]:
        """Extra variables for the started process only; `env` is the run's `a2rl_bench.agents.base.AgentEnv`."""
        ...


@runtime_checkable
class LLMDriver(Protocol):
    """A driver LLM of an LLM agent: model, endpoint and price."""

    @property
    def model(self) -> str: ...

    @property
    def api(self) -> str: ...

    @property
    def base_url(self) -> str | None: ...

    def cost_usd(self, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0) -> float: ...

    def public(self) -> dict[str, Any]:
        """Everything but the key: safe to log."""
        ...
