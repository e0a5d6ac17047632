"""A WebShop-style text shop: search -> results -> item (options) -> buy, with WebShop's reward shape.

Pages and actions follow WebShop's text mode: `search[query]` on the search page, `click[<item id>]` on a
results page, `click[<option value>]`, `click[buy now]`, `click[< prev]`, `click[back to search]` on an
item page. Reward at purchase (WebShop's formula without the attribute terms, which this catalog lacks):

    reward = r_type * (matched options + price_ok) / (goal options + 1)

`r_type` is 1 when the bought listing has the goal's product type, else 0. Success means reward == 1.0
(the original harness counted reward >= 0.5 as success). Stdlib + numpy; copied into workspaces.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import StepResult, TextEnv, read_jsonl
from .bm25 import BM25
from .react import Messages, history_prompt

RESULTS_PER_PAGE = 10
_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)

SYSTEM_PROMPT = (
    "You are shopping in a web shop for the item described in the instruction. Each turn, reply with exactly "
    "one action and nothing else.\n"
    "Actions: search[<keywords>] on the search page; click[<item id>] on a results page; on an item page "
    "click[<option value>] to select an option, click[buy now] to buy, click[< prev] to go back to the "
    "results, click[back to search] to search again.\n"
    "Buy the item whose type, options and price match the instruction."
)


def listing_text(listing: dict[str, Any]) -> str:
    values = " ".join(v for values in listing["options"].values() for v in values)
    return f"{listing['title']} {listing['product_type']} {values}"


class ShopEnv(TextEnv):
    """One shopper session over a shared catalog (a list of listings, see `a2rl_bench.benchmarks.webshop.catalog`)."""

    def __init__(self, listings: list[dict[str, Any]], index: BM25 | None = None):
        self.listings = listings
        self.by_id = {listing["id"].lower(): listing for listing in listings}
        self.index = index or BM25([listing_text(x) for x in listings])
        self.goal: dict[str, Any] = {}
        self.page = "search"
        self.results: list[dict[str, Any]] = []
        self.item: dict[str, Any] | None = None
        self.chosen: dict[str, str] = {}
        self.done = False

    # -- TextEnv ---------------------------------------------------------------------------------
    def reset(self, goal: dict[str, Any], seed: int = 0) -> tuple[str, dict[str, Any]]:
        self.goal, self.page, self.results, self.item, self.chosen, self.done = goal, "search", [], None, {}, False
        return self._render(), {"instruction": goal["instruction"]}

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("the episode is over; call reset()")
        match = _ACTION.match(action or "")
        if not match:
            return self._invalid(f"'{action}' is not an action; use search[...] or click[...]")
        verb, arg = match.group(1).lower(), match.group(2).strip()
        if verb == "search":
            if self.page != "search":
                return self._invalid("search is only possible on the search page; click[back to search] first")
            if not arg:
                return self._invalid("search[...] needs keywords")
            self.results = [self.listings[i] for i in self.index.top_k(arg, RESULTS_PER_PAGE)]
            self.page = "results"
            return StepResult(self._render(), 0.0, False, {})
        return self._click(arg.lower())

    def admissible_actions(self) -> list[str]:
        if self.done:
            return []
        if self.page == "search":
            return ["search[...]"]
        if self.page == "results":
            return ["click[back to search]"] + [f"click[{x['id']}]" for x in self.results]
        assert self.item is not None
        values = [f"click[{v}]" for values in self.item["options"].values() for v in values]
        return ["click[back to search]", "click[< prev]", *values, "click[buy now]"]

    # -- pages -----------------------------------------------------------------------------------
    def _click(self, target: str) -> StepResult:
        if target == "back to search" and self.page != "search":
            self.page, self.item, self.chosen = "search", None, {}
            return StepResult(self._render(), 0.0, False, {})
        if self.page == "results" and target in {x["id"].lower() for x in self.results}:
            self.page, self.item, self.chosen = "item", self.by_id[target], {}
            return StepResult(self._render(), 0.0, False, {})
        if self.page == "item" and self.item is not None:
            if target == "< prev":
                self.page, self.item, self.chosen = "results", None, {}
                return StepResult(self._render(), 0.0, False, {})
            if target == "buy now":
                return self._buy()
            if (choice := self._option_for(target)) is not None:
                self.chosen[choice[0]] = choice[1]
                return StepResult(self._render(), 0.0, False, {})
        return self._invalid(f"there is no '{target}' to click on this page")

    def _option_for(self, target: str) -> tuple[str, str] | None:
        """(option, value) a click selects: `name: value`, or a bare value, which goes to the first option
        offering it that is still unset (so `brown` twice sets frame and lens colour), else the first offering it."""
        assert self.item is not None
        options = self.item["options"]
        name, _, value = target.partition(":")
        for option, values in options.items():
            if option.lower() == name.strip():
                found = [v for v in values if v.lower() == value.strip()]
                return (option, found[0]) if found else None
        offering = [(option, v) for option, values in options.items() for v in values if v.lower() == target]
        unset = [pair for pair in offering if pair[0] not in self.chosen]
        return (unset or offering or [None])[0]

    def _buy(self) -> StepResult:
        assert self.item is not None
        price = self.price(self.item, self.chosen)
        reward, parts = shop_reward(self.goal, self.item, self.chosen, price)
        self.done = True
        info = {
            "won": reward == 1.0,
            "purchased": self.item["id"],
            "options": dict(self.chosen),
            "price": price,
            **parts,
        }
        return StepResult(f"Thank you for shopping with us! Your score is {reward:.2f}.", reward, True, info)

    @staticmethod
    def price(listing: dict[str, Any], chosen: dict[str, str]) -> float:
        """The chosen variant's price; the listing's highest price while the choice names no variant."""
        for variant in listing["variants"]:
            if variant["options"] == chosen:
                return variant["price"]
        return max(v["price"] for v in listing["variants"])

    def _invalid(self, why: str) -> StepResult:
        return StepResult(f"Invalid action: {why}.\n{self._render()}", 0.0, False, {"invalid": True})

    def _render(self) -> str:
        head = f"Instruction: {self.goal.get('instruction', '')}"
        if self.page == "search":
            return f"{head}\n[Search]"
        if self.page == "results":
            rows = [f"[{x['id']}] {x['title']} ${min(v['price'] for v in x['variants']):.2f}" for x in self.results]
            body = "\n".join(rows) if rows else "No results."
            return f"{head}\n[Back to Search]\nResults ({len(rows)}):\n{body}"
        assert self.item is not None
        options = "\n".join(
            f"{name}: " + " ".join(f"[{v}]" for v in values) for name, values in self.item["options"].items()
        )
        chosen = ", ".join(f"{k}: {v}" for k, v in self.chosen.items()) or "none"
        price = self.price(self.item, self.chosen)
        return (
            f"{head}\n[Back to Search] [< Prev]\n{self.item['title']}\nPrice: ${price:.2f}\n{options}\n"
            f"Selected: {chosen}\n[Buy Now]"
        )


def shop_reward(
    goal: dict[str, Any], listing: dict[str, Any], chosen: dict[str, str], price: float
) -> tuple[float, dict[str, Any]]:
    """WebShop's reward without attribute terms: r_type * (matched options + price_ok) / (n_options + 1)."""
    r_type = 1.0 if listing["product_type"] == goal["product_type"] else 0.0
    wanted = goal["options"]
    matched = sum(1 for k, v in wanted.items() if chosen.get(k, "").lower() == v.lower())
    price_ok = price <= goal["price_upper"]
    reward = r_type * (matched + price_ok) / (len(wanted) + 1)
    return round(reward, 6), {"r_type": r_type, "matched_options": matched, "price_ok": price_ok}


def oracle_actions(goal: dict[str, Any]) -> list[str]:
    """A winning action sequence for a goal made by `a2rl_bench.benchmarks.webshop.catalog` (it names its target)."""
    query = " ".join([goal["product_type"], *goal["options"].values()])
    return [
        f"search[{query}]",
        f"click[{goal['target']}]",
        *(f"click[{v}]" for v in goal["options"].values()),
        "click[buy now]",
    ]


def shop_prompt(goal: dict[str, Any], observation: str, turns: list[dict[str, Any]], window: int = 4) -> Messages:
    """The evaluator's prompt: the task, the last few steps, and the current page with its actions."""
    return history_prompt(SYSTEM_PROMPT, f"Observation: {observation}", turns, window, action_prefix="")


def make_env(data_dir: Path) -> Callable[[], TextEnv]:
    """envlib's factory for WebShop: the catalog in `data_dir` and its search index, built once."""
    listings = read_jsonl(data_dir / "catalog.jsonl")
    index = BM25([listing_text(x) for x in listings])
    return lambda: ShopEnv(listings, index)
