"""FrozenLake (slippery) as a text sandbox; see `bpo_jax.sandboxes.gym_text`.

Each task has its own random map (size `size`, generated from the task's seed). Observation:
"Row 1, column 2 of 4. Map: S F F F / F H F H / ... The X marks you."

The sandbox contract and the registry's interface: docs/DESIGN.md §4.
"""

from __future__ import annotations

import functools

from gymnasium.envs.toy_text import frozen_lake

from bpo_jax.sandboxes import gym_text


def _make_env(desc=None, is_slippery=True):
  return frozen_lake.FrozenLakeEnv(desc=list(desc), is_slippery=is_slippery)


def _describe(env) -> str:
  rows, cols = env.desc.shape
  row, col = divmod(int(env.s), cols)
  grid = [[c.decode() for c in line] for line in env.desc]
  grid[row][col] = "X"
  here = {"S": "the start", "F": "frozen ice", "H": "a hole", "G": "the goal"}
  cell = here[env.desc[row][col].decode()]
  return (f"Row {row + 1}, column {col + 1} of {rows}, on {cell}. "
          f"Map: {' / '.join(' '.join(line) for line in grid)}.")


def _task_env_kwargs(rng, size=4, is_slippery=True, **unused):
  """A random map of `size` x `size` cells, from the task's generator."""
  del unused
  desc = frozen_lake.generate_random_map(size=size, seed=rng.randrange(1 << 30))
  return (("desc", tuple(desc)), ("is_slippery", is_slippery))


SPEC = gym_text.GymTextSpec(
    name="frozenlake",
    make_env=_make_env,
    actions=("left", "down", "right", "up"),
    state_attributes=("s", "lastaction"),
    goal="Goal: cross the slippery ice from S to G without falling into a hole H.",
    describe=_describe,
    is_success=gym_text.success_on_positive_reward,
    max_steps=100,
    task_env_kwargs=_task_env_kwargs,
)


# The registry's interface, and the action syntax for language-model agents (free_text.py).
make_sandbox = functools.partial(gym_text.make_sandbox, SPEC)
make_tasks = functools.partial(gym_text.make_tasks, SPEC)
parse_action = functools.partial(gym_text.parse_action, SPEC)
SYSTEM_PROMPT = NO_ACTION_HINT = gym_text.system_prompt(SPEC)
