"""ALFWorld (L3): household text games (offline: ALFWorld-style, generated from the alfworld wheel)."""

from __future__ import annotations

from a2rl_bench.benchmarks.alfworld.games import ALFWorldDataError
from a2rl_bench.benchmarks.alfworld.task import ALFWorld, write_offline_manifest

__all__ = ["ALFWorld", "ALFWorldDataError", "write_offline_manifest"]
