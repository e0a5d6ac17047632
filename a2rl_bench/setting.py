"""What makes two runs repeats of one another: the setting key (everything but the seed).

Runs that share a setting differ only in their seed, which sets data order and sampling, not the outcome; so
a setting's n is its number of seeds and its interval is over them. Runs that differ in anything else (item
selection, budget, evaluator or decoding, protocol, ...) are different settings and are never pooled.

The store's `run_settings` view computes the same columns in SQL (`a2rl_bench.store.results`, migration 4); a test
checks that `item_selection` and `setting_id` agree between the two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

SETTING_KEY: tuple[str, ...] = (
    "task", "variant", "item_selection", "base_model", "agent", "driver", "mode", "protocol", "budget_s",
    "evaluator_id",
)  # fmt: skip
"""The columns of one setting, in the order `setting_id` hashes them."""
NOISE_KEY: tuple[str, ...] = ("task", "variant", "item_selection", "base_model", "evaluator_id")
"""The baseline's item-level sampling error depends on these only (the base model on the same items)."""
SYSTEM_KEY: tuple[str, ...] = ("agent", "driver", "mode", "protocol", "budget_s")
"""One row of the paper's system × task table."""
UNKNOWN = "unknown"


def item_selection(val_limit: int | None, test_limit: int | None) -> str:
    """Which items a run evaluates: the first N of each split (`all` without a limit)."""
    def part(limit: int | None) -> str:
        return "all" if limit is None else str(int(limit))

    return f"val:{part(val_limit)} test:{part(test_limit)}"


def setting_id(row: Mapping[str, Any]) -> str:
    """12 hex digits naming a setting; equal to the `setting_id` column of the `run_settings` view."""
    return hashlib.md5("|".join(_sql_text(row[k]) for k in SETTING_KEY).encode()).hexdigest()[:12]


def _sql_text(value: Any) -> str:
    """The text DuckDB's `concat_ws` gives a value (DOUBLE 3600.0 → '3600.0'); NULLs become `unknown`."""
    if value is None:
        return UNKNOWN
    if isinstance(value, float):
        return repr(value)
    return str(value)
