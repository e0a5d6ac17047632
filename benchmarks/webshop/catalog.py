"""The offline WebShop-style catalog and goals, built deterministically from the tau2 retail catalog.

tau2-bench's retail domain (in the `inspect-evals==0.28.0` wheel) has 50 products with 591 variants
(options such as color/size/material + a price). Search has to matter, so the catalog is enlarged:
- each product's variants are dealt out to 2-5 listings of different (made-up) brands, so one product
  type has several listings and each offers only some option combinations;
- every listing gets a pricier twin from another brand (same options, 60-90 % dearer: over any goal's
  price bound) and each product type gets two accessory listings of another type ("... case").
One goal per real variant: its product type, all its option values and a price bound 20 % above its price.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
from pathlib import Path
from typing import Any
from a2rl_bench.benchmarks.base import wheel_data_file

PACKAGE, VERSION = "inspect-evals", "0.28.0"
DB_FILE = "inspect_evals/tau2/data/domains/retail/db.json.gz"
CATALOG_SEED = 7
BRANDS = (
    "Acorn", "Bluefin", "Cedarline", "Driftwood", "Emberly", "Foxglove", "Granite", "Harbor", "Ironbark",
    "Juniper", "Kestrel", "Lumen", "Meridian", "Northwind", "Orchard", "Pinecrest",
)  # fmt: skip
ACCESSORIES = ("protective case", "replacement parts kit")
PRICE_SLACK = 1.2
"""A goal's price bound is the variant's price times this, rounded up to a whole dollar."""


class WebShopDataError(RuntimeError):
    """The offline shop's source data is missing or differs from what the committed split was made from."""


def db_path() -> Path:
    return wheel_data_file(PACKAGE, VERSION, DB_FILE, WebShopDataError,
                           "the tau2 retail catalog the offline WebShop-style shop is built from")


def read_products() -> tuple[list[dict[str, Any]], str]:
    """tau2 retail products (sorted by product id) and the sha256 of the db file."""
    raw = db_path().read_bytes()
    db = json.loads(gzip.decompress(raw))
    return [db["products"][k] for k in sorted(db["products"])], hashlib.sha256(raw).hexdigest()


def _listing_id(n: int) -> str:
    return f"B{hashlib.sha256(f'listing-{n}'.encode()).hexdigest()[:8].upper()}"


def _options_of(variants: list[dict[str, Any]]) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    for variant in variants:
        for name, value in variant["options"].items():
            if value not in options.setdefault(name, []):
                options[name].append(value)
    return {name: sorted(values) for name, values in options.items()}


def _listing(n: int, brand: str, name: str, product_type: str, variants: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": _listing_id(n),
        "title": f"{brand} {name}",
        "brand": brand,
        "product_type": product_type,
        "options": _options_of(variants),
        "variants": variants,
    }


def build_catalog(products: list[dict[str, Any]], seed: int = CATALOG_SEED) -> tuple[list[dict], list[dict]]:
    """(listings, goals). Listings are shuffled so that ids and order say nothing about the product."""
    rng = random.Random(seed)
    listings: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    for product in products:
        ptype = product["name"].lower()
        variants = [
            {"options": dict(v["options"]), "price": float(v["price"]), "variant_id": v["item_id"]}
            for _, v in sorted(product["variants"].items())
        ]
        rng.shuffle(variants)
        n_listings = max(2, min(5, math.ceil(len(variants) / 4)))
        brands = rng.sample(BRANDS, n_listings * 2 + len(ACCESSORIES))
        for k in range(n_listings):
            chunk = variants[k::n_listings]
            real = _listing(len(listings), brands[k], product["name"], ptype, chunk)
            listings.append(real)
            for variant in chunk:
                goals.append(_goal(ptype, variant, real["id"]))
            dearer = [
                {**v, "price": round(v["price"] * rng.uniform(1.6, 1.9), 2), "variant_id": v["variant_id"] + "-x"}
                for v in chunk
            ]
            listings.append(_listing(len(listings), brands[n_listings + k], product["name"], ptype, dearer))
        for j, accessory in enumerate(ACCESSORIES):
            extra = [
                {**v, "price": round(v["price"] * 0.2, 2), "variant_id": v["variant_id"] + f"-a{j}"}
                for v in variants[:6]
            ]
            listings.append(
                _listing(
                    len(listings),
                    brands[2 * n_listings + j],
                    f"{product['name']} {accessory}",
                    f"{ptype} {accessory}",
                    extra,
                )
            )
    rng.shuffle(listings)
    return listings, goals


def _goal(ptype: str, variant: dict[str, Any], listing_id: str) -> dict[str, Any]:
    bound = math.ceil(variant["price"] * PRICE_SLACK)
    wanted = ", ".join(f"{k}: {v}" for k, v in variant["options"].items())
    article = "an" if ptype[0] in "aeiou" else "a"
    return {
        "id": f"webshop-{variant['variant_id']}",
        "instruction": f"i am looking for {article} {ptype} with {wanted}, and price lower than {bound:.2f} dollars",
        "product_type": ptype,
        "options": dict(variant["options"]),
        "price_upper": float(bound),
        "target": listing_id,
    }


def catalog_hash(listings: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(listings, sort_keys=True).encode()).hexdigest()
