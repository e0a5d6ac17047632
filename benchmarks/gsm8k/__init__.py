"""GSM8K (L1): grade-school math word problems, scored by exact match of the final number."""

from __future__ import annotations

from a2rl_bench.benchmarks.gsm8k.answers import extract_answer, normalize_number, reference_target
from a2rl_bench.benchmarks.gsm8k.task import GSM8K, GSM8KDataError, write_offline_manifest

__all__ = [
    "GSM8K",
    "GSM8KDataError",
    "extract_answer",
    "normalize_number",
    "reference_target",
    "write_offline_manifest",
]
