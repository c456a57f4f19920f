"""Tests of the WebShop sandbox: the paper's reward by hand, BM25 against a NumPy reference,
WebShop's JSON files, pages and actions, and snapshot determinism across processes."""

import dataclasses
import json
import math
import os
import pickle
import random
import subprocess
import sys

import hypothesis
import numpy as np
import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import registry
from bpo_jax.sandboxes.pool import BranchFailure, SandboxPool
from bpo_jax.sandboxes.webshop import (
    Product, ProductIndex, WebShopSandbox, WebShopTask, attribute_matches, generate_catalogue,
    load_webshop_files, make_catalogue, make_sandbox, make_tasks, normalize_color,
    option_matches, split_goal_indices, title_nouns, type_reward)
from bpo_jax.sandboxes.webshop import search as search_lib
from bpo_jax.sandboxes.webshop import shop
from bpo_jax.testing.tolerance import assert_close

SHOP = {"num_products": 60, "catalogue_seed": 3}


# -------------------------------------------------------------------------------------------
# A hand-built shop: one target and products that differ from it in one way each.

SHAMPOO_CATEGORY = "Beauty › Hair Care › Shampoo"
TARGET_TITLE = "Acme Herbal Shampoo Bottle Refill Kit"  # nouns: acme herbal shampoo bottle refill kit


def _product(asin, **changes):
  fields = dict(
      asin=asin, title=TARGET_TITLE, category="Beauty", query="shampoo",
      product_category=SHAMPOO_CATEGORY, description="A gentle herbal shampoo.",
      bullet_points=("Gentle formula",), attributes=("sulfate free", "long lasting"),
      options=(("color", ("navy blue", "red")), ("size", ("small", "large"))),
      price=20.0, price_tag="$20.00")
  fields.update(changes)
  return Product(**fields)


HAND_PRODUCTS = (
    _product("B000TARGET"),
    _product("B00NOLASTS", attributes=("sulfate free",)),
    _product("B00PRICEY0", price=45.0, price_tag="$45.00"),
    _product("B00POUCH00", title="Acme Travel Pouch", query="pouch", category="Luggage",
             product_category="Luggage › Travel Accessories", description="",
             bullet_points=(), attributes=("long lasting",), options=(("color", ("red",)),),
             price=10.0, price_tag="$10.00"),
    _product("B00WALLET0", title="Leather Wallet", query="wallet", category="Accessories",
             product_category="Accessories › Wallets", description="", bullet_points=(),
             attributes=("sulfate free", "long lasting"), price=10.0, price_tag="$10.00"),
)
HAND_GOAL = WebShopTask(
    task_id="", catalogue="", asin="B000TARGET",
    instruction="i need a sulfate free and long lasting shampoo with color: navy blue, and "
                "size: large, and price lower than 30.00 dollars",
    attributes=("sulfate free", "long lasting"), goal_options=("navy blue", "large"),
    price_upper=30.0, query="shampoo", name=TARGET_TITLE, product_category=SHAMPOO_CATEGORY,
    category="Beauty")


@pytest.fixture(scope="module")
def hand_shop():
  catalogue = make_catalogue(HAND_PRODUCTS, [HAND_GOAL])
  return WebShopSandbox(catalogue, ProductIndex(catalogue.products)), catalogue.goals[0]


def _buy(sandbox, task, asin, options):
  """Searches for the product's title, opens it, clicks `options`, buys; returns the last Step."""
  sandbox.reset(task)
  step = sandbox.step(f"search[{sandbox.catalogue.by_asin[asin].title}]")
  while f"click[{asin}]" not in sandbox.admissible_actions():
    assert "click[Next >]" in sandbox.admissible_actions(), f"{asin} not found by its title"
    step = sandbox.step("click[Next >]")
  for action in [f"click[{asin}]"] + [f"click[{o}]" for o in options] + ["click[Buy Now]"]:
    step = sandbox.step(action)
    assert "invalid_action" not in step.info, (action, step.observation)
  return step


# Denominator: |U_att| + |U_opt| + 1 = 2 + 2 + 1 = 5.
@pytest.mark.parametrize("asin, options, expected, r_type", [
    ("B000TARGET", ("navy blue", "large"), 5 / 5, 1.0),           # the instruction's target
    ("B000TARGET", ("red", "large"), (2 + 1 + 1) / 5, 1.0),       # one option wrong
    ("B000TARGET", (), (2 + 0 + 1) / 5, 1.0),                     # no option chosen
    ("B00NOLASTS", ("navy blue", "large"), (1 + 2 + 1) / 5, 1.0), # one attribute missing
    ("B00PRICEY0", ("navy blue", "large"), (2 + 2 + 0) / 5, 1.0), # over the price limit
    # Other type: query and category differ, title nouns share 1 of 6 ("acme"): r_type 0.5;
    # it has "long lasting" (1 attribute), red hits no target option, price 10 <= 30.
    ("B00POUCH00", ("red",), 0.5 * (1 + 0 + 1) / 5, 0.5),
    # No title noun in common: r_type 0, whatever else matches.
    ("B00WALLET0", ("navy blue", "large"), 0.0, 0.0),
])
def test_purchase_reward_by_hand(hand_shop, asin, options, expected, r_type):
  sandbox, task = hand_shop
  step = _buy(sandbox, task, asin, options)
  assert step.done and not step.truncated
  assert step.reward == expected
  assert step.info["reward_parts"]["r_type"] == r_type
  assert step.info["success"] == (expected == 1.0)
  assert step.info["purchased_asin"] == asin


def test_type_reward_cases():
  # 11 target nouns; one shared gives title_score 1/11 < 0.1, so r_type = 0.1.
  long_title = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo"
  assert type_reward("q1", "A › B", "alpha zulu", "q2", "C › D", long_title).r_type == 0.1
  # 1 of 6 nouns (title_score 1/6 <= 0.2) with no query or category match: 0.5 ...
  six = "alpha bravo charlie delta echo foxtrot"
  m = type_reward("q1", "A › B › C", "alpha", "q2", "A › X › Y", six)
  assert (m.r_type, m.query_match, m.category_match, m.title_score) == (0.5, False, False, 1 / 6)
  # ... but 1.0 when two category levels are shared, or the query is the same.
  assert type_reward("q1", "A › B › C", "alpha", "q2", "A › B › Y", six).r_type == 1.0
  assert type_reward("q2", "A › B › C", "alpha", "q2", "A › X › Y", six).r_type == 1.0
  # 2 of 6 nouns: title_score 1/3 > 0.2 is a match by itself.
  assert type_reward("q1", "A", "alpha bravo", "q2", "X", six).r_type == 1.0
  # No nouns in the target title: title_score 0.2, r_type 1 only with another match.
  assert type_reward("q1", "A", "alpha", "q2", "X", "the and of").title_score == 0.2
  assert type_reward("q1", "A", "alpha", "q2", "X", "the and of").r_type == 0.5
  assert type_reward("q1", "A", "alpha", "q1", "X", "the and of").r_type == 1.0


def test_attribute_and_option_matching():
  # Fuzzy over the product's attributes (punctuation and case ignored), then verbatim in text.
  assert attribute_matches(["sulfate free"], ["Sulfate-Free"], "") == 1
  assert attribute_matches(["long lasting"], [], "Long lasting formula") == 1
  assert attribute_matches(["paraben free"], ["sulfate free"], "sulfate free shampoo") == 0
  assert attribute_matches(["sulfate free", "long lasting", "vegan"], ["sulfate free"],
                           "vegan and mild") == 2
  # Sizes match exactly; colours are normalised then fuzzy; each target counts at most once.
  assert option_matches(["navy blue", "large"], {"color": "navy blue | white", "size": "x-large"}) == 1
  assert option_matches(["navy blue", "large"], {"color": "Navy Blue", "size": "large"}) == 2
  assert option_matches(["honey roasted"], {"flavor name": "honey roasted peanuts"}) == 1
  assert option_matches(["red", "red"], {"color": "red"}) == 2
  assert option_matches([], {"color": "red"}) == 0
  assert normalize_color("dark green | black") == "dark green"
  assert normalize_color("16 inch") == "16 inch"
  assert title_nouns("Acme Shampoo for Dry Hair, 12 oz (Pack of 2)") == ["acme", "shampoo", "dry", "hair"]


def test_bm25_scores_match_numpy_reference():
  titles = ["kettle kettle copper", "copper lamp", "wooden lamp shade", "wooden wooden spoon",
            "copper lamp"]
  products = [_product(f"B{i:09d}", title=t, description="", bullet_points=(), options=())
              for i, t in enumerate(titles)]
  index = ProductIndex(products)
  docs = [t.split() for t in titles]
  avgdl = np.mean([len(d) for d in docs])
  k1, b = search_lib.BM25_K1, search_lib.BM25_B

  def reference(query):
    scores = np.zeros(len(docs))
    for word in query.split():
      df = sum(word in d for d in docs)
      if df == 0:
        continue
      idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
      for j, d in enumerate(docs):
        tf = d.count(word)
        scores[j] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
    return scores

  for query in ["copper", "lamp copper", "wooden spoon", "kettle", "teapot", "shade lamp"]:
    # float32 scores (bm25s): per query term the idf, the length norm and the tf fraction take
    # ≤ 8 roundings, the per-term scores one sum: ≤ 20 at the largest score.
    assert_close(index.scores(query), reference(query), steps=20)
  # Best first; equal scores (docs 1 and 4 are the same text) in catalogue order; zero omitted.
  assert index.search("copper lamp", 10) == [1, 4, 0, 2]
  assert index.search("copper lamp", 2) == [1, 4]
  assert index.search("teapot", 10) == []
  assert index.search("Copper, LAMP!", 10) == [1, 4, 0, 2]
  assert index.search("the coppers and lamps", 10) == [1, 4, 0, 2]  # stop words, stems
  assert search_lib.Analyzer()("The Running Shoes, for men") == ["run", "shoe", "men"]


# -------------------------------------------------------------------------------------------
# The synthetic shop.


def test_every_test_goal_target_earns_one():
  """Buying each goal's own target with the goal's option values earns exactly 1."""
  sandbox = make_sandbox(**SHOP)
  tasks = make_tasks("test", None, **SHOP) + make_tasks("train", 10, seed=1, **SHOP)
  assert len(tasks) == 16
  for task in tasks:
    values = {v for _, vs in sandbox.catalogue.by_asin[task.asin].options for v in vs}
    assert set(task.goal_options) <= values  # each goal option is a value the target offers
    step = _buy(sandbox, task, task.asin, task.goal_options)
    assert step.reward == 1.0 and step.info["success"], task.instruction
    assert step.info["reward_parts"]["attribute_hits"] == len(task.attributes)


def test_make_tasks_splits_ids_and_pickling():
  shop = dict(SHOP, goals_per_product=2)
  splits = {s: make_tasks(s, None, **shop) for s in ("train", "eval", "test")}
  ids = [t.task_id for s in splits.values() for t in s]
  assert len(ids) == len(set(ids)) == 120  # 60 products x 2 goals, split 12 / 12 / 96
  assert [len(splits[s]) for s in ("test", "eval", "train")] == [12, 12, 96]
  a = make_tasks("train", 5, seed=7, **shop)
  assert [t.task_id for t in a] == [t.task_id for t in make_tasks("train", 5, seed=7, **shop)]
  assert [t.task_id for t in a] != [t.task_id for t in make_tasks("train", 5, seed=8, **shop)]
  assert pickle.loads(pickle.dumps(a)) == a
  # The WebShop release's split sizes on its 12087 human goals.
  assert [len(split_goal_indices(12087, s)) for s in ("test", "eval", "train")] == [500, 1000, 10587]
  with pytest.raises(ValueError, match="unknown split"):
    make_tasks("validation", 1, **shop)
  with pytest.raises(ValueError, match="has 12 goals; 13 were asked"):
    make_tasks("test", 13, **shop)
  with pytest.raises(ValueError, match="unknown WebShop catalogue option"):
    make_sandbox(num_produts=10)
  with pytest.raises(ValueError, match="max_steps"):
    make_sandbox(max_steps=0, **SHOP)


def test_catalogue_is_a_function_of_its_seed():
  a, b, c = generate_catalogue(30, 5), generate_catalogue(30, 5), generate_catalogue(30, 6)
  assert a.fingerprint == b.fingerprint and a.products == b.products and a.goals == b.goals
  assert a.fingerprint != c.fingerprint


def test_pages_and_admissible_actions():
  sandbox = make_sandbox(**SHOP)
  task = make_tasks("test", 1, **SHOP)[0]
  obs = sandbox.reset(task)
  assert obs == f"WebShop [SEP] Instruction: [SEP] {task.instruction} [SEP] Search"
  assert sandbox.admissible_actions() == ["search[...]"]
  sandbox.step("search[black]")  # 24 results: pages of 10, 10 and 4
  actions = sandbox.admissible_actions()
  assert actions[:2] == ["click[Back to Search]", "click[Next >]"] and len(actions) == 12
  assert "Page 1 (Total results: " in sandbox.observation
  sandbox.step("click[next >]")  # case and spacing do not matter
  assert sandbox.admissible_actions()[:3] == ["click[Back to Search]", "click[< Prev]", "click[Next >]"]
  sandbox.step("click[Next >]")
  assert "Page 3 (Total results: 24)" in sandbox.observation
  assert sandbox.admissible_actions()[:2] == ["click[Back to Search]", "click[< Prev]"]
  assert len(sandbox.admissible_actions()) == 2 + 4
  # Every admissible action on every page is accepted.
  seen_pages = set()
  frontier = [sandbox.snapshot()]
  for depth in range(3):
    next_frontier = []
    for snap in frontier:
      sandbox.restore(snap)
      for action in sandbox.admissible_actions():
        sandbox.restore(snap)
        step = sandbox.step("search[black]" if action == "search[...]" else action)
        assert "invalid_action" not in step.info, (action, step.observation)
        seen_pages.add(sandbox._state.page)
        if not step.done and len(next_frontier) < 6:
          next_frontier.append(sandbox.snapshot())
    frontier = next_frontier
  assert {"search", "results", "item"} <= seen_pages


def test_sub_pages_and_navigation():
  sandbox = make_sandbox(**SHOP)
  task = make_tasks("test", 1, **SHOP)[0]
  product = sandbox.catalogue.by_asin[task.asin]
  sandbox.reset(task)
  sandbox.step(f"search[{product.title}]")
  while f"click[{task.asin}]" not in sandbox.admissible_actions():
    sandbox.step("click[Next >]")
  results_page = sandbox.observation
  item = sandbox.step(f"click[{task.asin}]").observation
  assert item.endswith(f"{product.title} [SEP] Price: {product.price_tag} [SEP] Rating: N.A. "
                       "[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
  value = product.options[0][1][1]
  sandbox.step(f"click[{value}]")
  assert f"Selected: {product.options[0][0]}: {value}" in sandbox.observation
  features = sandbox.step("click[Features]").observation
  assert features.endswith("Back to Search [SEP] < Prev [SEP] " + " [SEP] ".join(product.bullet_points))
  assert sandbox.step("click[< Prev]").observation.count("Selected:") == 1  # choice kept
  assert sandbox.step("click[< Prev]").observation == results_page  # same result page
  assert sandbox.step("click[Back to Search]").observation.endswith("[SEP] Search")


def test_invalid_actions_get_an_observation():
  sandbox = make_sandbox(max_steps=50, **SHOP)
  task = make_tasks("test", 1, **SHOP)[0]
  sandbox.reset(task)
  cases = [("", "empty"), ("   ", "empty"), ("x" * 5000, "limit"), (b"\xff\xfe", "UTF-8"),
           ("click[\x01]", "control character"), (42, "must be text"),
           ("buy the shoes", "cannot parse"), ("search[]", "keywords are empty"),
           ("click[Buy Now]", "search page has no buttons")]
  page = sandbox.observation
  for action, reason in cases:
    step = sandbox.step(action)
    assert reason in step.info["invalid_action"], (action, step.info)
    assert step.observation.startswith("Invalid action:") and "search[...]" in step.observation
    assert (step.reward, step.done) == (0.0, False)
    assert sandbox.observation == page
  sandbox.step("search[mug]")
  page = sandbox.observation
  for action, reason in [("search[mug]", "no search box"), ("click[B0NOTHERE1]", "not a button"),
                         ("click[< Prev]", "not a button")]:
    step = sandbox.step(action)
    assert reason in step.info["invalid_action"] and sandbox.observation == page
  asin = sandbox.admissible_actions()[-1][len("click["):-1]
  sandbox.step(f"click[{asin}]")
  sandbox.step("click[Buy Now]")
  after = sandbox.step("click[Buy Now]")
  assert after.done and after.info["invalid_action"] == "the episode is over"


def test_step_limit_truncates():
  sandbox = make_sandbox(max_steps=3, **SHOP)
  sandbox.reset(make_tasks("test", 1, **SHOP)[0])
  assert not sandbox.step("search[mug]").done
  assert not sandbox.step("click[nothing]").done
  last = sandbox.step("click[Back to Search]")
  assert (last.done, last.truncated, last.reward, last.info["success"]) == (True, True, 0.0, False)
  after = sandbox.step("search[mug]")
  assert after.done and after.info["invalid_action"] == "the episode is over"


# -------------------------------------------------------------------------------------------
# Snapshots: fork three actions, restore, replay; in this process and in a worker process.

FORKS = (("click[Buy Now]",), ("click[< Prev]", "click[Next >]"), ("OPTION", "click[Buy Now]"))


def _prefix(sandbox, task):
  sandbox.reset(task)
  sandbox.step("search[shampoo sulfate free]")
  sandbox.step(sandbox.admissible_actions()[2])  # the first product on the page
  return sandbox.snapshot()


def _fork_actions(sandbox):
  option = next(a for a in sandbox.admissible_actions()
                if a not in ("click[Back to Search]", "click[< Prev]"))
  return [tuple(option if a == "OPTION" else a for a in fork) for fork in FORKS]


def _play(sandbox, actions):
  return [(s.observation, s.reward, s.done, s.truncated, json.dumps(s.info, sort_keys=True))
          for s in (sandbox.step(a) for a in actions)]


def test_fork_restore_replay_is_byte_identical():
  sandbox = make_sandbox(**SHOP)
  task = make_tasks("test", 1, **SHOP)[0]
  snap = _prefix(sandbox, task)
  forks = _fork_actions(sandbox)
  first = []
  for actions in forks:
    sandbox.restore(snap)
    first.append(_play(sandbox, actions))
  assert len({repr(f) for f in first}) == 3  # three different outcomes
  assert first[0][0][2] and first[2][1][2]  # the buys end the episode
  for actions, expected in zip(forks, first):
    sandbox.restore(snap)
    assert sandbox.snapshot() == snap
    assert _play(sandbox, actions) == expected
    # From the bytes alone, into a new sandbox of the same shop.
    other = make_sandbox(**SHOP)
    other.restore(base.Snapshot(snap.data))
    assert other.snapshot().data == snap.data
    assert _play(other, actions) == expected
  # Snapshots are exact state keys: the same state gives the same bytes.
  sandbox.restore(snap)
  sandbox.step("click[Description]")
  sandbox.step("click[< Prev]")
  assert sandbox.snapshot().data != snap.data  # two more steps were taken
  assert len(snap) < 2048


def test_restore_in_worker_processes_is_byte_identical():
  sandbox = make_sandbox(**SHOP)
  task = make_tasks("test", 1, **SHOP)[0]
  snap = _prefix(sandbox, task)
  forks = _fork_actions(sandbox)
  expected = []
  for actions in forks:
    sandbox.restore(snap)
    expected.append(_play(sandbox, actions))
  assert "webshop" in registry.environment_names()
  with SandboxPool.for_environment("webshop", num_workers=2, timeout_s=60.0, **SHOP) as pool:
    restored = pool.restore_many({i: pickle.loads(pickle.dumps(snap)) for i in range(3)})
    assert not any(isinstance(r, BranchFailure) for r in restored.values()), restored
    got = [[] for _ in forks]
    for k in range(max(len(f) for f in forks)):
      steps = pool.step_many({i: f[k] for i, f in enumerate(forks) if k < len(f)})
      for i, s in steps.items():
        assert not isinstance(s, BranchFailure), s
        got[i].append((s.observation, s.reward, s.done, s.truncated,
                       json.dumps(s.info, sort_keys=True)))
  assert got == expected


_CHILD = """
import pickle, sys
from bpo_jax.sandboxes.webshop import make_sandbox
configs, snapshot, forks = pickle.load(sys.stdin.buffer)
results = []
for config in configs:
  sandbox = make_sandbox(**config)
  try:
    out = []
    for actions in forks:
      sandbox.restore(snapshot)
      out.append([(s.observation, s.reward, s.done, s.truncated, s.info)
                  for s in map(sandbox.step, actions)])
  except ValueError as e:
    out = str(e)
  results.append(out)
from jax._src import xla_bridge
pickle.dump((results, xla_bridge.backends_are_initialized()), sys.stdout.buffer)
"""


@pytest.mark.slow
def test_restore_in_a_fresh_interpreter():
  """A process that builds the shop from the same seed replays exactly; another seed is refused."""
  sandbox = make_sandbox(**SHOP)
  snap = _prefix(sandbox, make_tasks("test", 1, **SHOP)[0])
  forks = _fork_actions(sandbox)
  expected = []
  for actions in forks:
    sandbox.restore(snap)
    expected.append([(s.observation, s.reward, s.done, s.truncated, s.info)
                     for s in map(sandbox.step, actions)])
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
  configs = [SHOP, dict(SHOP, catalogue_seed=4)]
  child = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps((configs, snap, forks)),
                         capture_output=True, env=env, timeout=120, check=True)
  (same, other), backend_started = pickle.loads(child.stdout)
  assert same == expected
  assert isinstance(other, str) and "same generator seed" in other
  # The shop never starts a JAX backend in its worker processes (bm25s would, at import).
  assert backend_started is False


def test_restore_into_another_shop_fails_clearly():
  sandbox = make_sandbox(**SHOP)
  snap = _prefix(sandbox, make_tasks("test", 1, **SHOP)[0])
  other = make_sandbox(num_products=60, catalogue_seed=4)
  with pytest.raises(ValueError, match="catalogue .* same WebShop files or the same generator seed"):
    other.restore(base.Snapshot(snap.data))
  with pytest.raises(ValueError, match="belongs to the shop with catalogue"):
    other.reset(make_tasks("test", 1, **SHOP)[0])
  with pytest.raises(ValueError, match="not a WebShop snapshot"):
    other.restore(base.Snapshot(b"\x00garbage"))
  with pytest.raises(RuntimeError, match="call reset"):
    make_sandbox(**SHOP).step("search[x]")


# -------------------------------------------------------------------------------------------
# WebShop's own JSON files.


def _write_webshop_files(tmp_path):
  products = [
      {"asin": "B0TEST0001", "name": "Acme Herbal Shampoo", "full_description": "Mild and long lasting.",
       "small_description": ["Sulfate free formula"], "pricing": "$12.99",
       "customization_options": {"Color": [{"value": "Navy Blue/White", "image": None},
                                           {"value": "Red", "image": None}],
                                 "Size": [{"value": "Large"}, {"value": "Small"}]},
       "category": "beauty", "query": "Shampoo ", "product_category": SHAMPOO_CATEGORY,
       "images": []},
      {"asin": "B0TEST0002", "name": "Bluepeak Copper Kettle", "full_description": "",
       "small_description": "Boils fast", "pricing": "$10.00 - $20.00",
       "customization_options": None, "category": "home", "query": "kettle",
       "product_category": "Home › Kitchen › Kettles", "images": []},
      {"asin": "nan", "name": "dropped", "category": "x", "query": "x", "product_category": "x"},
      {"asin": "B0TEST0001", "name": "duplicate", "category": "x", "query": "x",
       "product_category": "x"},
  ]
  attributes = {"B0TEST0001": {"attributes": ["sulfate free", "long lasting"],
                               "instruction": "i need a sulfate free shampoo",
                               "instruction_attributes": ["sulfate free"]},
                "B0TEST0002": {"attributes": ["fast boiling"]}}
  human = {"B0TEST0001": [
      {"instruction": "i want a long lasting shampoo in navy blue, large.",
       "instruction_attributes": ["long lasting"],
       "instruction_options": ["navy blue | white", "large"]},
      {"instruction": "no attributes here", "instruction_attributes": [],
       "instruction_options": []}]}
  paths = {}
  for name, data in (("products", products), ("attributes", attributes), ("human", human)):
    paths[name] = tmp_path / f"{name}.json"
    paths[name].write_text(json.dumps(data), encoding="utf-8")
  return paths


def test_webshop_files_load_and_play(tmp_path):
  paths = _write_webshop_files(tmp_path)
  config = dict(products_path=str(paths["products"]), attributes_path=str(paths["attributes"]),
                human_instructions_path=str(paths["human"]),
                index_cache_dir=str(tmp_path / "index"))
  cat = load_webshop_files(paths["products"], paths["attributes"], paths["human"])
  assert [p.asin for p in cat.products] == ["B0TEST0001", "B0TEST0002"]
  shampoo, kettle = cat.products
  assert shampoo.options == (("color", ("navy blue | white", "red")), ("size", ("large", "small")))
  assert (shampoo.query, shampoo.price, shampoo.price_tag) == ("shampoo", 12.99, "$12.99")
  assert shampoo.attributes == ("sulfate free", "long lasting")
  assert kettle.bullet_points == ("Boils fast",) and kettle.price_tag == "$10.0 to $20.0"
  assert 10.0 <= kettle.price <= 20.0 and kettle.price == random.Random(0).uniform(10.0, 20.0)
  (goal,) = cat.goals  # the instruction without attributes is skipped
  # Limits above $12.99: 20, 30, 40, 50; the larger of two sampled is 30, 40 or 50.
  assert goal.price_upper in (30.0, 40.0, 50.0)
  assert goal.instruction == ("i want a long lasting shampoo in navy blue, large"
                              f", and price lower than {goal.price_upper:.2f} dollars")
  assert goal.goal_options == ("navy blue | white", "large")
  sandbox = make_sandbox(**config)
  (task,) = make_tasks("test", None, **config)  # the release's splits: the first 500 test
  assert task == goal
  step = _buy(sandbox, task, "B0TEST0001", ["navy blue | white", "large"])
  assert step.reward == 1.0 and step.info["success"]
  step = _buy(sandbox, task, "B0TEST0001", ["red", "small"])
  assert step.reward == (1 + 0 + 1) / 4

  synthetic = load_webshop_files(paths["products"], paths["attributes"], human_goals=False)
  assert [g.instruction.split(", and price")[0] for g in synthetic.goals] == [
      f"i need a sulfate free shampoo with color: {c}, and size: {s}"
      for c in ("navy blue | white", "red") for s in ("large", "small")]


def test_webshop_files_bad_input(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps([{"asin": "B0X", "category": "c", "query": "q",
                              "product_category": "p"}]), encoding="utf-8")
  with pytest.raises(base.TaskInputError,
                     match="bad.json', product 0 \\(asin 'B0X'\\): has no 'name' field$"):
    load_webshop_files(bad, human_goals=False, attributes_path=bad)
  with pytest.raises(base.TaskInputError, match="products file .*missing.json': No such file"):
    load_webshop_files(tmp_path / "missing.json", human_instructions_path=bad)
  with pytest.raises(ValueError, match="needs human_instructions_path"):
    load_webshop_files(bad)
  bad.write_text("{not json", encoding="utf-8")
  with pytest.raises(ValueError, match="not valid JSON"):
    load_webshop_files(bad, human_instructions_path=bad)


def test_random_purchases_follow_the_formula():
  """Any product with any options: 0 <= r <= 1 and r = r_type * hits / (|U_att| + |U_opt| + 1)."""
  sandbox = make_sandbox(**SHOP)
  rng = random.Random(0)
  rewards = []
  for task in make_tasks("train", 20, seed=2, **SHOP):
    same_kind = [p for p in sandbox.catalogue.products if p.query == task.query]
    product = rng.choice(same_kind if rng.random() < 0.8 else sandbox.catalogue.products)
    options = [rng.choice(values) for _, values in product.options if rng.random() < 0.7]
    step = _buy(sandbox, task, product.asin, options)
    parts = step.info["reward_parts"]
    hits = parts["attribute_hits"] + parts["option_hits"] + parts["price_ok"]
    assert parts["num_attributes"] == len(task.attributes)
    assert parts["num_options"] == len(task.goal_options)
    assert step.reward == parts["r_type"] * hits / (len(task.attributes) + len(task.goal_options) + 1)
    assert 0.0 <= step.reward <= 1.0
    assert step.info["success"] == (step.reward == 1.0)
    rewards.append(step.reward)
  assert len(set(rewards)) > 3  # the draws cover several reward levels


@pytest.mark.slow
@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(action=hypothesis.strategies.one_of(
    hypothesis.strategies.text(max_size=40),
    hypothesis.strategies.binary(max_size=40),
    hypothesis.strategies.builds(lambda v, a: f"{v}[{a}]",
                                 hypothesis.strategies.sampled_from(["click", "search", "CLICK", "buy"]),
                                 hypothesis.strategies.text(max_size=20))))
def test_arbitrary_actions_never_raise(action):
  sandbox = _ARBITRARY[0]
  sandbox.restore(_ARBITRARY[1])
  step = sandbox.step(action)
  assert isinstance(step.observation, str) and step.observation
  assert step.reward == 0.0 or step.done


def _arbitrary_setup():
  sandbox = make_sandbox(**SHOP)
  sandbox.reset(make_tasks("test", 1, **SHOP)[0])
  sandbox.step("search[black]")
  sandbox.step(sandbox.admissible_actions()[2])
  return sandbox, sandbox.snapshot()


_ARBITRARY = _arbitrary_setup()


def test_expert_actions_buy_the_target_from_any_state():
  sandbox = make_sandbox(max_steps=30, **SHOP)
  rng = random.Random(1)
  pages = set()
  for task in make_tasks("test", None, **SHOP) + make_tasks("train", 24, seed=5, **SHOP):
    sandbox.reset(task)
    # Wander first: a few admissible actions that do not buy.
    for _ in range(rng.randint(0, 5)):
      options = [a for a in sandbox.admissible_actions() if a != "click[Buy Now]"]
      action = rng.choice(options)
      sandbox.step("search[black mug]" if action == "search[...]" else action)
    pages.add(sandbox._state.page)
    expert = sandbox.expert_actions()
    assert expert[-1] == "click[Buy Now]"
    for action in expert:
      step = sandbox.step(action)
      assert "invalid_action" not in step.info, (action, step.observation)
    assert step.done and step.reward == 1.0, (task.instruction, expert)
    assert sandbox.expert_actions() is None
  assert pages >= {"search", "results", "item"}


def test_the_expert_searches_with_the_instruction_s_words():
  assert shop.instruction_query(
      "i need shampoo that is sulfate free and long lasting with scent: citrus, and size: 12 fl "
      "oz, and price lower than 30.00 dollars") == (
          "i need shampoo that is sulfate free and long lasting")
  assert shop.instruction_query("a mug, and price lower than 20.00 dollars") == "a mug"
  sandbox = make_sandbox(**SHOP)
  for task in make_tasks("test", None, **SHOP):
    sandbox.reset(task)
    expert = sandbox.expert_actions()
    # Every generated goal has a reward-1 product among its instruction's search results.
    assert expert[0] == f"search[{shop.instruction_query(task.instruction)}]"
