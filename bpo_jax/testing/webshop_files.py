"""Generated data in the format of WebShop's released files, for tests and benchmarks.

`write_released_files(directory, num_products, seed)` writes `items_shuffle.json`,
`items_ins_v2.json` and `items_human_ins.json` with the release's fields (see
`bpo_jax/sandboxes/webshop/released.py`), one record at a time, and returns what it wrote in a
`WrittenFiles`. Titles, descriptions and bullet points draw words from a pool of made-up words
(a few thousand, as the release has a large vocabulary); every product has a brand, two
options, a price ("$a" or a range "$a - $b"; every 50th none) and 1-4 human instructions, every
7th of which names no attribute (the loader skips those). The file also holds the records the
release drops: an asin "nan", an asin longer than 10 characters and a repeated asin.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random

_SYLLABLES = ("ka", "lo", "mi", "ra", "tu", "ne", "so", "vi", "de", "po", "shi", "gra", "bel",
              "tor", "quin", "zar", "mel", "dor", "fen", "lux")
_QUERIES = ("shampoo", "running shoes", "coffee mug", "desk lamp", "phone case", "dog bed",
            "water bottle", "t-shirt")
_ATTRIBUTES = ("sulfate free", "long lasting", "non slip", "dishwasher safe", "easy clean",
               "high quality", "machine wash", "bpa free", "wireless charging", "gluten free")
_COLORS = ("Navy Blue", "Black/White", "Red", "Light Grey", "Beige", "Dark Green")
_SIZES = ("Small", "Medium", "Large", "X-Large", "12 oz", "16.9 Fl Oz (Pack of 2)")


@dataclasses.dataclass
class WrittenFiles:
  """Paths written and the records kept by the release's rules (for checks)."""

  products_path: str
  attributes_path: str
  human_instructions_path: str
  kept_asins: list[str]
  # (asin, instruction) of every human instruction with at least one attribute, in goal order.
  goals: list[tuple[str, str]]


def _words(count: int, rng: random.Random) -> list[str]:
  words: set[str] = set()
  while len(words) < count:
    words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
  return sorted(words)


def _product(i: int, asin: str, words: list[str], rng: random.Random) -> dict:
  query = rng.choice(_QUERIES)
  text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
  if i % 50 == 49:
    pricing = ""
  elif rng.random() < 0.3:
    lo = round(rng.uniform(5, 80), 2)
    pricing = f"${lo} - ${round(lo + rng.uniform(1, 40), 2)}"
  else:
    pricing = f"${round(rng.uniform(3, 120), 2)}"
  return {
      "asin": asin, "name": f"{text(1).title()} {query.title()} {text(rng.randint(2, 6))}",
      "full_description": text(rng.randint(10, 40)),
      "small_description": [text(rng.randint(3, 8)) for _ in range(rng.randint(1, 4))],
      "pricing": pricing, "category": query.split()[-1], "query": f" {query.upper()} ",
      "product_category": f"Shop › {query.title()} › {text(1).title()}",
      "customization_options": {
          "Color": [{"value": c, "image": None} for c in rng.sample(_COLORS, 3)],
          "Size": [{"value": s, "image": None} for s in rng.sample(_SIZES, 2)]},
      "images": [f"https://example.com/{asin}.jpg"], "brand": text(1),
  }


def _instructions(asin: str, product: dict, rng: random.Random, counter: list[int]) -> list[dict]:
  out = []
  for _ in range(rng.randint(1, 4)):
    counter[0] += 1
    attrs = [] if counter[0] % 7 == 0 else rng.sample(_ATTRIBUTES, rng.randint(1, 2))
    color = rng.choice(product["customization_options"]["Color"])["value"].lower()
    out.append({"asin": asin, "instruction_attributes": attrs,
                "instruction_options": [color.replace("/", " | ")],
                "instruction": f"i want a {' and '.join(attrs) or 'nice'} "
                               f"{product['query'].strip().lower()} in {color}."})
  return out


def write_released_files(directory: str | os.PathLike[str], num_products: int,
                         seed: int = 0) -> WrittenFiles:
  """Writes the three files into `directory`; the same arguments give the same bytes."""
  rng = random.Random(f"bpo_jax.testing.webshop_files/{seed}")
  words = _words(3000, rng)
  paths = [os.path.join(directory, n) for n in
           ("items_shuffle.json", "items_ins_v2.json", "items_human_ins.json")]
  kept: list[str] = []
  kept_set: set[str] = set()
  goals: list[tuple[str, str]] = []
  counter = [0]
  with open(paths[0], "w", encoding="utf-8") as fp, open(paths[1], "w", encoding="utf-8") as fa, \
      open(paths[2], "w", encoding="utf-8") as fh:
    for f, opening in ((fp, "["), (fa, "{"), (fh, "{")):
      f.write(opening)
    for i in range(num_products):
      asin = {3: "nan", 5: "B0TOOLONG0123"}.get(i, f"B{i:09d}")
      if i == 8:
        asin = kept[-1]  # a repeated asin: the release keeps the first record
      product = _product(i, asin, words, rng)
      fp.write(("," if i else "") + json.dumps(product))
      if asin in kept_set or asin == "nan" or len(asin) > 10:
        continue
      sep = "," if kept else ""
      kept.append(asin)
      kept_set.add(asin)
      fa.write(sep + json.dumps(asin) + ":" + json.dumps({
          "attributes": rng.sample(_ATTRIBUTES, 3),
          "instruction": f"i need a {product['query'].strip().lower()}",
          "instruction_attributes": rng.sample(_ATTRIBUTES, 1)}))
      instructions = _instructions(asin, product, rng, counter)
      fh.write(sep + json.dumps(asin) + ":" + json.dumps(instructions))
      goals += [(asin, x["instruction"]) for x in instructions if x["instruction_attributes"]]
    for f, closing in ((fp, "]\n"), (fa, "}\n"), (fh, "}\n")):
      f.write(closing)
  return WrittenFiles(*paths, kept_asins=kept, goals=goals)
