"""DeepSearchQA (L3): answer questions with a search tool (offline: TriviaQA over Wikipedia summaries)."""

from __future__ import annotations

from a2rl_bench.benchmarks.deepsearchqa.corpus import DeepSearchQADataError
from a2rl_bench.benchmarks.deepsearchqa.task import DeepSearchQA, write_offline_manifest

__all__ = ["DeepSearchQA", "DeepSearchQADataError", "write_offline_manifest"]
