"""HumanEval (L1): Python functions from docstrings, scored by running their unit tests in a sandbox."""

from __future__ import annotations

from a2rl_bench.benchmarks.humaneval.execution import (
    ExecutionResult, SandboxBroken, SandboxLimits, isolation, run_program,
)
from a2rl_bench.benchmarks.humaneval.programs import build_program, extract_code
from a2rl_bench.benchmarks.humaneval.task import HumanEval, HumanEvalDataError, write_split_manifest

__all__ = [
    "ExecutionResult",
    "HumanEval",
    "HumanEvalDataError",
    "SandboxBroken",
    "SandboxLimits",
    "build_program",
    "extract_code",
    "isolation",
    "run_program",
    "write_split_manifest",
]
