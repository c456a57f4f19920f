"""The WebShop purchase reward (Yao et al., 2022, "WebShop: Towards Scalable Real-World Web
Interaction with Grounded Language Agents", §3 and the appendix on reward details).

A purchase of product `y` with chosen options `Y_opt` against an instruction `u` (target
attributes `U_att`, target options `U_opt`, price limit `u_price`) earns

    r = r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[y_price <= u_price])
               / (|U_att| + |U_opt| + 1)

where the intersections are fuzzy text matches and `r_type` in {0, 0.1, 0.5, 1} penalises buying
the wrong kind of product. The thresholds below follow the reference implementation released
with the paper (github.com/princeton-nlp/WebShop, `web_agent_site/engine/goal.py`):

* r_type: `query_match` (same search query that produced the product in the crawl),
  `category_match` (at least two shared levels of the `›`-separated category path) and
  `title_score` = |nouns(bought title) ∩ nouns(target title)| / |nouns(target title)|
  (0.2 when the target title has no nouns). Then r_type = 1, lowered to 0.5 when none of
  query_match, category_match, title_score > 0.2 holds, to 0.1 when title_score < 0.1 and
  to 0 when title_score == 0.
* attributes: a target attribute counts when `token_set_ratio` (fuzzywuzzy semantics:
  lower-cased, punctuation stripped) with one of the product's attributes exceeds 85, or when it
  occurs verbatim in the lower-cased title, bullet points or description.
* options: colours are first normalised to a base colour name; an option named `size` must match
  exactly, any other option by `token_set_ratio > 85`.
* price: 1 if the paid price is at most the limit.

Two documented differences from the reference code:
* The reference tags nouns with spaCy's `en_core_web_lg` model, a download. The default
  `title_nouns` here keeps the lower-cased alphabetic words of the title that are not function
  words, units or numbers, so adjectives count as nouns too; pass `nouns_fn=` (for example a
  spaCy tagger) to reproduce the reference exactly.
* The reference counts *chosen* options that match any target option, plus chosen options whose
  value appears in the product text, which can exceed |U_opt|. Here the count is the paper's
  intersection: the target options hit by some chosen option, so 0 <= r <= 1 always holds.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable, Mapping, Sequence

from rapidfuzz import fuzz
from rapidfuzz import utils as fuzz_utils

# A fuzzy match needs a token-set similarity strictly above this (reference value).
FUZZY_MATCH_THRESHOLD = 85.0
# Options whose value must match exactly rather than fuzzily (reference value).
EXACT_MATCH_OPTIONS = ("size",)
# Separator of the levels of a product's category path.
CATEGORY_SEPARATOR = "›"

# Base colour names that `normalize_color` reduces a colour option to. Multi-word names come
# first so that "navy blue" stays "navy blue" rather than becoming "blue".
BASE_COLORS = (
    "navy blue", "light blue", "dark blue", "sky blue", "royal blue", "dark green",
    "light green", "olive green", "army green", "hot pink", "light pink", "rose gold",
    "dark brown", "light brown", "dark grey", "light grey", "dark gray", "light gray",
    "off white", "natural black", "jet black", "wine red", "burgundy", "multicolor",
    "black", "white", "red", "blue", "green", "yellow", "orange", "purple", "pink", "brown",
    "grey", "gray", "beige", "khaki", "ivory", "silver", "gold", "navy", "teal", "turquoise",
    "coral", "maroon", "violet", "lavender", "tan", "cream", "charcoal", "clear",
)

# Words that the default noun extractor drops: function words, measurement units and
# connectives that titles are full of but that say nothing about the product's type.
_NON_NOUNS = frozenset("""
a an the and or of for with without in on at to by from into onto over under per plus via vs
is are be as it its this that these those your my our their his her you we they he she them
not no all any each every both some more most less few many much very so too than then
new pack pcs pc piece pieces set count ct oz fl ml l lb lbs g kg mm cm m inch inches in ft
x xl xxl s m l size sizes one two three four five six seven eight nine ten
""".split())


def normalize_color(value: str) -> str:
  """Reduces a colour option to the first base colour it contains; other values pass through.

  Example: `normalize_color("navy blue | white") == "navy blue"`,
  `normalize_color("12 fl oz") == "12 fl oz"`.
  """
  for color in BASE_COLORS:
    if color in value:
      return color
  return value


def title_nouns(title: str) -> list[str]:
  """The default type words of a title: lower-cased alphabetic words minus function words.

  Stands in for the reference's spaCy noun tagging (see the module docstring).
  Example: `title_nouns("Acme Shampoo for Dry Hair, 12 oz") == ["acme", "shampoo", "dry", "hair"]`.
  """
  words = re.findall(r"[a-z][a-z']*", title.lower())
  return [w for w in words if w not in _NON_NOUNS and len(w) > 1]


def token_set_ratio(a: str, b: str) -> float:
  """fuzzywuzzy's `token_set_ratio` with its default processing (lower case, no punctuation)."""
  return fuzz.token_set_ratio(a, b, processor=fuzz_utils.default_process)


@dataclasses.dataclass(frozen=True)
class TypeMatch:
  """The parts of the type reward: the reward and the three signals it is made from."""

  r_type: float
  query_match: bool
  category_match: bool
  title_score: float


def type_reward(
    bought_query: str,
    bought_category: str,
    bought_title: str,
    target_query: str,
    target_category: str,
    target_title: str,
    nouns_fn: Callable[[str], Sequence[str]] = title_nouns,
) -> TypeMatch:
  """r_type of buying a product of (query, category path, title) for a target product.

  Example: same query, title nouns {"acme", "shampoo"} against target {"acme", "shampoo",
  "bottle"}: title_score = 2/3, r_type = 1. Different query and category with one shared noun
  out of six target nouns: title_score = 1/6 <= 0.2, so r_type = 0.5.
  """
  query_match = bought_query.strip().lower() == target_query.strip().lower()
  bought_levels = {x.strip() for x in bought_category.split(CATEGORY_SEPARATOR)}
  target_levels = {x.strip() for x in target_category.split(CATEGORY_SEPARATOR)}
  category_match = len((bought_levels & target_levels) - {""}) >= 2
  bought_nouns = {w.lower() for w in nouns_fn(bought_title)}
  target_nouns = [w.lower() for w in nouns_fn(target_title)]
  if not target_nouns:
    title_score = 0.2
  else:
    # The reference divides by the noun count with repeats, and intersects as sets.
    title_score = len(bought_nouns & set(target_nouns)) / len(target_nouns)
  r_type = 1.0
  if not (query_match or category_match or title_score > 0.2):
    r_type = 0.5
  if title_score < 0.1:
    r_type = 0.1
  if title_score == 0.0:
    r_type = 0.0
  return TypeMatch(r_type, query_match, category_match, title_score)


def attribute_matches(
    target_attributes: Iterable[str],
    product_attributes: Sequence[str],
    product_text: str,
) -> int:
  """|U_att ∩ Y_att|: target attributes found among the product's attributes or in its text.

  `product_text` is the product's title, bullet points and description; it is lower-cased here.
  Example: target ("sulfate free", "long lasting") against attributes ("sulfate free",) and a
  description without "long lasting" gives 1.
  """
  text = product_text.lower()
  count = 0
  for wanted in target_attributes:
    if any(token_set_ratio(have, wanted) > FUZZY_MATCH_THRESHOLD for have in product_attributes):
      count += 1
    elif wanted.lower() in text:
      count += 1
  return count


def option_matches(target_options: Iterable[str], chosen_options: Mapping[str, str]) -> int:
  """|U_opt ∩ Y_opt|: target option values hit by some chosen option (name -> value).

  Colours are normalised first; a chosen `size` must equal the target value exactly.
  Example: target ("navy blue", "large") against {"color": "navy blue | white",
  "size": "x-large"} gives 1 (the colour; "x-large" is not exactly "large").
  """
  chosen = [(name.lower(), normalize_color(value.lower())) for name, value in chosen_options.items()]
  count = 0
  for wanted in target_options:
    wanted = normalize_color(wanted.lower())
    for name, value in chosen:
      if name in EXACT_MATCH_OPTIONS:
        hit = value == wanted
      else:
        hit = token_set_ratio(wanted, value) > FUZZY_MATCH_THRESHOLD
      if hit:
        count += 1
        break
  return count


@dataclasses.dataclass(frozen=True)
class PurchaseReward:
  """The reward of one purchase and its parts (all plain numbers, for logging)."""

  reward: float
  r_type: float
  attribute_hits: int
  num_attributes: int
  option_hits: int
  num_options: int
  price_ok: bool
  query_match: bool
  category_match: bool
  title_score: float


def purchase_reward(
    *,
    bought_query: str,
    bought_category: str,
    bought_title: str,
    bought_attributes: Sequence[str],
    bought_text: str,
    bought_price: float,
    chosen_options: Mapping[str, str],
    target_query: str,
    target_category: str,
    target_title: str,
    target_attributes: Sequence[str],
    target_options: Sequence[str],
    price_upper: float,
    nouns_fn: Callable[[str], Sequence[str]] = title_nouns,
) -> PurchaseReward:
  """The WebShop reward r of the module docstring.

  Example: 2 target attributes (1 hit), 2 target options (2 hit), price within the limit and
  r_type = 1 give r = (1 + 2 + 1) / (2 + 2 + 1) = 0.8.
  """
  if not price_upper > 0:
    raise ValueError(f"price_upper must be positive, got {price_upper!r}")
  kind = type_reward(bought_query, bought_category, bought_title, target_query,
                     target_category, target_title, nouns_fn)
  att_hits = attribute_matches(target_attributes, bought_attributes, bought_text)
  opt_hits = option_matches(target_options, chosen_options)
  price_ok = bought_price <= price_upper
  total = (att_hits + opt_hits + int(price_ok)) / (len(target_attributes) + len(target_options) + 1)
  return PurchaseReward(
      reward=kind.r_type * total,
      r_type=kind.r_type,
      attribute_hits=att_hits,
      num_attributes=len(target_attributes),
      option_hits=opt_hits,
      num_options=len(target_options),
      price_ok=bool(price_ok),
      query_match=kind.query_match,
      category_match=kind.category_match,
      title_score=kind.title_score,
  )
