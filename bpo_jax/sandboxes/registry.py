"""Environment names mapped to their modules, imported lazily.

Every environment module exposes

    make_sandbox(**config) -> Sandbox
    make_tasks(split: str, num: int, seed: int, **config) -> list

Tasks are picklable and carry a stable `task_id: str`; the "train" and "test" splits are
disjoint. `Sandbox.reset(task)` returns the first observation, which states the goal.

Importing this module imports no environment package: `get_environment(name)` imports the
environment's module on first use, so an optional dependency (textworld, alfworld, ...) is only
needed by the code that asks for that environment.

    rooms = get_environment("rooms")
    sandbox = rooms.make_sandbox()
    tasks = rooms.make_tasks("train", num=4, seed=0)

To add an environment, add one line to `ENVIRONMENTS`.
"""

from __future__ import annotations

import importlib
import types

# Environment name -> module path. One line per environment.
ENVIRONMENTS = {
    "swe": "bpo_jax.sandboxes.swe",
    "rooms": "bpo_jax.sandboxes.rooms",
    "textworld": "bpo_jax.sandboxes.textworld_env",
    "frozenlake": "bpo_jax.sandboxes.gym_text.frozenlake",
    "taxi": "bpo_jax.sandboxes.gym_text.taxi",
    "cliffwalking": "bpo_jax.sandboxes.gym_text.cliffwalking",
    "blackjack": "bpo_jax.sandboxes.gym_text.blackjack",
    "webshop": "bpo_jax.sandboxes.webshop",
    "alfworld": "bpo_jax.sandboxes.alfworld",
}


def environment_names() -> list[str]:
  """The registered environment names, sorted."""
  return sorted(ENVIRONMENTS)


def get_environment(name: str) -> types.ModuleType:
  """Imports and returns the module of environment `name`.

  Raises:
    KeyError: `name` is not registered; the message lists the known names.
  """
  if name not in ENVIRONMENTS:
    raise KeyError(
        f"unknown environment {name!r}; known environments: {', '.join(environment_names())}")
  return importlib.import_module(ENVIRONMENTS[name])
