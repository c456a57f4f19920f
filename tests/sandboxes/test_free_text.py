"""Free-text actions: each environment's parser, the no-action observation, the registry."""

import functools
import pickle

import pytest

from bpo_jax.sandboxes import free_text, registry, rooms
from bpo_jax.sandboxes.swe import actions as swe_actions
from bpo_jax.sandboxes.webshop import actions as webshop_actions


def test_every_environment_states_its_action_syntax():
  assert sorted(registry.ACTION_SYNTAX) == registry.environment_names()
  for name in registry.environment_names():
    syntax = registry.get_action_syntax(name)
    assert syntax.system_prompt and syntax.hint
    assert syntax.parse_action("") is None
    assert syntax.parse_action("I am not sure what to do here.") is None
  with pytest.raises(KeyError, match="unknown environment 'nowhere'"):
    registry.get_action_syntax("nowhere")


@pytest.mark.parametrize("reply, action", [
    ("go north", "go north"),
    ("take red key", "take red key"),
    ("I need the key first.\ntake red key", "take red key"),
    ("> open blue door", "open blue door"),
    ("`put apple in box`", "put apple in box"),
    ("Go north.", "Go north"),
    ("  drop lamp  \nand then more", "drop lamp"),
    ("going north", None),
    ("north", None),
])
def test_rooms_parser(reply, action):
  assert rooms.parse_action(reply) == action


@pytest.mark.parametrize("name, reply, action", [
    ("frozenlake", "left", "left"),
    ("frozenlake", "The hole is below.\nright.", "right"),
    ("frozenlake", "go left", None),
    ("taxi", "pickup", "pickup"),
    ("blackjack", "> Hit", "Hit"),
    ("cliffwalking", "up up", "up up"),
    ("textworld", "The box is locked.\nunlock box with latchkey", "unlock box with latchkey"),
    ("textworld", "take type K keycard", "take type K keycard"),
    ("textworld", "inventory", "inventory"),
    ("alfworld", "go to countertop 1", "go to countertop 1"),
    ("alfworld", "It is dirty.\nclean mug 1 with sinkbasin 1", "clean mug 1 with sinkbasin 1"),
    ("alfworld", "move pen 1 to drawer 2", "move pen 1 to drawer 2"),
])
def test_command_parsers(name, reply, action):
  assert registry.get_action_syntax(name).parse_action(reply) == action


@pytest.mark.parametrize("reply, action", [
    ("search[Meridian Clip in Hair Extensions, Heat Resistant]",
     "search[Meridian Clip in Hair Extensions, Heat Resistant]"),
    ("click[B0B34SD43W]", "click[B0B34SD43W]"),
    ("I will buy it now.\nclick[Buy Now]", "click[Buy Now]"),
    ("click[Socks [2 Pack]] and then click[Buy Now]", "click[Socks [2 Pack]]"),
    ("Search [red socks]", "Search [red socks]"),
    ("research[x] then click[< Prev]", "click[< Prev]"),
    ("click[Buy Now", None),
    ("search red socks", None),
])
def test_webshop_parser(reply, action):
  assert webshop_actions.parse_action(reply) == action


REPLACE = ("replace m.py\n<<<<<<< SEARCH\n    return x - 1\n=======\n    return x\n"
           ">>>>>>> REPLACE")


@pytest.mark.parametrize("reply, action", [
    ("submit", "submit"),
    ("The tests pass.\nsubmit\nThanks!", "submit"),
    ("run python -m pytest -q", "run python -m pytest -q"),
    ("run cd pkg &&\n  python -m pytest -q", "run cd pkg &&\n  python -m pytest -q"),
    ("view m.py 1 20\nand more", "view m.py 1 20"),
    ("write a.py\nimport os\n\nprint(os.sep)\n", "write a.py\nimport os\n\nprint(os.sep)\n"),
    ("Fix the off-by-one.\n" + REPLACE + "\nThen submit.", REPLACE),
    ("```\n" + REPLACE + "\n```", REPLACE),
    ("```bash\nrun ls -la\n```\nThat lists the files.", "run ls -la"),
    ("```\nwrite a.md\n# Title\n```\n", "write a.md\n# Title"),
    ("  run ls", "run ls"),
    ("Let me find it.\nfind_file '*.py' src\nthen read it", "find_file '*.py' src"),
    ('search_dir "def get(" lrucache\nrun ls', 'search_dir "def get(" lrucache'),
    ("search_file hits\n", "search_file hits"),
    ("```\nopen lrucache/cache.py 20\n```", "open lrucache/cache.py 20"),
    ("goto 40", "goto 40"),
    ("More below.\nscroll_down\nscroll_up", "scroll_down"),
    ("scroll_up.", None),
    ("Run the tests", None),
    ("I would like to submit.", None),
])
def test_swe_parser(reply, action):
  assert swe_actions.parse_action(reply) == action


def test_swe_markers_are_the_sandbox_markers():
  from bpo_jax.sandboxes.swe import sandbox  # pylint: disable=g-import-not-at-top
  assert (swe_actions.SEARCH, swe_actions.DIVIDER, swe_actions.REPLACE) == (
      sandbox._SEARCH, sandbox._DIVIDER, sandbox._REPLACE)  # pylint: disable=protected-access


def test_reply_without_an_action_gets_an_observation_and_leaves_the_state():
  task = rooms.make_tasks("train", 1, seed=0)[0]
  sandbox = registry.make_free_text_sandbox("rooms")
  first = sandbox.reset(task)
  before = sandbox.snapshot()
  step = sandbox.step("Hmm, where am I?")
  assert step.observation == ("Invalid action: no action found in the reply. Reply with one "
                              "command: go, take, drop, open or put.")
  assert (step.reward, step.done, step.truncated) == (0.0, False, False)
  assert step.info == {"invalid_action": free_text.NO_ACTION}
  assert sandbox.snapshot() == before
  # Not text at all: the inner sandbox names the problem.
  assert sandbox.step(None).info["invalid_action"] == "action must be text, got NoneType"
  # Extras and the protocol are the inner sandbox's.
  sandbox.restore(before)
  actions = sandbox.expert_actions()
  assert actions == rooms.expert_actions(task)
  assert sandbox.admissible_actions() == sandbox.inner.admissible_actions()
  rewards = [sandbox.step(f"Next I do this.\n{a}").reward for a in actions]
  assert rewards[-1] == 1.0 and sum(rewards) == 1.0
  sandbox.close()
  assert first.startswith("Goal:")


def test_free_text_factory_pickles_for_the_pool():
  factory = functools.partial(registry.make_free_text_sandbox, "rooms", max_steps=7)
  sandbox = pickle.loads(pickle.dumps(factory))()
  assert isinstance(sandbox, free_text.FreeTextSandbox)
  sandbox.reset(rooms.make_tasks("train", 1, seed=0)[0])
  assert sandbox.max_steps == 7
