"""WebShop (L3): shop for an instructed item; success = reward 1.0 (WebShop-style offline, real WebShop `full`)."""

from __future__ import annotations

from a2rl_bench.benchmarks.webshop.catalog import WebShopDataError
from a2rl_bench.benchmarks.webshop.task import WebShop, write_offline_manifest

__all__ = ["WebShop", "WebShopDataError", "write_offline_manifest"]
