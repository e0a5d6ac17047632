"""AlpacaEval (L2): instruction following scored by a pairwise LLM judge as a length-controlled win rate."""

from __future__ import annotations

from a2rl_bench.benchmarks.alpacaeval.data import AlpacaEvalDataError
from a2rl_bench.benchmarks.alpacaeval.judge import (
    DEFAULT_JUDGE_MODEL,
    JUDGE_PROMPT_VERSION,
    JudgeCache,
    JudgeConfig,
    JudgeError,
    JudgeNotConfigured,
    PairwiseJudge,
    parse_verdict,
)
from a2rl_bench.benchmarks.alpacaeval.length_control import WinRates, win_rates
from a2rl_bench.benchmarks.alpacaeval.task import AlpacaEval

__all__ = [
    "DEFAULT_JUDGE_MODEL",
    "JUDGE_PROMPT_VERSION",
    "AlpacaEval",
    "AlpacaEvalDataError",
    "JudgeCache",
    "JudgeConfig",
    "JudgeError",
    "JudgeNotConfigured",
    "PairwiseJudge",
    "WinRates",
    "parse_verdict",
    "win_rates",
]
