"""ALFWorld (L3): household text games (offline: ALFWorld-style, generated from the alfworld wheel)."""

from __future__ import annotations

from benchmarks.alfworld.games import ALFWorldDataError
from benchmarks.alfworld.task import ALFWorld, write_offline_manifest

__all__ = ["ALFWorld", "ALFWorldDataError", "write_offline_manifest"]
