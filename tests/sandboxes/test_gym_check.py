"""The gymnasium adapter passes gymnasium's own environment checker for every registered
environment, and maps an observation its space cannot hold into it."""

import importlib.util
import os
import warnings

import gymnasium
import pytest
from gymnasium.utils import env_checker

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import registry
from bpo_jax.sandboxes.swe import confinement

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
SWE_MODE = {} if confinement.namespaces_available() else {"confinement": "rlimits-only"}
# Small tasks: the checker resets and steps each environment a handful of times.
OPTIONS = {
    "webshop": {"num_products": 50, "catalogue_seed": 0, "goals_per_product": 1, "max_steps": 5},
    "textworld": {"games_dir": os.path.join(FIXTURES, "textworld_games")},
    "swe": {"max_steps": 5, **SWE_MODE},
}
# The optional packages an environment needs beyond this project's own dependencies.
NEEDS = {"textworld": ("textworld", "jericho"), "alfworld": ("alfworld", "textworld"),
         "swe": ("swebench",), "webshop": ("bm25s",)}


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.environment_names())
def test_gymnasium_check_env_passes(name):
  for package in NEEDS.get(name, ()):
    if importlib.util.find_spec(package) is None:
      pytest.skip(f"{name} needs the package {package}, which is not installed")
  module = registry.get_environment(name)
  options = OPTIONS.get(name, {})
  tasks = module.make_tasks("train", 2, 0, **options)
  env = base.make_gym_env(module.make_sandbox(**options), tasks)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    # The adapter declares no render modes and no registration spec, so there is nothing to
    # render and no second instance to build.
    env_checker.check_env(env, skip_render_check=True, skip_close_check=True)
  gym_warnings = [str(w.message) for w in caught if "gymnasium" in w.filename]
  assert not gym_warnings, gym_warnings
  observation, _ = env.reset(seed=1)
  assert env.observation_space.contains(observation)
  # Every character of the registered environments' observations is in the charset as it is.
  assert base.REPLACEMENT_CHARACTER not in observation
  env.close()
  env.close()  # a second close is allowed, as gymnasium asks


class _UnicodeSandbox:
  """A sandbox whose observations hold characters beyond the adapter's charset."""

  def reset(self, task):
    return "caf\u00e9 \u2603 \U0001F600"

  def step(self, action):
    return base.Step(observation="" if action == "empty" else "x" * 50, reward=0.0, done=False)

  def snapshot(self):
    return base.Snapshot(b"")

  def restore(self, snapshot):
    pass

  def close(self):
    pass


def test_observations_outside_the_space_are_mapped_into_it():
  env = base.make_gym_env(_UnicodeSandbox(), ["only"], max_observation_chars=20)
  assert isinstance(env.observation_space, gymnasium.spaces.Text)
  observation, info = env.reset(seed=0)
  # é is Latin-1 and stays; the snowman and the emoji become U+FFFD.
  assert observation == "caf\u00e9 \ufffd \ufffd" and env.observation_space.contains(observation)
  assert info["sandbox_observation"] == "caf\u00e9 \u2603 \U0001F600"
  observation, _, _, _, info = env.step("long")
  assert observation == "x" * 20 and info["sandbox_observation"] == "x" * 50
  observation, _, _, _, info = env.step("empty")
  assert observation == " " and info["sandbox_observation"] == ""
  # Actions: printable ASCII, tab, newline and Latin-1, up to what sandboxes accept.
  assert env.action_space.max_length == base.MAX_ACTION_CHARS
  assert env.action_space.contains("search[red socks]\n\tcaf\u00e9")
  assert not env.action_space.contains("bell\x07")
