"""WebShop (L3): the offline WebShop-style shop on the tau2 retail catalog, and the real WebShop if installed.

Regenerate the committed offline split with
`python -c "from a2rl_bench.benchmarks.webshop.task import write_offline_manifest; write_offline_manifest()"`.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a2rl_bench.benchmarks.base import Item, Messages, TaskData
from a2rl_bench.benchmarks.envs.base import TextEnv
from a2rl_bench.benchmarks.envs.bm25 import BM25
from a2rl_bench.benchmarks.envs import shop
from a2rl_bench.benchmarks.envs.shop import ShopEnv, listing_text, shop_prompt
from a2rl_bench.benchmarks.envs.splits import read_manifest, split_ids, write_manifest
from a2rl_bench.benchmarks.envs.task import AgentEnvironment, InteractiveTask
from a2rl_bench.benchmarks.webshop.catalog import (
    CATALOG_SEED,
    DB_FILE,
    PACKAGE,
    VERSION,
    WebShopDataError,
    build_catalog,
    catalog_hash,
    read_products,
)
from a2rl_bench.paths import data_file

SPLIT_SEED = 20261
SIZES = {"validation": 100, "test": 100, "train": -1}
MANIFEST = data_file("webshop", "split-offline.json")
REGENERATE = "a2rl_bench.benchmarks.webshop.task.write_offline_manifest()"


@functools.lru_cache(maxsize=1)
def offline_catalog() -> tuple[list[dict], list[dict], str]:
    """(listings, goals, source sha256), built once per process."""
    products, sha256 = read_products()
    listings, goals = build_catalog(products, CATALOG_SEED)
    return listings, goals, sha256


def build_offline_manifest() -> dict[str, Any]:
    listings, goals, sha256 = offline_catalog()
    return {
        "task": "webshop",
        "variant": "offline",
        "seed": SPLIT_SEED,
        "source": {"package": PACKAGE, "version": VERSION, "file": DB_FILE, "sha256": sha256},
        "catalog": {
            "seed": CATALOG_SEED,
            "listings": len(listings),
            "goals": len(goals),
            "sha256": catalog_hash(listings),
        },
        "ids": split_ids([g["id"] for g in goals], SIZES, SPLIT_SEED),
    }


def write_offline_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    manifest = build_offline_manifest()
    write_manifest(path, manifest)
    return manifest


def load_offline(path: Path = MANIFEST) -> TaskData:
    """The committed split, checked against the installed source and the catalog it was made from."""
    committed = read_manifest(path, WebShopDataError, REGENERATE)
    current = build_offline_manifest()
    for key in ("source", "catalog"):
        if current[key] != committed[key]:
            raise WebShopDataError(
                f"the offline shop's {key} differs from the committed split ({current[key]} vs {committed[key]}); "
                f"install {PACKAGE}=={VERSION} or regenerate with {REGENERATE}"
            )
    by_id = {g["id"]: {**g, "variant": "offline"} for g in offline_catalog()[1]}
    ids = committed["ids"]
    return TaskData(
        train=[by_id[i] for i in ids["train"]],
        validation=[by_id[i] for i in ids["validation"]],
        test=[by_id[i] for i in ids["test"]],
        source=f"tau2 retail catalog from {PACKAGE}=={VERSION} ({DB_FILE}, sha256 {current['source']['sha256']}), "
        f"enlarged to {current['catalog']['listings']} listings",
    )


@functools.lru_cache(maxsize=1)
def _offline_index() -> BM25:
    return BM25([listing_text(x) for x in offline_catalog()[0]])


def real_webshop_available() -> bool:
    return importlib.util.find_spec("web_agent_site") is not None


@dataclass
class WebShop(InteractiveTask):
    """Declarative fields (id, title, decoding, variant labels, ...): task.toml beside this file."""
    agent_environment = AgentEnvironment(
        ("a2rl_bench.benchmarks.envs.shop",), "shop:make_env", "shop:shop_prompt"
    )

    def loaders(self) -> dict[str, Callable[[], TaskData]]:
        return {"offline": load_offline, "full": load_full}

    def make_env(self, variant: str) -> Callable[[], TextEnv]:
        if variant == "full":
            return RealWebShopEnv
        listings, index = offline_catalog()[0], _offline_index()
        return lambda: ShopEnv(listings, index)

    def oracle_actions(self, variant: str, goal: Item) -> list[str] | None:
        return shop.oracle_actions(goal) if variant == "offline" else None

    def prompt(self, goal: Item, observation: str, turns: list[dict[str, Any]]) -> Messages:
        return shop_prompt(goal, observation, turns)

    def public_files(self, variant: str) -> dict[str, list[dict]]:
        return {"catalog.jsonl": offline_catalog()[0]} if variant == "offline" else {}


# -- full variant ----------------------------------------------------------------------------------

FULL_MESSAGE = (
    "the `full` WebShop variant needs princeton-nlp/WebShop installed with its data (the `web_agent_site` "
    "package, items_shuffle_1000.json, items_ins_v2_1000.json and a search index; see its setup.sh); "
    "`webshop==0.1.0` on PyPI is a stub. Without it use the `offline` variant."
)


def load_full() -> TaskData:
    """Goals are WebShop session indices: 0-99 hidden test (as in the paper), 100-199 validation, 500+ train."""
    if not real_webshop_available():
        raise WebShopDataError(FULL_MESSAGE)
    goal = lambda i: {"id": f"webshop-session-{i}", "session": i, "variant": "full"}
    return TaskData(
        train=[goal(i) for i in range(500, 1500)],
        validation=[goal(i) for i in range(100, 200)],
        test=[goal(i) for i in range(100)],
        source="princeton-nlp WebShop, WebAgentTextEnv(observation_mode='text', num_products=1000)",
    )


class RealWebShopEnv(TextEnv):
    """The real WebAgentTextEnv behind the TextEnv interface (success = reward 1.0)."""

    def __init__(self) -> None:
        if not real_webshop_available():
            raise WebShopDataError(FULL_MESSAGE)
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv  # type: ignore[import-not-found]

        self.env = WebAgentTextEnv(observation_mode="text", num_products=1000)
        self.done = False

    def reset(self, goal: dict[str, Any], seed: int = 0) -> tuple[str, dict[str, Any]]:
        observation, _ = self.env.reset(session=goal["session"])
        self.done = False
        return observation, {}

    def step(self, action: str) -> Any:
        from a2rl_bench.benchmarks.envs.base import StepResult

        action = action.replace("choose[", "click[")
        observation, reward, done, info = self.env.step(action)
        self.done = done
        return StepResult(observation, float(reward), bool(done), {**(info or {}), "won": done and reward == 1.0})

    def admissible_actions(self) -> list[str]:
        available = self.env.get_available_actions()
        actions = ["search[...]"] if available.get("has_search_bar") else []
        return actions + [f"click[{x}]" for x in available.get("clickables", [])]
