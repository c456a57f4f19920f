"""The shop's static data: products, instructions (goals) and a fingerprint that names them.

Two sources build the same types:

* `released.load_webshop_files` streams the JSON files released with WebShop (Yao et al.,
  2022); its goals split as the release's (`release_splits`) and its fingerprint is a digest
  of the files' bytes.
* `generate_catalogue` builds a synthetic catalogue with instructions for offline use: a few
  product types, each with a category path, a pool of attributes and option values, so that
  products of one type differ in attributes, options and price, and each instruction names
  attributes and options of its own target product.

The catalogue and its search index are read-only and shared by every snapshot of a shop; a
snapshot carries only the catalogue's fingerprint (for a synthetic catalogue a SHA-256 of its
canonical JSON, hashed record by record), so restoring needs a process that built the shop
from the same files or the same generator seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import random
from typing import Mapping, Sequence

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
  """Products and goals of one shop, with their fingerprint and an asin lookup.

  `release_splits`: the goals split as the WebShop release's (see `split_goal_indices`).
  `index_key`: names the products' search documents for the saved-index cache (None: the
  index is built in memory).
  """

  products: tuple[Product, ...]
  goals: tuple[WebShopTask, ...]
  fingerprint: str
  by_asin: Mapping[str, Product]
  release_splits: bool = False
  index_key: str | None = None

  def split_indices(self, split: str) -> list[int]:
    """Goal indices of a split: `test`, `eval` or `train` (see `split_goal_indices`)."""
    return split_goal_indices(len(self.goals), split, release=self.release_splits)


def split_goal_indices(num_goals: int, split: str, release: bool = False) -> list[int]:
  """Splits goals as the WebShop release does: shuffle with seed 233, then test, eval, train.

  `release=True`: the release's bounds, goals [0, 500) test, [500, 1500) eval, the rest train
  (cut at `num_goals`). Otherwise small catalogues take 10% each instead:
  n_test = min(500, n // 10), n_eval = min(1000, n // 10).
  Example: 100 goals give 10 test, 10 eval and 80 train indices (release: 100, 0, 0).
  """
  order = list(range(num_goals))
  random.Random(GOAL_SHUFFLE_SEED).shuffle(order)
  n_test = min(500, num_goals if release else num_goals // 10)
  n_eval = min(1000, num_goals - n_test if release else num_goals // 10)
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
  """SHA-256 of `{"goals": [...], "products": [...]}` (sorted keys, no spaces), fed to the hash
  one record at a time so that no string of the whole catalogue is ever built."""
  sha = hashlib.sha256()

  def records(key: str, items, first: bool) -> None:
    sha.update(("{" if first else "],").encode() + json.dumps(key).encode() + b":[")
    for i, item in enumerate(items):
      blob = json.dumps(dataclasses.asdict(item), sort_keys=True, separators=(",", ":"),
                        ensure_ascii=False)
      sha.update((b"," if i else b"") + blob.encode("utf-8"))

  records("goals", (dataclasses.replace(g, task_id="", catalogue="") for g in goals), True)
  records("products", products, False)
  sha.update(b"]}")
  return sha.hexdigest()


def make_catalogue(products: Sequence[Product], goals: Sequence[WebShopTask], *,
                   fingerprint: str | None = None, release_splits: bool = False,
                   index_key: str | None = None) -> Catalogue:
  """Seals products and goals: checks them, fingerprints them, and names each goal.

  Goals get `task_id = "webshop-<fingerprint[:12]>-<index>"` and the full fingerprint; the
  fingerprint is computed from the records unless given (the file loader names its files).
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
  if fingerprint is None:
    fingerprint = _fingerprint(products, goals)
  named = tuple(
      dataclasses.replace(g, task_id=f"webshop-{fingerprint[:12]}-{i:06d}", catalogue=fingerprint)
      for i, g in enumerate(goals))
  return Catalogue(tuple(products), named, fingerprint, by_asin, release_splits, index_key)


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
