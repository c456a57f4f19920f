"""CliffWalking (slippery) as a text sandbox; see `bpo_jax.sandboxes.gym_text`.

The sandbox contract and the registry's interface: docs/DESIGN.md §4.
"""

from __future__ import annotations

import functools

from gymnasium.envs.toy_text import cliffwalking

from bpo_jax.sandboxes import gym_text


def _make_env(is_slippery=True):
  return cliffwalking.CliffWalkingEnv(is_slippery=is_slippery)


def _describe(env) -> str:
  rows, cols = env.shape
  row, col = divmod(int(env.s), cols)
  return (f"Row {row + 1}, column {col + 1} of a {rows} by {cols} grid. The cliff runs along "
          f"row {rows} between columns 2 and {cols - 1}; the goal is row {rows}, column {cols}.")


def _task_env_kwargs(rng, is_slippery=True, **unused):
  del rng, unused
  return (("is_slippery", is_slippery),)


SPEC = gym_text.GymTextSpec(
    name="cliffwalking",
    make_env=_make_env,
    actions=("up", "right", "down", "left"),
    state_attributes=("s", "lastaction"),
    goal="Goal: walk from the start to the goal without falling off the cliff.",
    describe=_describe,
    is_success=gym_text.success_on_termination,
    max_steps=100,
    task_env_kwargs=_task_env_kwargs,
)


# The registry's interface, and the action syntax for language-model agents (free_text.py).
make_sandbox = functools.partial(gym_text.make_sandbox, SPEC)
make_tasks = functools.partial(gym_text.make_tasks, SPEC)
parse_action = functools.partial(gym_text.parse_action, SPEC)
SYSTEM_PROMPT = NO_ACTION_HINT = gym_text.system_prompt(SPEC)
