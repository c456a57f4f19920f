"""WebShop's released data files (Yao et al., 2022), read as streams.

The files: the product crawl (`items_shuffle.json`, 1.18M products, or `items_shuffle_1000.json`:
a JSON list of products with `asin`, `name`, `full_description`, `small_description`,
`pricing`, `customization_options`, `category`, `query`, `product_category`), the attribute
file (`items_ins_v2.json` / `items_ins_v2_1000.json`: asin -> `attributes`, `instruction`,
`instruction_attributes`), the human instructions (`items_human_ins.json`: asin -> list of
`instruction`, `instruction_attributes`, `instruction_options`) and, optionally, the reviews.
`released_paths(data_dir, catalogue)` names them in a directory laid out as the release's
`data/`.

Every file is read one record at a time (`jsonstream.JsonStream`): products first, then only the
attribute and instruction records of products kept. Products are cleaned as in the release
(records with asin "nan", longer than 10 characters or repeated are dropped; option values
lower-cased with "/" shown as " | "; prices parsed from "$a" or "$a - $b"). Goals are the
release's: one per human instruction with at least one attribute (or, with
`human_goals=False`, one per option combination of each synthetic instruction), in product
order, then shuffled with seed 233 and split as the release does (first 500 test, next 1,000
eval, the rest train; `Catalogue.release_splits`).

The release draws a ranged product's price (uniform in its range) and each goal's price limit
(the larger of two of the four $10 steps above the price) from Python's unseeded global
generator, first every product's price in file order, then every goal's limit in goal order.
Here the same draws in the same order come from `random.Random(price_seed)`, so a data set and
a seed give one shop in every process.

The catalogue's fingerprint is a SHA-256 of the files' bytes (taken while they stream) and the
options; `Catalogue.index_key` names the indexed documents (the products file and
`num_products`) for the search-index cache (`index_cache.py`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

from bpo_jax.sandboxes.webshop.catalogue import (
    Catalogue, Product, WebShopTask, make_catalogue, price_limit, price_text)
from bpo_jax.sandboxes.webshop.jsonstream import JsonStream

FILES_FORMAT = "bpo_jax.webshop.files/1"
# `catalogue` -> (products file, attribute files in order of preference).
RELEASED_CATALOGUES = {
    "1000": ("items_shuffle_1000.json", ("items_ins_v2_1000.json", "items_ins_v2.json")),
    "full": ("items_shuffle.json", ("items_ins_v2.json",)),
}
HUMAN_INSTRUCTIONS_FILE = "items_human_ins.json"


def released_paths(data_dir: str | os.PathLike[str], catalogue: str = "1000") -> dict[str, str]:
  """`products_path`, `attributes_path`, `human_instructions_path` in a release `data/` dir.

  `catalogue` is "1000" (the release's 1,000-product shop) or "full" (all 1.18M products).
  """
  if catalogue not in RELEASED_CATALOGUES:
    raise ValueError(f"unknown WebShop catalogue {catalogue!r}; expected one of "
                     f"{sorted(RELEASED_CATALOGUES)}")
  data_dir = os.fspath(data_dir)
  products, attribute_files = RELEASED_CATALOGUES[catalogue]
  attributes = next((os.path.join(data_dir, a) for a in attribute_files
                     if os.path.exists(os.path.join(data_dir, a))),
                    os.path.join(data_dir, attribute_files[0]))
  return {"products_path": os.path.join(data_dir, products), "attributes_path": attributes,
          "human_instructions_path": os.path.join(data_dir, HUMAN_INSTRUCTIONS_FILE)}


def _require(record: Mapping[str, Any], key: str, where: str) -> Any:
  if not isinstance(record, dict):
    raise ValueError(f"{where} must be a JSON object, got {type(record).__name__}")
  if key not in record:
    raise ValueError(f"{where} has no {key!r} field")
  return record[key]


def parse_pricing(pricing: Any, where: str) -> list[float]:
  """Prices in a WebShop `pricing` string: "$12.99" -> [12.99]; "$10.00 - $20.50" -> [10.0, 20.5].

  A missing or empty pricing means the release's default of $100.
  """
  if pricing is None or pricing == "" or pricing == []:
    return [100.0]
  if isinstance(pricing, (list, tuple)):
    return [float(x) for x in pricing][:2]
  if not isinstance(pricing, str):
    raise ValueError(f"{where}: pricing must be a string like '$12.99', got {pricing!r}")
  values = []
  for part in pricing.split("$")[1:]:
    digits = re.sub(r"[^\d.]", "", part)
    try:
      values.append(float(Decimal(digits)))
    except InvalidOperation:
      raise ValueError(f"{where}: cannot read a price from {pricing!r}") from None
  if not values:
    raise ValueError(f"{where}: cannot read a price from {pricing!r}")
  return values[:2]


def _option_value(value: str) -> str:
  return value.strip().replace("/", " | ").lower()


def _parse_product(p: Mapping[str, Any], asin: str, where: str, rng: random.Random) -> Product:
  """One record of the products file (no attributes yet); a price range draws from `rng`."""
  pricing = parse_pricing(p.get("pricing"), where)
  if len(pricing) == 1:
    price, tag = pricing[0], f"${pricing[0]}"
  else:
    price, tag = rng.uniform(*pricing), f"${pricing[0]} to ${pricing[1]}"
  options = []
  for name, contents in (p.get("customization_options") or {}).items():
    if contents is None:
      continue
    values = tuple(_option_value(c["value"] if isinstance(c, dict) else str(c)) for c in contents)
    options.append((name.lower(), values))
  bullets = p.get("small_description", [])
  bullets = tuple(bullets) if isinstance(bullets, list) else (str(bullets),)
  return Product(
      asin=asin, title=str(_require(p, "name", where)),
      category=str(_require(p, "category", where)),
      query=str(_require(p, "query", where)).lower().strip(),
      product_category=str(_require(p, "product_category", where)),
      description=str(p.get("full_description") or ""), bullet_points=bullets, attributes=(),
      options=tuple(options), price=float(price), price_tag=tag)


def _read_products(path: str | os.PathLike[str], num_products: int | None,
                   rng: random.Random) -> tuple[list[Product], str]:
  """The usable records of the products file, in order, and the file's digest."""
  products: list[Product] = []
  seen: set[str] = set()
  with JsonStream(path, "products") as stream:
    for i, p in enumerate(stream.iter_array()):
      if num_products is not None and i >= num_products:
        break  # The release cuts the list before dropping records.
      asin = str(_require(p, "asin", f"product {i}"))
      if asin == "nan" or len(asin) > 10 or asin in seen:
        continue  # The release drops these too.
      products.append(_parse_product(p, asin, f"product {i} (asin {asin!r})", rng))
      seen.add(asin)
  return products, stream.digest()


def _read_keyed(path: str | os.PathLike[str] | None, what: str,
                wanted: set[str]) -> tuple[dict[str, Any], str | None]:
  """asin -> record of an asin-keyed file, for the asins in `wanted` only; and its digest."""
  if path is None:
    return {}, None
  with JsonStream(path, what) as stream:
    records = {asin: record for asin, record in stream.iter_object() if asin in wanted}
  return records, stream.digest()


def _read_reviews(path: str | os.PathLike[str] | None,
                  wanted: set[str]) -> tuple[dict[str, tuple[tuple[str, ...], str]], str | None]:
  """asin -> (review texts, average rating) from the reviews file, and its digest."""
  if path is None:
    return {}, None
  reviews: dict[str, tuple[tuple[str, ...], str]] = {}
  with JsonStream(path, "reviews") as stream:
    for i, r in enumerate(stream.iter_array()):
      asin = str(_require(r, "asin", f"review record {i}"))
      if asin in wanted:
        texts = tuple(str(x.get("review", x.get("body", ""))) for x in r.get("reviews", []))
        reviews[asin] = (texts, str(r.get("average_rating", "N.A.")))
  return reviews, stream.digest()


def _goal(product: Product, instruction: str, attrs: Sequence[str], opts: Sequence[str],
          upper: float) -> WebShopTask:
  return WebShopTask(
      task_id="", catalogue="", asin=product.asin, instruction=instruction,
      attributes=tuple(attrs), goal_options=tuple(opts), price_upper=upper,
      query=product.query, name=product.title, product_category=product.product_category,
      category=product.category)


def _human_goals(product: Product, instructions: Any, rng: random.Random) -> list[WebShopTask]:
  """One goal per human instruction of `product` that names at least one attribute."""
  if not isinstance(instructions, list):
    raise ValueError(f"the human instructions of asin {product.asin!r} must be a JSON list")
  goals = []
  for j, ins in enumerate(instructions):
    where = f"human instruction {j} of asin {product.asin!r}"
    attrs = _require(ins, "instruction_attributes", where)
    if not attrs:
      continue  # The release skips instructions without attributes.
    opts = ins.get("instruction_options", [])
    opts = list(opts.values()) if isinstance(opts, dict) else list(opts)
    upper = price_limit(product.price, rng)
    text = str(_require(ins, "instruction", where)).strip(".") + price_text(upper)
    goals.append(_goal(product, text, attrs, opts, upper))
  return goals


def _synthetic_goals(product: Product, record: Mapping[str, Any],
                     rng: random.Random) -> list[WebShopTask]:
  """One goal per combination of `product`'s option values, from the attribute file's
  synthetic instruction (none without one)."""
  text = record.get("instruction")
  attrs = record.get("instruction_attributes")
  if not text or not attrs:
    return []
  upper = price_limit(product.price, rng)
  names = sorted(name for name, _ in product.options)
  values = dict(product.options)
  goals = []
  for combo in itertools.product(*(values[n] for n in names)):
    option_text = ", and ".join(f"{n}: {v}" for n, v in zip(names, combo))
    option_text = f" with {option_text}" if option_text else ""
    goals.append(_goal(product, f"{text}{option_text}{price_text(upper)}", attrs, combo, upper))
  return goals


def _digest_of(payload: Mapping[str, Any]) -> str:
  blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def load_webshop_files(
    products_path: str | os.PathLike[str],
    attributes_path: str | os.PathLike[str] | None = None,
    human_instructions_path: str | os.PathLike[str] | None = None,
    reviews_path: str | os.PathLike[str] | None = None,
    num_products: int | None = None,
    human_goals: bool = True,
    price_seed: int = 0,
) -> Catalogue:
  """Builds a catalogue from WebShop's JSON files, streamed (see the module docstring).

  `num_products` keeps the first that many records of the products file (as the release's
  `num_products`); `price_seed` seeds the price draws the release leaves unseeded.
  """
  if human_goals and not human_instructions_path:
    raise ValueError("human_goals=True needs human_instructions_path")
  if not human_goals and not attributes_path:
    raise ValueError("human_goals=False (synthetic instructions) needs attributes_path")
  if num_products is not None and (not isinstance(num_products, int) or num_products < 1):
    raise ValueError(f"num_products must be a positive integer or None, got {num_products!r}")
  # One generator for product prices, then goal price limits, in file order.
  rng = random.Random(price_seed)
  products, products_digest = _read_products(products_path, num_products, rng)
  if not products:
    raise ValueError(f"no usable products in {os.fspath(products_path)!r}")
  asins = {p.asin for p in products}
  attributes, attributes_digest = _read_keyed(attributes_path, "attributes", asins)
  human, human_digest = _read_keyed(human_instructions_path if human_goals else None,
                                    "human instructions", asins)
  reviews, reviews_digest = _read_reviews(reviews_path, asins)
  for i, p in enumerate(products):
    texts, rating = reviews.get(p.asin, ((), "N.A."))
    attrs = attributes.get(p.asin, {})
    attrs = tuple(attrs.get("attributes", ())) if isinstance(attrs, dict) else ()
    products[i] = Product(**{**p.__dict__, "attributes": attrs, "reviews": texts,
                             "rating": rating})
  goals: list[WebShopTask] = []
  for product in products:
    if human_goals:
      goals += _human_goals(product, human.get(product.asin, []), rng)
    else:
      goals += _synthetic_goals(product, attributes.get(product.asin, {}), rng)
  fingerprint = _digest_of({
      "format": FILES_FORMAT, "num_products": num_products, "human_goals": bool(human_goals),
      "price_seed": price_seed, "products": products_digest, "attributes": attributes_digest,
      "human_instructions": human_digest, "reviews": reviews_digest})
  index_key = _digest_of({"format": FILES_FORMAT, "products": products_digest,
                          "num_products": num_products})[:24]
  return make_catalogue(products, goals, fingerprint=fingerprint, release_splits=True,
                        index_key=index_key)
