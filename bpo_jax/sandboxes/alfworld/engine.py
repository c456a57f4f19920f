"""ALFWorld's pieces, imported lazily, and process-wide caches for TextWorld's PDDL engine.

`_alfworld()` imports alfworld (and, for the engine, textworld) on first use, so that `import
bpo_jax.sandboxes` stays light. The engine re-parses its grammar at every step and translates a
game's PDDL at every load and reset; `_install_engine_caches` memoises both process-wide (checked
against the uncached engine by the tests, through `_engine_caches_disabled`), which brings a step
from ~150 ms to ~40 ms.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
from typing import Any


def _alfworld(engine: bool = True):
  """The pieces of alfworld (and, with `engine`, of textworld) used here, imported on first use.

  The generator needs only ALFWorld's data modules (milliseconds to import); the engine needs
  textworld, whose import takes seconds.
  """
  try:
    import alfworld.gen.constants as constants  # pylint: disable=g-import-not-at-top
    import alfworld.gen.goal_library as goal_library  # pylint: disable=g-import-not-at-top
    import alfworld.info as info  # pylint: disable=g-import-not-at-top
    modules = dict(constants=constants, goal_library=goal_library, info=info)
    if engine:
      import textworld  # pylint: disable=g-import-not-at-top
      from alfworld.agents.environment import alfred_tw_env  # pylint: disable=g-import-not-at-top
      from textworld.envs import PddlEnv  # pylint: disable=g-import-not-at-top
      modules.update(textworld=textworld, alfred_tw_env=alfred_tw_env, PddlEnv=PddlEnv)
  except ImportError as e:
    raise ImportError(
        "The ALFWorld sandbox needs the `alfworld` package (and textworld[pddl]); install it "
        'with `pip install -e ".[alfworld]"`.') from e
  return modules


def alfred_logic() -> tuple[str, str]:
  """The ALFRED PDDL domain and the TextWorld grammar shipped in the alfworld wheel."""
  info = _alfworld(engine=False)["info"]
  with open(info.ALFRED_PDDL_PATH, encoding="utf-8") as f:
    domain = f.read()
  with open(info.ALFRED_TWL2_PATH, encoding="utf-8") as f:
    grammar = f.read()
  return domain, grammar


_ENGINE_CACHES_INSTALLED = False
_ENGINE_ORIGINALS: dict[str, Any] = {}


def _install_engine_caches() -> None:
  """Memoises the pure text-to-structure conversions TextWorld's PDDL engine repeats.

  The engine re-parses the same grammar strings with tatsu at every step (about 75% of a step)
  and translates the same PDDL problem twice per load and twice again per reset. Both are pure
  functions of their text, so they are cached per process: a step drops from ~150 ms to ~40 ms
  and a reset after load no longer re-translates. Cached grammar symbols are deep-copied on the
  way out because a derivation writes its context into them.
  """
  global _ENGINE_CACHES_INSTALLED
  if _ENGINE_CACHES_INSTALLED:
    return
  import fast_downward  # pylint: disable=g-import-not-at-top
  import textworld.envs.pddl.textgen as textgen  # pylint: disable=g-import-not-at-top
  import textworld.logic as tw_logic  # pylint: disable=g-import-not-at-top

  parse_symbols = textgen._parse_and_convert  # pylint: disable=protected-access

  @functools.lru_cache(maxsize=8192)
  def cached_symbols(text, rule_name, trace):
    return parse_symbols(text, rule_name=rule_name, trace=trace)

  def symbols(text, rule_name=None, trace=False, **kwargs):
    if kwargs or not isinstance(text, str):
      return parse_symbols(text, rule_name=rule_name, trace=trace, **kwargs)
    return copy.deepcopy(cached_symbols(text, rule_name, bool(trace)))

  parse_logic = tw_logic._parse_and_convert  # pylint: disable=protected-access

  @functools.lru_cache(maxsize=8192)
  def cached_query(text):
    return tuple(parse_logic(text, rule_name="conjunctiveQuery"))

  def logic(text, rule_name=None, **kwargs):
    # Only conjunctive queries (grammar conditions) are cached: a list of immutable propositions.
    if rule_name == "conjunctiveQuery" and not kwargs and isinstance(text, str):
      return list(cached_query(text))
    return parse_logic(text, rule_name=rule_name, **kwargs)

  translate = fast_downward.pddl2sas

  @functools.lru_cache(maxsize=16)
  def pddl2sas(domain, problem, verbose=False, optimize=False):
    # The translator overwrites sys.argv for its option parser; give the caller's back.
    argv = list(sys.argv)
    try:
      return translate(domain, problem, verbose=verbose, optimize=optimize)
    finally:
      sys.argv[:] = argv

  _ENGINE_ORIGINALS.update(symbols=parse_symbols, logic=parse_logic, pddl2sas=translate)
  textgen._parse_and_convert = symbols  # pylint: disable=protected-access
  tw_logic._parse_and_convert = logic  # pylint: disable=protected-access
  fast_downward.pddl2sas = pddl2sas
  _ENGINE_CACHES_INSTALLED = True


@contextlib.contextmanager
def _engine_caches_disabled():
  """Runs the engine's own, uncached functions inside the block (to check the caches change
  nothing: the tests compare a game played both ways)."""
  import fast_downward  # pylint: disable=g-import-not-at-top
  import textworld.envs.pddl.textgen as textgen  # pylint: disable=g-import-not-at-top
  import textworld.logic as tw_logic  # pylint: disable=g-import-not-at-top
  _install_engine_caches()
  # pylint: disable=protected-access
  cached = (textgen._parse_and_convert, tw_logic._parse_and_convert, fast_downward.pddl2sas)
  textgen._parse_and_convert = _ENGINE_ORIGINALS["symbols"]  # pylint: disable=protected-access
  tw_logic._parse_and_convert = _ENGINE_ORIGINALS["logic"]  # pylint: disable=protected-access
  fast_downward.pddl2sas = _ENGINE_ORIGINALS["pddl2sas"]
  try:
    yield
  finally:
    textgen._parse_and_convert, tw_logic._parse_and_convert, fast_downward.pddl2sas = cached
