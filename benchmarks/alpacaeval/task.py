"""AlpacaEval (L2): instruction following, judged pairwise against reference answers, length-controlled win rate."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from a2rl_bench.records import ItemResult
from a2rl_bench.benchmarks.alpacaeval.data import load_full, load_offline
from a2rl_bench.benchmarks.alpacaeval.judge import JudgeConfig, JudgeError, JudgeNotConfigured, NoAnswer, PairwiseJudge, Verdict
from a2rl_bench.benchmarks.alpacaeval.length_control import win_rates
from a2rl_bench.benchmarks.base import BenchmarkTask, Item, Messages, TaskData

DEFAULT_CONCURRENCY = 4

log = logging.getLogger(__name__)


def _verdict_detail(v: Verdict) -> dict[str, Any]:
    return {"winner": v.winner, "cached": v.cached, "error": v.error, "text": v.text[:200]}


@dataclass
class AlpacaEval(BenchmarkTask):
    """Declarative fields (id, title, decoding, variant labels, ...): task.toml beside this file."""

    judge: PairwiseJudge | None = field(default=None, repr=False, compare=False)
    """Set by tests; otherwise made from the environment on first use (see `judge.py`)."""
    _judge_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def loaders(self) -> dict[str, Callable[[], TaskData]]:
        return {"offline": load_offline, "full": load_full}

    def get_judge(self) -> PairwiseJudge:
        """The judge, made from the environment once; raises `JudgeNotConfigured` naming the variables."""
        with self._judge_lock:
            if self.judge is None:
                self.judge = PairwiseJudge.from_env()
            return self.judge

    def preflight(self) -> None:
        """Fail before generation, not after it, when no judge is configured."""
        self.get_judge()

    def judge_config(self) -> JudgeConfig | None:
        if self.judge is not None:
            return self.judge.config
        try:
            return JudgeConfig.from_env()
        except JudgeNotConfigured:
            return None

    def evaluator_id(self) -> str:
        # Scores under another judge, prompt or reference model are different numbers.
        config = self.judge_config()
        return f"{super().evaluator_id()}/judge-{config.label() if config else 'unconfigured'}"

    def describe_extra(self) -> list[str]:
        config = self.judge_config()
        judge = config.label() if config else "NOT CONFIGURED: set ANTHROPIC_API_KEY or A2RL_JUDGE_BASE_URL"
        return [
            f"judge: {judge} (settings: benchmarks/alpacaeval/judge.py)",
            (
                "score: length-controlled win rate (logistic fit of wins on tanh(length difference / sd), read at "
                "difference 0); raw win rate and no-verdict count: AlpacaEval.summarize(items), per item in its detail"
            ),
        ]

    def build_prompt(self, item: Item) -> Messages:
        self.preflight()  # evaluate() builds every prompt before generating: the cheapest place to stop
        return [{"role": "user", "content": item["question"]}]

    def demonstrations(self, variant: str, train: list[Item]) -> list[dict]:
        """The training pool's prompts with their answers, in the evaluator's (single-turn) prompt format."""
        return [{"prompt": [{"role": "user", "content": item["question"]}],
                 "completion": [{"role": "assistant", "content": item["answer"]}], "goal_id": item["id"]}
                for item in train if item.get("question") and item.get("answer")]  # fmt: skip

    def reference(self, item: Item) -> str:
        """The item's reference answer: shipped with the data, else written (once, cached) by the reference model."""
        return item.get("answer") or self.get_judge().write_reference(item["question"])

    def score_item(self, item: Item, completion: str) -> ItemResult:
        judge = self.get_judge()
        output = completion.strip()
        detail: dict[str, Any] = {"judge": judge.config.label(), "model_length": len(output)}
        try:
            reference = self.reference(item).strip()
        except NoAnswer as e:
            return self._result(item, completion, None, {**detail, "error": f"no reference answer: {e}"})
        detail |= {
            "reference_length": len(reference),
            "reference_source": item.get("reference_source") or judge.config.writer_model,
        }
        # Settled without a judge: an empty reply loses to any reference, an identical one ties.
        if not output:
            return self._result(item, completion, 0.0, {**detail, "verdict": "empty output"})
        if output == reference:
            return self._result(item, completion, 0.5, {**detail, "verdict": "identical to the reference"})
        comparison = judge.compare(item["question"], output, reference)
        detail |= {
            "model_first": _verdict_detail(comparison.model_first),
            "reference_first": _verdict_detail(comparison.reference_first),
            "input_tokens": comparison.model_first.input_tokens + comparison.reference_first.input_tokens,
            "output_tokens": comparison.model_first.output_tokens + comparison.reference_first.output_tokens,
        }
        if comparison.value is None:
            detail["error"] = "no verdict: " + "; ".join(
                e for e in (comparison.model_first.error, comparison.reference_first.error) if e
            )
        return self._result(item, completion, comparison.value, detail)

    def score_items(self, items: Sequence[Item], completions: Sequence[str]) -> list[ItemResult]:
        """`score_item` over all items with `A2RL_JUDGE_CONCURRENCY` judge calls in flight (default 4)."""
        self.preflight()
        workers = int(os.environ.get("A2RL_JUDGE_CONCURRENCY") or DEFAULT_CONCURRENCY)
        with ThreadPoolExecutor(max(1, workers)) as pool:
            return list(pool.map(self.score_item, items, completions))

    @staticmethod
    def _result(item: Item, completion: str, value: float | None, detail: dict[str, Any]) -> ItemResult:
        prediction = None if value is None else {1.0: "win", 0.5: "tie", 0.0: "loss"}.get(value, str(value))
        return ItemResult(
            item_id=item["id"],
            completion=completion,
            prediction=prediction,
            target="preferred over the reference",
            correct=value == 1.0,
            value=value,
            detail={**detail, "value": value},
        )

    def summarize(self, results: Sequence[ItemResult]) -> dict[str, Any]:
        """Raw and length-controlled win rates with the fit behind them, and how many items got no verdict."""
        judged = [r for r in results if r.value is not None]
        if not judged:
            errors = sorted({str(r.detail.get("error")) for r in results})[:3]
            raise JudgeError(f"the judge gave no verdict on any of {len(results)} items: {errors}")
        rates = win_rates(
            [r.value for r in judged],
            [r.detail["model_length"] for r in judged],
            [r.detail["reference_length"] for r in judged],
        )
        return {
            "lc_win_rate": rates.lc_win_rate,
            "win_rate": rates.win_rate,
            "n_judged": rates.n_judged,
            "n_no_verdict": len(results) - len(judged),
            "length_slope": rates.length_slope,
            "intercept": rates.intercept,
            "length_scale_chars": rates.length_scale,
        }

    def aggregate(self, results: list[ItemResult]) -> float:
        """The length-controlled win rate; the raw one and the no-verdict count are in `summarize`."""
        summary = self.summarize(results)
        if summary["n_no_verdict"]:
            log.warning("alpacaeval: %d of %d items got no verdict; the win rates leave them out",
                        summary["n_no_verdict"], len(results))  # fmt: skip
        return summary["lc_win_rate"]
