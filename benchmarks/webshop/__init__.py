"""WebShop (L3): shop for an instructed item; success = reward 1.0 (WebShop-style offline, real WebShop `full`)."""

from __future__ import annotations

from benchmarks.webshop.catalog import WebShopDataError
from benchmarks.webshop.task import WebShop, write_offline_manifest

__all__ = ["WebShop", "WebShopDataError", "write_offline_manifest"]
