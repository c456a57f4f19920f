"""The WebShop sandbox: pages, the action grammar, snapshots, and the module entry points.

Pages and buttons follow WebShop's text mode (Yao et al., 2022), one page a state, its parts
joined by " [SEP] ":

    search    WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search
    results   ... [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP]
              <ASIN> [SEP] <title> [SEP] <price> [SEP] ...            (10 products a page)
    item      ... [SEP] Back to Search [SEP] < Prev [SEP] <option name> [SEP] <value> ... [SEP]
              <title> [SEP] Price: <price> [SEP] Rating: <rating> [SEP] Description [SEP]
              Features [SEP] Reviews [SEP] Buy Now
    description / features / reviews   ... [SEP] Back to Search [SEP] < Prev [SEP] <text>
    done      Thank you for shopping with us! [SEP] ... [SEP] Your score (min 0.0, max 1.0) [SEP] r

The item page also lists the options chosen so far ("Selected: size: large, color: red"), which
WebShop's HTML shows as checked radio buttons and its text mode drops.

Actions are `search[<keywords>]` (only where the search box is shown) and `click[<button>]`
with a button shown on the page (case and spacing are ignored). Clicking an option value selects
it for its option; `click[Buy Now]` ends the episode with the WebShop reward (see `reward.py`).
Every other step earns 0. After `max_steps` steps the episode ends unbought (reward 0,
`done` and `truncated` both set). Anything else gets an "Invalid action" observation naming the
problem, with `info["invalid_action"]`; it still counts as a step.

The shop has no randomness after its catalogue is built: search, pages and the reward are pure
functions of the session state (page, query, results, result page, product, chosen options,
step count), which is all a snapshot holds besides the task and the catalogue's fingerprint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import threading
from typing import Any, Callable, Mapping, Sequence

from bpo_jax.sandboxes.base import (Snapshot, Step, TaskInputError, check_action,
                                   invalid_action_step)
from bpo_jax.sandboxes.webshop import catalogue as catalogue_lib
from bpo_jax.sandboxes.webshop import index_cache
from bpo_jax.sandboxes.webshop import released as released_lib
from bpo_jax.sandboxes.webshop import reward as reward_lib
from bpo_jax.sandboxes.webshop.catalogue import Catalogue, Product, WebShopTask
from bpo_jax.sandboxes.webshop.search import ProductIndex

SEP = " [SEP] "
SNAPSHOT_FORMAT = "bpo_jax.webshop/1"
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
# Placeholder shown in `admissible_actions` for the free-text search action.
SEARCH_ACTION = "search[...]"

_ACTION_RE = re.compile(r"(search|click)\s*\[(.*)\]", re.IGNORECASE | re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ShopState:
  """The session state; with the task and the catalogue it determines everything shown."""

  page: str = "search"
  query: str = ""
  results: tuple[str, ...] = ()
  results_page: int = 1
  asin: str = ""
  options: tuple[tuple[str, str], ...] = ()
  steps: int = 0
  reward: float = 0.0


def _norm(text: str) -> str:
  return " ".join(text.lower().split())


class WebShopSandbox:
  """A WebShop session over a shared, read-only catalogue and search index.

  Example:
    sb = make_sandbox(num_products=100, catalogue_seed=0)
    task = make_tasks("test", 1, seed=0, num_products=100, catalogue_seed=0)[0]
    sb.reset(task); sb.step("search[shampoo sulfate free]"); sb.step("click[B0...]")
  """

  def __init__(
      self,
      catalogue: Catalogue,
      index: ProductIndex,
      *,
      max_steps: int = 15,
      results_per_page: int = 10,
      search_return_n: int = 50,
      nouns_fn: Callable[[str], Sequence[str]] = reward_lib.title_nouns,
  ):
    for name, value in (("max_steps", max_steps), ("results_per_page", results_per_page),
                        ("search_return_n", search_return_n)):
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    self.catalogue = catalogue
    self._index = index
    self.max_steps = max_steps
    self.results_per_page = results_per_page
    self.search_return_n = search_return_n
    self._nouns_fn = nouns_fn
    self._task: WebShopTask | None = None
    self._state: ShopState | None = None

  # -- the Sandbox protocol --------------------------------------------------------------------

  def reset(self, task: WebShopTask) -> str:
    if not isinstance(task, WebShopTask):
      raise TypeError(f"a WebShop task must be a WebShopTask, got {type(task).__name__}")
    if task.catalogue != self.catalogue.fingerprint:
      raise ValueError(
          f"task {task.task_id!r} belongs to the shop with catalogue {task.catalogue[:12]}, but "
          f"this sandbox serves catalogue {self.catalogue.fingerprint[:12]}; build the sandbox "
          "with the same files or generator seed as the tasks")
    if task.asin not in self.catalogue.by_asin:
      raise ValueError(f"task {task.task_id!r} targets asin {task.asin!r}, not in the catalogue")
    self._task = task
    self._state = ShopState()
    return self.observation

  def step(self, action: Any) -> Step:
    state, task = self._require_session()
    if state.page == "done" or state.steps >= self.max_steps:
      return Step(observation="Invalid action: the episode is over; reset the sandbox.",
                  reward=0.0, done=True, info={"invalid_action": "the episode is over"})
    text, reason = check_action(action)
    new_state = None
    if reason is None:
      new_state, reason = self._transition(state, text)
    if new_state is None:
      self._state = dataclasses.replace(state, steps=state.steps + 1)
      step = invalid_action_step(reason, "Valid actions: " + ", ".join(self.admissible_actions()))
      return self._maybe_truncate(step)
    new_state = dataclasses.replace(new_state, steps=state.steps + 1)
    self._state = new_state
    if new_state.page == "done":
      return Step(observation=self.observation, reward=new_state.reward, done=True,
                  info=self._purchase_info(new_state, task))
    return self._maybe_truncate(Step(observation=self.observation, reward=0.0, done=False))

  def snapshot(self) -> Snapshot:
    state, task = self._require_session()
    payload = {
        "format": SNAPSHOT_FORMAT,
        "catalogue": self.catalogue.fingerprint,
        "task": {f.name: getattr(task, f.name) for f in dataclasses.fields(task)},
        "state": {f.name: getattr(state, f.name) for f in dataclasses.fields(state)},
    }
    data = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Snapshot(data=data.encode("utf-8"),
                    handle=(self.catalogue.fingerprint, task, state))

  def restore(self, snapshot: Snapshot) -> None:
    if not isinstance(snapshot, Snapshot):
      raise TypeError(f"restore takes a Snapshot, got {type(snapshot).__name__}")
    handle = snapshot.handle
    if (isinstance(handle, tuple) and len(handle) == 3
        and handle[0] == self.catalogue.fingerprint and isinstance(handle[2], ShopState)):
      _, self._task, self._state = handle
      return
    try:
      payload = json.loads(snapshot.data.decode("utf-8"))
      fmt = payload["format"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
      raise ValueError("not a WebShop snapshot (the bytes are not a WebShop session)") from None
    if fmt != SNAPSHOT_FORMAT:
      raise ValueError(f"unsupported WebShop snapshot format {fmt!r}; expected {SNAPSHOT_FORMAT!r}")
    if payload["catalogue"] != self.catalogue.fingerprint:
      raise ValueError(
          f"the snapshot was taken in a shop with catalogue {payload['catalogue'][:12]}, but this "
          f"sandbox serves catalogue {self.catalogue.fingerprint[:12]}; build the sandbox from the "
          "same WebShop files or the same generator seed to restore it")
    try:
      task = WebShopTask(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in payload["task"].items()})
      state = payload["state"]
      state = ShopState(
          page=state["page"], query=state["query"], results=tuple(state["results"]),
          results_page=state["results_page"], asin=state["asin"],
          options=tuple((k, v) for k, v in state["options"]), steps=state["steps"],
          reward=state["reward"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise ValueError(f"corrupt WebShop snapshot: {e!r}") from None
    if state.asin and state.asin not in self.catalogue.by_asin:
      raise ValueError(f"corrupt WebShop snapshot: unknown product {state.asin!r}")
    self._task, self._state = task, state

  def close(self) -> None:
    self._task = None
    self._state = None

  # -- what the page shows ---------------------------------------------------------------------

  @property
  def observation(self) -> str:
    """The current page as text."""
    state, task = self._require_session()
    return self._render(state, task)[0]

  def admissible_actions(self) -> list[str]:
    """`click[...]` for every button on the page, plus `search[...]` where a search box is shown."""
    state, task = self._require_session()
    _, buttons = self._render(state, task)
    actions = [f"click[{b}]" for b in buttons]
    if state.page == "search":
      actions.insert(0, SEARCH_ACTION)
    return actions

  def expert_actions(self) -> list[str] | None:
    """Actions that buy, from the current state, a product that earns the task reward 1.

    The expert searches as a shopper does, with the instruction's own words
    (`instruction_query`: the text before its options and price), and opens the first result
    that, bought with the option values closest to the goal's, earns reward 1; only when no
    result does it searches for the target's title and opens the target. It then clicks the
    goal options (the product's closest values) and buys. A policy can learn the first route
    from the page text alone; the title route needs the catalogue by heart. None once the
    episode is over. Following it from `reset` earns reward 1 on every generated goal.
    """
    state, task = self._require_session()
    if state.page == "done" or state.steps >= self.max_steps:
      return None
    actions: list[str] = []
    page = state.page
    if page in ("description", "features", "reviews"):
      actions.append(f"click[{PREV_PAGE}]")
      page = "item"
    if page == "item" and self._earns_full_reward(state.asin, task):
      product = self._product(state.asin)
    else:
      if page == "item":
        actions.append(f"click[{PREV_PAGE}]")
        page = "results"
      shown = state.results if page == "results" else ()
      route = self._expert_route(shown, task)
      if route is None:
        return None  # The target cannot be found by its title (a catalogue without text).
      query, results, asin = route
      results_page = state.results_page
      if query is not None:
        if page != "search":
          actions.append(f"click[{BACK_TO_SEARCH}]")
        actions.append(f"search[{query}]")
        results_page = 1
      target_page = results.index(asin) // self.results_per_page + 1
      turn = NEXT_PAGE if target_page > results_page else PREV_PAGE
      actions += [f"click[{turn}]"] * abs(target_page - results_page)
      actions.append(f"click[{asin}]")
      product, state = self._product(asin), dataclasses.replace(state, options=())
    chosen = dict(state.options)
    for wanted in task.goal_options:
      name, value = _closest_option(product, wanted)
      if name is not None and chosen.get(name) != value:
        actions.append(f"click[{value}]")
        chosen[name] = value
    actions.append(f"click[{BUY_NOW}]")
    return actions

  def _expert_route(self, shown: tuple[str, ...], task: WebShopTask
                    ) -> tuple[str | None, tuple[str, ...], str] | None:
    """(query to search or None to stay on the results `shown`, the results, the product to
    open): a shown result that earns reward 1, else one of the instruction's search, else the
    target in its title's search; None when not even that finds the target."""
    query = instruction_query(task.instruction)
    for searched, results in ((None, shown), (query, self._search(query))):
      good = next((a for a in results if self._earns_full_reward(a, task)), None)
      if good is not None:
        return searched, results, good
    title = self._product(task.asin).title
    results = self._search(title)
    return (title, results, task.asin) if task.asin in results else None

  def _search(self, query: str) -> tuple[str, ...]:
    """The asins a search for `query` lists, best first."""
    return tuple(self.catalogue.products[i].asin
                 for i in self._index.search(query, self.search_return_n))

  def _earns_full_reward(self, asin: str, task: WebShopTask) -> bool:
    """Whether buying `asin` with the option values closest to the goal's earns reward 1."""
    product = self._product(asin)
    chosen = {}
    for wanted in task.goal_options:
      name, value = _closest_option(product, wanted)
      if name is not None:
        chosen[name] = value
    state = ShopState(page="item", asin=asin, options=tuple(chosen.items()))
    return self._score(state, task).reward >= 1.0 - 1e-9

  # -- internals -------------------------------------------------------------------------------

  def _require_session(self) -> tuple[ShopState, WebShopTask]:
    if self._state is None or self._task is None:
      raise RuntimeError("the WebShop sandbox has no session: call reset(task) or restore(snapshot)")
    return self._state, self._task

  def _maybe_truncate(self, step: Step) -> Step:
    if self._state.steps < self.max_steps:
      return step
    info = dict(step.info)
    info.update(success=False, truncated_after_steps=self.max_steps)
    return dataclasses.replace(
        step, observation=f"{step.observation}{SEP}Step limit of {self.max_steps} reached.",
        done=True, truncated=True, info=info)

  def _product(self, asin: str) -> Product:
    return self.catalogue.by_asin[asin]

  def _page_results(self, state: ShopState) -> tuple[str, ...]:
    lo = (state.results_page - 1) * self.results_per_page
    return state.results[lo:lo + self.results_per_page]

  def _render(self, state: ShopState, task: WebShopTask) -> tuple[str, list[str]]:
    """The page text and its buttons (in display form)."""
    head = ["Instruction:", task.instruction]
    if state.page == "search":
      return SEP.join(["WebShop", *head, "Search"]), []
    if state.page == "results":
      shown = self._page_results(state)
      parts = [*head, BACK_TO_SEARCH,
               f"Page {state.results_page} (Total results: {len(state.results)})"]
      buttons = [BACK_TO_SEARCH]
      if state.results_page > 1:
        parts.append(PREV_PAGE)
        buttons.append(PREV_PAGE)
      if state.results_page * self.results_per_page < len(state.results):
        parts.append(NEXT_PAGE)
        buttons.append(NEXT_PAGE)
      if not state.results:
        parts.append(f"No products match {state.query!r}.")
      for asin in shown:
        p = self._product(asin)
        parts += [asin, p.title, p.price_tag]
        buttons.append(asin)
      return SEP.join(parts), buttons
    product = self._product(state.asin)
    if state.page == "item":
      parts = [*head, BACK_TO_SEARCH, PREV_PAGE]
      buttons = [BACK_TO_SEARCH, PREV_PAGE]
      for name, values in product.options:
        parts.append(name)
        parts += values
        buttons += [v for v in values if v not in buttons]
      if state.options:
        parts.append("Selected: " + ", ".join(f"{k}: {v}" for k, v in state.options))
      parts += [product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}",
                *SUB_PAGES, BUY_NOW]
      buttons += [*SUB_PAGES, BUY_NOW]
      return SEP.join(parts), buttons
    if state.page in ("description", "features", "reviews"):
      body = {
          "description": [product.description or "No description."],
          "features": list(product.bullet_points) or ["No features listed."],
          "reviews": list(product.reviews) or ["No reviews yet."],
      }[state.page]
      return SEP.join([*head, BACK_TO_SEARCH, PREV_PAGE, *body]), [BACK_TO_SEARCH, PREV_PAGE]
    if state.page == "done":
      chosen = ", ".join(f"{k}: {v}" for k, v in state.options) or "none"
      return SEP.join(["Thank you for shopping with us!", "Purchased", state.asin, product.title,
                       "Options", chosen, "Your score (min 0.0, max 1.0)",
                       f"{state.reward:.4f}"]), []
    raise AssertionError(f"unknown page {state.page!r}")

  def _transition(self, state: ShopState, text: str) -> tuple[ShopState | None, str | None]:
    """The next state for a well-formed action text, or (None, reason) when it does not apply."""
    match = _ACTION_RE.fullmatch(text)
    if match is None:
      return None, f"cannot parse {text[:80]!r}; expected search[keywords] or click[button]"
    verb, arg = match.group(1).lower(), match.group(2).strip()
    if verb == "search":
      if state.page != "search":
        return None, "there is no search box on this page; click[Back to Search] first"
      if not arg:
        return None, "the search keywords are empty"
      return ShopState(page="results", query=arg, results=self._search(arg), results_page=1,
                       steps=state.steps), None
    _, buttons = self._render(state, self._task)
    by_key = {}
    for b in buttons:
      by_key.setdefault(_norm(b), b)
    button = by_key.get(_norm(arg))
    if button is None:
      where = "the search page has no buttons; use search[keywords]" if state.page == "search" \
          else "it is not a button on this page"
      return None, f"cannot click {arg[:80]!r}: {where}"
    if button == BACK_TO_SEARCH:
      return ShopState(steps=state.steps), None
    if state.page == "results":
      if button == NEXT_PAGE:
        return dataclasses.replace(state, results_page=state.results_page + 1), None
      if button == PREV_PAGE:
        return dataclasses.replace(state, results_page=state.results_page - 1), None
      return dataclasses.replace(state, page="item", asin=button, options=()), None
    if state.page == "item":
      if button == PREV_PAGE:
        return dataclasses.replace(state, page="results", asin="", options=()), None
      if button in SUB_PAGES:
        return dataclasses.replace(state, page=button.lower()), None
      if button == BUY_NOW:
        outcome = self._score(state, self._task)
        return dataclasses.replace(state, page="done", reward=outcome.reward), None
      return dataclasses.replace(state, options=self._select(state, button)), None
    # A description, features or reviews page: "< Prev" returns to the product.
    return dataclasses.replace(state, page="item"), None

  def _select(self, state: ShopState, value: str) -> tuple[tuple[str, str], ...]:
    """Chosen options after clicking `value`: it replaces the choice for its option name."""
    product = self._product(state.asin)
    name = next(n for n, values in product.options if value in values)
    chosen = dict(state.options)
    chosen[name] = value
    order = [n for n, _ in product.options]
    return tuple((n, chosen[n]) for n in order if n in chosen)

  def _score(self, state: ShopState, task: WebShopTask) -> reward_lib.PurchaseReward:
    product = self._product(state.asin)
    return reward_lib.purchase_reward(
        bought_query=product.query, bought_category=product.product_category,
        bought_title=product.title, bought_attributes=product.attributes,
        bought_text=product.text, bought_price=product.price,
        chosen_options=dict(state.options), target_query=task.query,
        target_category=task.product_category, target_title=task.name,
        target_attributes=task.attributes, target_options=task.goal_options,
        price_upper=task.price_upper, nouns_fn=self._nouns_fn)

  def _purchase_info(self, state: ShopState, task: WebShopTask) -> dict[str, Any]:
    outcome = self._score(state, task)
    return {
        "success": outcome.reward >= 1.0 - 1e-9,
        "purchased_asin": state.asin,
        "target_asin": task.asin,
        "chosen_options": dict(state.options),
        "reward_parts": dataclasses.asdict(outcome),
    }


def instruction_query(instruction: str) -> str:
  """The words of an instruction a shopper searches with: the text before its options
  (" with color: ...") and its price limit (", and price lower than ...").

  >>> instruction_query("i need shampoo that is sulfate free with scent: citrus, and price "
  ...                   "lower than 30.00 dollars")
  'i need shampoo that is sulfate free'
  """
  text = instruction
  for marker in (" with ", ", and price lower than", " and price lower than",
                 ", price lower than"):
    cut = text.find(marker)
    if cut > 0:
      text = text[:cut]
  return " ".join(text.split()) or " ".join(instruction.split())


def _closest_option(product: Product, wanted: str) -> tuple[str | None, str]:
  """The product's (option name, value) that best matches a goal option value."""
  best, best_score = (None, ""), -1.0
  for name, values in product.options:
    for value in values:
      if value == wanted:
        return name, value
      score = reward_lib.token_set_ratio(reward_lib.normalize_color(wanted),
                                         reward_lib.normalize_color(value))
      if score > best_score:
        best, best_score = (name, value), score
  return best if best_score > reward_lib.FUZZY_MATCH_THRESHOLD else (None, "")


# ---------------------------------------------------------------------------------------------
# Building shops: one catalogue and index per configuration and per fingerprint, per process.

_FILE_KEYS = ("products_path", "attributes_path", "human_instructions_path", "reviews_path")
_RELEASE_KEYS = ("data_dir", "data_size", "index_cache_dir", "human_goals", "price_seed")
_CATALOGUE_KEYS = ("num_products", "catalogue_seed", "goals_per_product", *_FILE_KEYS,
                   *_RELEASE_KEYS)
_SANDBOX_KEYS = ("max_steps", "results_per_page", "search_return_n", "nouns_fn")

_lock = threading.Lock()
_by_config: dict[tuple, tuple[Catalogue, ProductIndex]] = {}
_by_fingerprint: dict[str, tuple[Catalogue, ProductIndex]] = {}


def _file_key(name: str, path: Any) -> tuple:
  path = os.fspath(path)
  try:
    st = os.stat(path)
  except OSError as e:
    raise TaskInputError(f"WebShop data file {path!r} ({name}): {e.strerror or e}") from None
  return (os.path.abspath(path), st.st_size, st.st_mtime_ns)


def _resolve_files(config: dict[str, Any]) -> dict[str, Any]:
  """`data_dir` (+ `data_size`) replaced by the file paths it names; checks the combination."""
  config = dict(config)
  if config.get("data_dir") is not None:
    given = [k for k in _FILE_KEYS[:3] if config.get(k) is not None]
    if given:
      raise TaskInputError(f"give data_dir or {given}, not both")
    data_dir = config.pop("data_dir")
    if not isinstance(data_dir, (str, os.PathLike)) or not os.path.isdir(data_dir):
      raise TaskInputError(f"env.options.data_dir = {data_dir!r}: no such directory (a "
                           "directory of WebShop's released files)")
    config.update(released_lib.released_paths(data_dir, config.pop("data_size", "1000")))
  elif config.get("data_size") is not None:
    raise TaskInputError("'data_size' needs data_dir (a directory of WebShop's released files): "
                         "give --config.env.options.data_dir=DIR")
  else:
    config.pop("data_dir", None)
    config.pop("data_size", None)
  if config.get("products_path") is not None:
    for k in ("catalogue_seed", "goals_per_product"):
      if k in config:
        raise TaskInputError(f"{k!r} applies to the synthetic catalogue, not to WebShop files")
  else:
    for k in (*_FILE_KEYS[1:], "human_goals", "price_seed", "index_cache_dir"):
      if config.get(k) is not None:
        raise TaskInputError(f"{k!r} needs products_path or data_dir (it applies to WebShop "
                             "files only)")
  return config


def _build_catalogue(config: dict[str, Any]) -> Catalogue:
  if config.get("products_path") is None:
    return catalogue_lib.generate_catalogue(
        config.get("num_products", 200), config.get("catalogue_seed", 0),
        config.get("goals_per_product", 1))
  return released_lib.load_webshop_files(
      config["products_path"], config.get("attributes_path"),
      config.get("human_instructions_path"), config.get("reviews_path"),
      num_products=config.get("num_products"), human_goals=config.get("human_goals", True),
      price_seed=config.get("price_seed", 0))


def _build_index(cat: Catalogue, cache_dir: str | None) -> ProductIndex:
  """In memory for the synthetic shop; saved once and memory-mapped for WebShop's files."""
  if cat.index_key is None:
    return ProductIndex(cat.products)
  return index_cache.cached_index(cat.products, cat.index_key, cache_dir)


def get_shop(**config: Any) -> tuple[Catalogue, ProductIndex]:
  """The catalogue and search index for a configuration, built once per process.

  Synthetic: `num_products` (default 200), `catalogue_seed` (0), `goals_per_product` (1); the
  index is built in memory.
  WebShop's released files: `data_dir` (a directory laid out as the release's `data/`) with
  `data_size` ("1000": items_shuffle_1000.json, or "full": items_shuffle.json), or the paths
  `products_path`, `attributes_path`, `human_instructions_path`, `reviews_path`; with
  `human_goals` (True), `num_products` (all), `price_seed` (0) and `index_cache_dir` (see
  `index_cache.default_cache_dir`), where the index is saved once and memory-mapped.
  """
  unknown = sorted(set(config) - set(_CATALOGUE_KEYS))
  if unknown:
    raise TaskInputError(f"unknown WebShop catalogue option(s) {unknown}; known: "
                         f"{list(_CATALOGUE_KEYS)}")
  config = _resolve_files(config)
  key = tuple((k, _file_key(k, v) if k.endswith("_path") and v is not None else v)
              for k, v in sorted(config.items()))
  with _lock:
    if key in _by_config:
      return _by_config[key]
  cat = _build_catalogue(config)
  with _lock:
    shop = _by_fingerprint.get(cat.fingerprint)
  if shop is None:
    shop = (cat, _build_index(cat, config.get("index_cache_dir")))
  with _lock:
    shop = _by_fingerprint.setdefault(cat.fingerprint, shop)
    _by_config[key] = shop
    return shop


def make_sandbox(**config: Any) -> WebShopSandbox:
  """A WebShop sandbox: catalogue options as in `get_shop`, plus `max_steps` (15),
  `results_per_page` (10), `search_return_n` (50) and `nouns_fn` (the type reward's noun
  extractor)."""
  sandbox_config = {k: config.pop(k) for k in _SANDBOX_KEYS if k in config}
  catalogue, index = get_shop(**config)
  return WebShopSandbox(catalogue, index, **sandbox_config)


def atomic_strings(**config: Any) -> list[str]:
  """The product ids (asins) of the shop `config` builds, in catalogue order: the strings a
  from-scratch tokenizer keeps as one token each (`bpo_jax.text.corpus.atomic_strings`), since
  a policy clicks a product by copying its id from the results page. They name the catalogue's
  products, the same for every split, not the goals. Sandbox-only options are ignored.
  """
  for k in _SANDBOX_KEYS:
    config.pop(k, None)
  catalogue, _ = get_shop(**config)
  return [p.asin for p in catalogue.products]


def make_tasks(split: str, num: int | None, seed: int = 0, **config: Any) -> list[WebShopTask]:
  """`num` goals of a split (`train`, `eval`, `test`), drawn without replacement by `seed`.

  `seed` picks the goals; the shop itself is fixed by `config` (`catalogue_seed` for the
  synthetic catalogue), so tasks drawn with any `seed` run in any sandbox of the same config.

  `num=None` returns the whole split in its fixed order. Sandbox-only options in `config` are
  accepted and ignored so that one config serves both entry points.
  """
  for k in _SANDBOX_KEYS:
    config.pop(k, None)
  catalogue, _ = get_shop(**config)
  indices = catalogue.split_indices(split)
  if num is None:
    return [catalogue.goals[i] for i in indices]
  if not isinstance(num, int) or isinstance(num, bool) or num < 0:
    raise ValueError(f"num must be a non-negative integer or None, got {num!r}")
  if num > len(indices):
    raise TaskInputError(f"WebShop's {split!r} split has {len(indices)} goals; {num} were asked "
                         "for (env.num_train_tasks or env.num_eval_tasks)")
  chosen = random.Random(f"bpo_jax.webshop.tasks/{seed}").sample(indices, num)
  return [catalogue.goals[i] for i in chosen]
