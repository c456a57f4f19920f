"""The shop's static data: products, instructions (goals) and a fingerprint that names them.

Two sources build the same types:

* `load_webshop_files` reads the JSON files released with WebShop (Yao et al., 2022): the
  product crawl (`items_shuffle*.json`: a list of products with `asin`, `name`,
  `full_description`, `small_description`, `pricing`, `customization_options`, `category`,
  `query`, `product_category`), the attribute file (`items_ins_v2*.json`: asin -> `attributes`,
  `instruction`, `instruction_attributes`), the human instructions (`items_human_ins.json`:
  asin -> list of `instruction`, `instruction_attributes`, `instruction_options`) and,
  optionally, the reviews. Products are cleaned as in the WebShop release (option values
  lower-cased with "/" shown as " | ", prices parsed from "$a" or "$a - $b", a price range
  replaced by one draw from it).
* `generate_catalogue` builds a synthetic catalogue with instructions for offline use: a few
  product types, each with a category path, a pool of attributes and option values, so that
  products of one type differ in attributes, options and price, and each instruction names
  attributes and options of its own target product.

The catalogue and its search index are read-only and shared by every snapshot of a shop; a
snapshot carries only the catalogue's fingerprint (a SHA-256 of its canonical JSON), so restoring
needs a process that built the shop from the same files or the same generator seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import random
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

# Price limits an instruction may state (reference: 10, 20, ..., 990 dollars).
PRICE_LIMITS = tuple(10.0 * i for i in range(1, 100))
# Price limit of an instruction whose product is too expensive for the list above: no limit.
NO_PRICE_LIMIT = 1_000_000.0
# The WebShop release shuffles its goals with this seed before splitting them.
GOAL_SHUFFLE_SEED = 233


@dataclasses.dataclass(frozen=True)
class Product:
  """One product as the shop shows it. `options` maps option names to their values, in order."""

  asin: str
  title: str
  category: str
  query: str
  product_category: str
  description: str
  bullet_points: tuple[str, ...]
  attributes: tuple[str, ...]
  options: tuple[tuple[str, tuple[str, ...]], ...]
  price: float
  price_tag: str
  rating: str = "N.A."
  reviews: tuple[str, ...] = ()

  @property
  def text(self) -> str:
    """Title, bullet points and description: where the reward looks for attributes."""
    return " ".join((self.title, " ".join(self.bullet_points), self.description))


@dataclasses.dataclass(frozen=True)
class WebShopTask:
  """An instruction to buy a product: the unit of work `reset` takes. Picklable.

  `catalogue` is the fingerprint of the shop the task belongs to; `goal_options` are target
  option values; `name`, `query`, `product_category` describe the target for the type reward.
  """

  task_id: str
  catalogue: str
  asin: str
  instruction: str
  attributes: tuple[str, ...]
  goal_options: tuple[str, ...]
  price_upper: float
  query: str
  name: str
  product_category: str
  category: str


@dataclasses.dataclass(frozen=True, eq=False)
class Catalogue:
  """Products and goals of one shop, with their fingerprint and an asin lookup."""

  products: tuple[Product, ...]
  goals: tuple[WebShopTask, ...]
  fingerprint: str
  by_asin: Mapping[str, Product]

  def split_indices(self, split: str) -> list[int]:
    """Goal indices of a split: `test`, `eval` or `train` (see `split_goal_indices`)."""
    return split_goal_indices(len(self.goals), split)


def split_goal_indices(num_goals: int, split: str) -> list[int]:
  """Splits goals as the WebShop release does: shuffle with seed 233, then test, eval, train.

  The release takes goals [0, 500) for test and [500, 1500) for eval; small catalogues take
  10% each instead: n_test = min(500, n // 10), n_eval = min(1000, n // 10).
  Example: 100 goals give 10 test, 10 eval and 80 train indices.
  """
  order = list(range(num_goals))
  random.Random(GOAL_SHUFFLE_SEED).shuffle(order)
  n_test = min(500, num_goals // 10)
  n_eval = min(1000, num_goals // 10)
  bounds = {"test": (0, n_test), "eval": (n_test, n_test + n_eval),
            "train": (n_test + n_eval, num_goals)}
  if split not in bounds:
    raise ValueError(f"unknown split {split!r}; expected one of {sorted(bounds)}")
  lo, hi = bounds[split]
  return order[lo:hi]


def price_limit(price: float, rng: random.Random) -> float:
  """A goal's price limit, as in the release: the larger of two of the four limits above price.

  Returns NO_PRICE_LIMIT when fewer than two limits lie above the price.
  """
  above = [p for p in PRICE_LIMITS if p > price][:4]
  if len(above) < 2:
    return NO_PRICE_LIMIT
  return max(rng.sample(above, 2))


def price_text(price_upper: float) -> str:
  return "" if price_upper >= NO_PRICE_LIMIT else f", and price lower than {price_upper:.2f} dollars"


def _fingerprint(products: Sequence[Product], goals: Sequence[WebShopTask]) -> str:
  payload = {
      "products": [dataclasses.asdict(p) for p in products],
      "goals": [dataclasses.asdict(dataclasses.replace(g, task_id="", catalogue=""))
                for g in goals],
  }
  blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
  return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def make_catalogue(products: Sequence[Product], goals: Sequence[WebShopTask]) -> Catalogue:
  """Seals products and goals: checks them, fingerprints them, and names each goal.

  Goals get `task_id = "webshop-<fingerprint[:12]>-<index>"` and the full fingerprint.
  """
  by_asin: dict[str, Product] = {}
  for p in products:
    if p.asin in by_asin:
      raise ValueError(f"duplicate product asin {p.asin!r}")
    by_asin[p.asin] = p
  for i, g in enumerate(goals):
    if g.asin not in by_asin:
      raise ValueError(f"goal {i} targets asin {g.asin!r}, which is not in the catalogue")
    if not g.price_upper > 0:
      raise ValueError(f"goal {i} has a non-positive price limit {g.price_upper!r}")
  fingerprint = _fingerprint(products, goals)
  named = tuple(
      dataclasses.replace(g, task_id=f"webshop-{fingerprint[:12]}-{i:06d}", catalogue=fingerprint)
      for i, g in enumerate(goals))
  return Catalogue(tuple(products), named, fingerprint, by_asin)


# ---------------------------------------------------------------------------------------------
# WebShop's JSON files.


def _load_json(path: str | os.PathLike[str], what: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    raise FileNotFoundError(f"WebShop {what} file not found: {os.fspath(path)!r}") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"WebShop {what} file {os.fspath(path)!r} is not valid JSON: {e}") from None


def _require(record: Mapping[str, Any], key: str, where: str) -> Any:
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


def _load_reviews(path: str | os.PathLike[str]) -> dict[str, tuple[tuple[str, ...], str]]:
  """asin -> (review texts, average rating) from WebShop's reviews file."""
  reviews: dict[str, tuple[tuple[str, ...], str]] = {}
  for r in _load_json(path, "reviews"):
    texts = tuple(str(x.get("review", x.get("body", ""))) for x in r.get("reviews", []))
    reviews[r["asin"]] = (texts, str(r.get("average_rating", "N.A.")))
  return reviews


def _parse_product(p: Mapping[str, Any], asin: str, where: str, rng: random.Random,
                   attributes: Mapping[str, Any],
                   reviews: Mapping[str, tuple[tuple[str, ...], str]]) -> Product:
  """One record of the products file; a price range draws its price from `rng`."""
  pricing = parse_pricing(p.get("pricing"), where)
  if len(pricing) == 1:
    price, tag = pricing[0], f"${pricing[0]}"
  else:
    price, tag = rng.uniform(*pricing), f"${pricing[0]} to ${pricing[1]}"
  options = []
  for name, contents in (p.get("customization_options") or {}).items():
    if contents is None:
      continue
    values = tuple(_option_value(c["value"] if isinstance(c, Mapping) else str(c)) for c in contents)
    options.append((name.lower(), values))
  bullets = p.get("small_description", [])
  bullets = tuple(bullets) if isinstance(bullets, list) else (str(bullets),)
  product_reviews, rating = reviews.get(asin, ((), "N.A."))
  return Product(
      asin=asin,
      title=str(_require(p, "name", where)),
      category=str(_require(p, "category", where)),
      query=str(_require(p, "query", where)).lower().strip(),
      product_category=str(_require(p, "product_category", where)),
      description=str(p.get("full_description") or ""),
      bullet_points=bullets,
      attributes=tuple(attributes.get(asin, {}).get("attributes", ())),
      options=tuple(options),
      price=float(price),
      price_tag=tag,
      rating=rating,
      reviews=product_reviews,
  )


def _parse_products(raw_products: Sequence[Mapping[str, Any]], rng: random.Random,
                    attributes: Mapping[str, Any],
                    reviews: Mapping[str, tuple[tuple[str, ...], str]]) -> list[Product]:
  """The usable records of the products file, in order (the release drops the same ones)."""
  products: list[Product] = []
  seen: set[str] = set()
  for i, p in enumerate(raw_products):
    asin = str(_require(p, "asin", f"product {i}"))
    if asin == "nan" or len(asin) > 10 or asin in seen:
      continue  # The release drops these too.
    products.append(_parse_product(p, asin, f"product {i} (asin {asin!r})", rng, attributes,
                                   reviews))
    seen.add(asin)
  return products


def _goal(product: Product, instruction: str, attrs: Sequence[str], opts: Sequence[str],
          upper: float) -> WebShopTask:
  return WebShopTask(
      task_id="", catalogue="", asin=product.asin, instruction=instruction,
      attributes=tuple(attrs), goal_options=tuple(opts), price_upper=upper,
      query=product.query, name=product.title, product_category=product.product_category,
      category=product.category)


def _human_goals(product: Product, instructions: Sequence[Mapping[str, Any]],
                 rng: random.Random) -> list[WebShopTask]:
  """One goal per human instruction of `product` that names at least one attribute."""
  goals = []
  for j, ins in enumerate(instructions):
    where = f"human instruction {j} of asin {product.asin!r}"
    attrs = _require(ins, "instruction_attributes", where)
    if not attrs:
      continue  # The release skips instructions without attributes.
    opts = ins.get("instruction_options", [])
    opts = list(opts.values()) if isinstance(opts, Mapping) else list(opts)
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


def load_webshop_files(
    products_path: str | os.PathLike[str],
    attributes_path: str | os.PathLike[str] | None = None,
    human_instructions_path: str | os.PathLike[str] | None = None,
    reviews_path: str | os.PathLike[str] | None = None,
    num_products: int | None = None,
    human_goals: bool = True,
    price_seed: int = 0,
) -> Catalogue:
  """Builds a catalogue from WebShop's JSON files (see the module docstring for the fields).

  Goals come from the human instructions (`human_goals=True`, one goal per instruction with at
  least one attribute) or from the attribute file's synthetic instructions (one goal per
  combination of option values, as in the release). Prices drawn from a range and price limits
  come from `random.Random(price_seed)`, so the same files and seed give the same shop.
  """
  raw_products = _load_json(products_path, "products")
  if not isinstance(raw_products, list):
    raise ValueError("the WebShop products file must hold a JSON list of products")
  attributes = _load_json(attributes_path, "attributes") if attributes_path else {}
  human = _load_json(human_instructions_path, "human instructions") if human_instructions_path else {}
  if human_goals and not human_instructions_path:
    raise ValueError("human_goals=True needs human_instructions_path")
  if not human_goals and not attributes_path:
    raise ValueError("human_goals=False (synthetic instructions) needs attributes_path")
  reviews = _load_reviews(reviews_path) if reviews_path else {}
  if num_products is not None:
    raw_products = raw_products[:num_products]
  # One generator for product prices, then goal price limits, in file order.
  rng = random.Random(price_seed)
  products = _parse_products(raw_products, rng, attributes, reviews)
  goals: list[WebShopTask] = []
  for product in products:
    if human_goals:
      goals += _human_goals(product, human.get(product.asin, []), rng)
    else:
      goals += _synthetic_goals(product, attributes.get(product.asin, {}), rng)
  if not products:
    raise ValueError(f"no usable products in {os.fspath(products_path)!r}")
  return make_catalogue(products, goals)


# ---------------------------------------------------------------------------------------------
# The synthetic catalogue.

_COLORS = ("black", "white", "navy blue", "grey", "red", "pink", "beige", "dark green",
           "light blue")


@dataclasses.dataclass(frozen=True)
class _ProductType:
  title: str
  query: str
  product_category: str
  attributes: tuple[str, ...]
  options: tuple[tuple[str, tuple[str, ...]], ...]
  price_range: tuple[float, float]


# Attribute pools avoid near-duplicates ("machine wash" / "machine washable") within a type so
# that a product lacking an attribute does not match it fuzzily.
_PRODUCT_TYPES = (
    _ProductType("Shampoo", "shampoo",
                 "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
                 ("sulfate free", "paraben free", "natural ingredients", "for dry hair",
                  "long lasting", "cruelty free", "color safe"),
                 (("size", ("8 fl oz", "12 fl oz", "16.9 fl oz", "33.8 fl oz")),
                  ("scent", ("lavender", "coconut", "unscented", "citrus"))), (6.0, 38.0)),
    _ProductType("Conditioner", "conditioner",
                 "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Conditioners",
                 ("sulfate free", "silicone free", "natural ingredients", "for curly hair",
                  "vegan formula", "cruelty free"),
                 (("size", ("8 fl oz", "12 fl oz", "16.9 fl oz")),
                  ("scent", ("argan oil", "coconut", "unscented"))), (6.0, 34.0)),
    _ProductType("Men's Running Shoes", "men's running shoes",
                 "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
                 ("non slip", "rubber sole", "lightweight", "breathable mesh", "arch support",
                  "memory foam"),
                 (("color", _COLORS), ("size", ("7", "8", "9", "10", "11", "12"))), (25.0, 140.0)),
    _ProductType("Women's Walking Sneakers", "women's sneakers",
                 "Clothing, Shoes & Jewelry › Women › Shoes › Fashion Sneakers",
                 ("non slip", "rubber sole", "slip on", "breathable mesh", "arch support"),
                 (("color", _COLORS), ("size", ("6", "6.5", "7", "7.5", "8", "9"))), (20.0, 120.0)),
    _ProductType("Ceramic Coffee Mug", "coffee mug",
                 "Home & Kitchen › Kitchen & Dining › Dining & Entertaining › Cups, Mugs & Saucers",
                 ("dishwasher safe", "microwave safe", "lead free", "easy clean", "heat resistant"),
                 (("color", _COLORS), ("size", ("11 oz", "15 oz", "20 oz"))), (8.0, 36.0)),
    _ProductType("Insulated Water Bottle", "water bottle",
                 "Sports & Outdoors › Outdoor Recreation › Camping & Hiking › Hydration",
                 ("bpa free", "leak proof", "double wall", "stainless steel", "wide mouth"),
                 (("color", _COLORS), ("size", ("18 oz", "24 oz", "32 oz", "40 oz"))), (10.0, 48.0)),
    _ProductType("Phone Case", "phone case",
                 "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
                 ("shockproof", "wireless charging", "slim fit", "scratch resistant", "easy install"),
                 (("color", _COLORS), ("style", ("iphone 13", "iphone 14", "galaxy s22"))),
                 (7.0, 30.0)),
    _ProductType("Clip in Hair Extensions", "hair extensions",
                 "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories",
                 ("natural looking", "heat resistant", "easy apply", "high quality", "thick hair"),
                 (("color", ("natural black", "dark brown", "blonde", "auburn")),
                  ("size", ("16 inch", "18 inch", "22 inch"))), (15.0, 90.0)),
    _ProductType("Orthopedic Dog Bed", "dog bed",
                 "Pet Supplies › Dogs › Beds & Furniture › Beds",
                 ("machine washable", "non slip", "orthopedic foam", "waterproof lining",
                  "removable cover"),
                 (("size", ("small", "medium", "large", "x-large")), ("color", _COLORS)),
                 (20.0, 110.0)),
    _ProductType("Mixed Nuts Snack", "mixed nuts",
                 "Grocery & Gourmet Food › Snacks & Sweets › Nuts & Seeds",
                 ("gluten free", "low sodium", "non gmo", "high protein", "keto friendly"),
                 (("flavor name", ("honey roasted", "sea salt", "unsalted", "smoked")),
                  ("size", ("8 ounce (pack of 1)", "16 ounce (pack of 2)", "24 ounce (pack of 3)"))),
                 (5.0, 40.0)),
    _ProductType("Women's Cotton T-Shirt", "women's t-shirt",
                 "Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses › T-Shirts",
                 ("machine wash", "short sleeve", "relaxed fit", "cotton spandex", "crew neck"),
                 (("color", _COLORS), ("size", ("small", "medium", "large", "x-large"))),
                 (8.0, 35.0)),
    _ProductType("LED Desk Lamp", "desk lamp",
                 "Tools & Home Improvement › Lighting & Ceiling Fans › Lamps & Shades › Desk Lamps",
                 ("usb port", "dimmable", "eye caring", "energy saving", "touch control"),
                 (("color", ("black", "white", "silver")),), (15.0, 70.0)),
)

_BRANDS = ("Acme", "Northwind", "Bluepeak", "Evergreen", "Sunridge", "Kestrel", "Orchard",
           "Lumen", "Harbor", "Tallow", "Meridian", "Cobalt", "Willow", "Granite", "Juniper")
_OPENERS = ("i am looking for", "i need", "find me", "i want to buy", "i would like")


def _synthetic_asin(rng: random.Random, used: set[str]) -> str:
  while True:
    asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
    if asin not in used:
      used.add(asin)
      return asin


def generate_catalogue(num_products: int = 200, seed: int = 0, goals_per_product: int = 1) -> Catalogue:
  """A synthetic shop of `num_products` products and `goals_per_product` goals each.

  Each product draws a type, a brand, 3-4 attributes of its type, 2 or more values of each of
  the type's options and a price; each goal names 1-3 of its product's attributes, one value
  of each option and a price limit above the product's price, in WebShop's instruction form:
  "i need shampoo that is sulfate free and long lasting with scent: citrus, and size: 12 fl oz,
  and price lower than 30.00 dollars". The same arguments give the same catalogue in any process.
  """
  if not isinstance(num_products, int) or num_products < 1:
    raise ValueError(f"num_products must be a positive integer, got {num_products!r}")
  if not isinstance(goals_per_product, int) or goals_per_product < 1:
    raise ValueError(f"goals_per_product must be a positive integer, got {goals_per_product!r}")
  rng = random.Random(f"bpo_jax.webshop.synthetic/{seed}")
  used: set[str] = set()
  products: list[Product] = []
  goals: list[WebShopTask] = []
  for _ in range(num_products):
    kind = rng.choice(_PRODUCT_TYPES)
    brand = rng.choice(_BRANDS)
    attrs = tuple(rng.sample(kind.attributes, rng.randint(3, min(4, len(kind.attributes)))))
    options = []
    for name, values in kind.options:
      k = rng.randint(2, len(values))
      keep = set(rng.sample(range(len(values)), k))
      options.append((name, tuple(v for i, v in enumerate(values) if i in keep)))
    price = round(rng.uniform(*kind.price_range), 2)
    title = f"{brand} {kind.title}, {attrs[0].title()}"
    description = (f"The {brand} {kind.title.lower()} is {', '.join(attrs[:-1])} and {attrs[-1]}. "
                   f"Every order ships from {brand}'s own warehouse.")
    product = Product(
        asin=_synthetic_asin(rng, used), title=title, category=kind.product_category.split(" › ")[0],
        query=kind.query, product_category=kind.product_category, description=description,
        bullet_points=tuple(a.capitalize() for a in attrs), attributes=attrs,
        options=tuple(options), price=price, price_tag=f"${price:.2f}")
    products.append(product)
    combos = list(itertools.product(*(values for _, values in options)))
    for combo in rng.sample(combos, min(goals_per_product, len(combos))):
      wanted = rng.sample(attrs, rng.randint(1, min(3, len(attrs))))
      upper = price_limit(price, rng)
      names = [name for name, _ in options]
      option_text = ", and ".join(f"{n}: {v}" for n, v in sorted(zip(names, combo)))
      wanted_text = " and ".join(wanted)
      text = (f"{rng.choice(_OPENERS)} {kind.query} that is {wanted_text} with {option_text}"
              f"{price_text(upper)}")
      goals.append(WebShopTask(
          task_id="", catalogue="", asin=product.asin, instruction=text,
          attributes=tuple(wanted), goal_options=tuple(combo), price_upper=upper,
          query=product.query, name=product.title, product_category=product.product_category,
          category=product.category))
  return make_catalogue(products, goals)
