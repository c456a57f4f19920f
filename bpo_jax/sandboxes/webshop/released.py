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

Every record read is checked against the release's layout (the fields and their JSON types
above; an option entry is {"value": ..., "image": ...}); a file that is missing or not JSON, or a
record that does not fit, raises `TaskInputError` in one line naming the file and the record
(product index and asin, or the asin of a keyed file, and the instruction's index).

The catalogue's fingerprint is a SHA-256 of the files' bytes (taken while they stream) and the
options; `Catalogue.index_key` names the indexed documents (the products file and
`num_products`) for the search-index cache (`index_cache.py`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

from bpo_jax.sandboxes.base import TaskInputError
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
    raise TaskInputError(f"unknown WebShop catalogue {catalogue!r}; expected one of "
                     f"{sorted(RELEASED_CATALOGUES)}")
  data_dir = os.fspath(data_dir)
  products, attribute_files = RELEASED_CATALOGUES[catalogue]
  attributes = next((os.path.join(data_dir, a) for a in attribute_files
                     if os.path.exists(os.path.join(data_dir, a))),
                    os.path.join(data_dir, attribute_files[0]))
  return {"products_path": os.path.join(data_dir, products), "attributes_path": attributes,
          "human_instructions_path": os.path.join(data_dir, HUMAN_INSTRUCTIONS_FILE)}


def _json_type(value: Any) -> str:
  """How JSON names the type of a parsed value ("an object", "a list", "null", ...)."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "a boolean"
  names = {dict: "an object", list: "a list", str: "a string", int: "a number",
           float: "a number"}
  return names.get(type(value), type(value).__name__)


def _bad(where: str, problem: str) -> TaskInputError:
  return TaskInputError(f"{where}: {problem}")


def _object(record: Any, where: str) -> Mapping[str, Any]:
  if not isinstance(record, dict):
    raise _bad(where, f"must be a JSON object, got {_json_type(record)}")
  return record


def _require(record: Mapping[str, Any], key: str, where: str) -> Any:
  if key not in _object(record, where):
    raise _bad(where, f"has no {key!r} field")
  return record[key]


def _text(record: Mapping[str, Any], key: str, where: str, required: bool = True) -> str | None:
  """The string field `key` (None when absent or null and not `required`)."""
  value = _require(record, key, where) if required else record.get(key)
  if value is None and not required:
    return None
  if not isinstance(value, str):
    raise _bad(where, f"{key} must be a string, got {_json_type(value)}")
  return value


def _texts(record: Mapping[str, Any], key: str, where: str,
           required: bool = True) -> list[str] | None:
  """The list-of-strings field `key` (None when absent or null and not `required`)."""
  value = _require(record, key, where) if required else record.get(key)
  if value is None and not required:
    return None
  if not isinstance(value, list):
    raise _bad(where, f"{key} must be a list of strings, got {_json_type(value)}")
  for j, item in enumerate(value):
    if not isinstance(item, str):
      raise _bad(where, f"{key}[{j}] must be a string, got {_json_type(item)}")
  return value


def parse_pricing(pricing: Any, where: str) -> list[float]:
  """Prices in a WebShop `pricing` string: "$12.99" -> [12.99]; "$10.00 - $20.50" -> [10.0, 20.5].

  A missing or empty pricing means the release's default of $100; a list of one or two numbers
  is taken as the prices themselves.
  """
  if pricing is None or pricing == "" or pricing == []:
    return [100.0]
  if isinstance(pricing, list):
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
               for x in pricing):
      raise _bad(where, f"pricing must be a string like '$12.99' or a list of numbers, got "
                        f"{pricing!r}")
    return [float(x) for x in pricing][:2]
  if not isinstance(pricing, str):
    raise _bad(where, f"pricing must be a string like '$12.99', got {_json_type(pricing)}")
  values = []
  for part in pricing.split("$")[1:]:
    digits = re.sub(r"[^\d.]", "", part)
    try:
      values.append(float(Decimal(digits)))
    except InvalidOperation:
      raise _bad(where, f"cannot read a price from {pricing!r}") from None
  if not values or not all(math.isfinite(v) for v in values):
    raise _bad(where, f"cannot read a price from {pricing!r}")
  return values[:2]


def _option_value(value: str) -> str:
  return value.strip().replace("/", " | ").lower()


def _options(p: Mapping[str, Any], where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
  """`customization_options` ({name: [{"value": v, "image": ...}, ...] or null}, or null) as
  (lower-cased name, cleaned values) pairs; a null option is skipped, as the release does."""
  given = p.get("customization_options")
  if given is None:
    return ()
  if not isinstance(given, dict):
    raise _bad(where, "customization_options must be a JSON object (option name -> list of "
                      f"{{\"value\": ...}} entries), got {_json_type(given)}")
  options = []
  for name, contents in given.items():
    if contents is None:
      continue
    at = f"{where}, customization option {name!r}"
    if not isinstance(contents, list):
      raise _bad(at, f"must be a list of {{\"value\": ...}} entries, got {_json_type(contents)}")
    values = tuple(_option_value(_text(_object(c, f"{at} entry {j}"), "value",
                                       f"{at} entry {j}"))
                   for j, c in enumerate(contents))
    options.append((name.lower(), values))
  return tuple(options)


def _parse_product(p: Mapping[str, Any], asin: str, where: str, rng: random.Random) -> Product:
  """One record of the products file (no attributes yet); a price range draws from `rng`."""
  pricing = parse_pricing(p.get("pricing"), where)
  if len(pricing) == 1:
    price, tag = pricing[0], f"${pricing[0]}"
  else:
    price, tag = rng.uniform(*pricing), f"${pricing[0]} to ${pricing[1]}"
  bullets = p.get("small_description")
  bullets = (str(bullets),) if isinstance(bullets, str) else tuple(
      _texts(p, "small_description", where, required=False) or ())
  return Product(
      asin=asin, title=_text(p, "name", where), category=_text(p, "category", where),
      query=_text(p, "query", where).lower().strip(),
      product_category=_text(p, "product_category", where),
      description=_text(p, "full_description", where, required=False) or "",
      bullet_points=bullets, attributes=(), options=_options(p, where), price=float(price),
      price_tag=tag)


def _read_products(path: str | os.PathLike[str], num_products: int | None,
                   rng: random.Random) -> tuple[list[Product], str]:
  """The usable records of the products file, in order, and the file's digest."""
  products: list[Product] = []
  seen: set[str] = set()
  with JsonStream(path, "products") as stream:
    for i, p in enumerate(stream.iter_array()):
      if num_products is not None and i >= num_products:
        break  # The release cuts the list before dropping records.
      where = f"WebShop products file {stream.path!r}, product {i}"
      asin = _text(p, "asin", where)
      if asin == "nan" or len(asin) > 10 or asin in seen:
        continue  # The release drops these too.
      products.append(_parse_product(p, asin, f"{where} (asin {asin!r})", rng))
      seen.add(asin)
  return products, stream.digest()


def _check_attributes(record: Any, where: str) -> None:
  """A record of the attribute file: {"attributes": [...], "instruction": "...",
  "instruction_attributes": [...]}, each field optional."""
  _object(record, where)
  _texts(record, "attributes", where, required=False)
  _text(record, "instruction", where, required=False)
  _texts(record, "instruction_attributes", where, required=False)


def _check_human(record: Any, where: str) -> None:
  """A record of the human instructions file: a list of {"instruction": "...",
  "instruction_attributes": [...], "instruction_options": [...] or {name: value}}."""
  if not isinstance(record, list):
    raise _bad(where, f"must be a JSON list of instructions, got {_json_type(record)}")
  for j, ins in enumerate(record):
    at = f"{where}, instruction {j}"
    _text(ins, "instruction", at)
    _texts(ins, "instruction_attributes", at)
    opts = ins.get("instruction_options")
    if isinstance(opts, dict):
      _texts({"instruction_options": list(opts.values())}, "instruction_options", at)
    else:
      _texts(ins, "instruction_options", at, required=False)


def _read_keyed(path: str | os.PathLike[str] | None, what: str, wanted: set[str],
                check) -> tuple[dict[str, Any], str | None]:
  """asin -> record of an asin-keyed file, for the asins in `wanted` only, each checked by
  `check(record, where)`; and the file's digest."""
  if path is None:
    return {}, None
  records = {}
  with JsonStream(path, what) as stream:
    for asin, record in stream.iter_object():
      if asin in wanted:
        check(record, f"WebShop {what} file {stream.path!r}, asin {asin!r}")
        records[asin] = record
  return records, stream.digest()


def _read_reviews(path: str | os.PathLike[str] | None,
                  wanted: set[str]) -> tuple[dict[str, tuple[tuple[str, ...], str]], str | None]:
  """asin -> (review texts, average rating) from the reviews file, and its digest."""
  if path is None:
    return {}, None
  reviews: dict[str, tuple[tuple[str, ...], str]] = {}
  with JsonStream(path, "reviews") as stream:
    for i, r in enumerate(stream.iter_array()):
      where = f"WebShop reviews file {stream.path!r}, record {i}"
      asin = _text(r, "asin", where)
      if asin not in wanted:
        continue
      entries = r.get("reviews") or []
      if not isinstance(entries, list):
        raise _bad(where, f"reviews must be a list, got {_json_type(entries)}")
      texts = []
      for j, x in enumerate(entries):
        at = f"{where} (asin {asin!r}), review {j}"
        texts.append(_text(x, "review", at) if "review" in _object(x, at)
                     else _text(x, "body", at, required=False) or "")
      reviews[asin] = (tuple(texts), str(r.get("average_rating", "N.A.")))
  return reviews, stream.digest()


def _goal(product: Product, instruction: str, attrs: Sequence[str], opts: Sequence[str],
          upper: float) -> WebShopTask:
  return WebShopTask(
      task_id="", catalogue="", asin=product.asin, instruction=instruction,
      attributes=tuple(attrs), goal_options=tuple(opts), price_upper=upper,
      query=product.query, name=product.title, product_category=product.product_category,
      category=product.category)


def _human_goals(product: Product, instructions: list[Mapping[str, Any]],
                 rng: random.Random) -> list[WebShopTask]:
  """One goal per human instruction of `product` that names at least one attribute (the
  records are checked by `_check_human`)."""
  goals = []
  for ins in instructions:
    attrs = ins["instruction_attributes"]
    if not attrs:
      continue  # The release skips instructions without attributes.
    opts = ins.get("instruction_options") or []
    opts = list(opts.values()) if isinstance(opts, dict) else list(opts)
    upper = price_limit(product.price, rng)
    text = ins["instruction"].strip(".") + price_text(upper)
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
    raise TaskInputError("human_goals=True needs human_instructions_path")
  if not human_goals and not attributes_path:
    raise TaskInputError("human_goals=False (synthetic instructions) needs attributes_path")
  if num_products is not None and (isinstance(num_products, bool) or
                                   not isinstance(num_products, int) or num_products < 1):
    raise TaskInputError(f"num_products must be a positive integer or None, got "
                         f"{num_products!r}")
  # One generator for product prices, then goal price limits, in file order.
  rng = random.Random(price_seed)
  products, products_digest = _read_products(products_path, num_products, rng)
  if not products:
    raise TaskInputError(f"WebShop products file {os.fspath(products_path)!r}: no usable "
                         "products")
  asins = {p.asin for p in products}
  attributes, attributes_digest = _read_keyed(attributes_path, "attributes", asins,
                                              _check_attributes)
  human, human_digest = _read_keyed(human_instructions_path if human_goals else None,
                                    "human instructions", asins, _check_human)
  reviews, reviews_digest = _read_reviews(reviews_path, asins)
  for i, p in enumerate(products):
    texts, rating = reviews.get(p.asin, ((), "N.A."))
    attrs = tuple(attributes.get(p.asin, {}).get("attributes") or ())
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
