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

For language-model agents, `ACTION_SYNTAX` names the module that states each environment's
action syntax (a module-level `SYSTEM_PROMPT` and `parse_action(text) -> str | None`; see
`free_text.py`); `make_free_text_sandbox(name, **config)` builds a sandbox that takes replies.

    syntax = get_action_syntax("webshop")
    syntax.parse_action("I'll search.\\nsearch[red socks]")      # "search[red socks]"

To add an environment, add one line to `ENVIRONMENTS` (and one to `ACTION_SYNTAX`).
"""

from __future__ import annotations

import importlib
import types

from bpo_jax.sandboxes import free_text

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

# Environment name -> the module with its `SYSTEM_PROMPT` and `parse_action` (the environment's
# own module, or a module beside it where the environment is a package or a long file).
ACTION_SYNTAX = {
    "swe": "bpo_jax.sandboxes.swe.actions",
    "rooms": "bpo_jax.sandboxes.rooms",
    "textworld": "bpo_jax.sandboxes.textworld_env",
    "frozenlake": "bpo_jax.sandboxes.gym_text.frozenlake",
    "taxi": "bpo_jax.sandboxes.gym_text.taxi",
    "cliffwalking": "bpo_jax.sandboxes.gym_text.cliffwalking",
    "blackjack": "bpo_jax.sandboxes.gym_text.blackjack",
    "webshop": "bpo_jax.sandboxes.webshop.actions",
    "alfworld": "bpo_jax.sandboxes.alfworld.actions",
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


def get_action_syntax(name: str) -> free_text.ActionSyntax:
  """The system prompt and action parser of environment `name` (see `free_text.py`).

  Raises:
    KeyError: `name` is not registered or states no action syntax.
  """
  if name not in ACTION_SYNTAX:
    get_environment(name)  # an unknown name: the message lists the known ones
    raise KeyError(f"environment {name!r} states no action syntax (add it to ACTION_SYNTAX)")
  module = importlib.import_module(ACTION_SYNTAX[name])
  return free_text.ActionSyntax(system_prompt=module.SYSTEM_PROMPT,
                                parse_action=module.parse_action,
                                hint=getattr(module, "NO_ACTION_HINT", ""))


def make_free_text_sandbox(name: str, **config) -> free_text.FreeTextSandbox:
  """Environment `name`'s sandbox behind its action parser: `step` takes a model's reply.

  A module-level function, so `functools.partial(make_free_text_sandbox, name, **config)` is a
  sandbox factory that `pool.SandboxPool` can send to its workers.
  """
  return free_text.FreeTextSandbox(get_environment(name).make_sandbox(**config),
                                   get_action_syntax(name))
