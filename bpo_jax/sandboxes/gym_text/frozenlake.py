"""FrozenLake (slippery) as a text sandbox; see `bpo_jax.sandboxes.gym_text`.

Each task has its own random map (size `size`, generated from the task's seed). Observation:
"Row 1, column 2 of 4. Map: S F F F / F H F H / ... The X marks you."

Without slipping (`is_slippery=False`) the lake is deterministic and the sandbox's
`expert_actions()` is a shortest path to G that avoids the holes (breadth-first over the env's
transitions), the expert a warm start imitates; on slippery ice there is no such plan (None).

The sandbox contract and the registry's interface: docs/DESIGN.md §4.
"""

from __future__ import annotations

import collections
import functools
import zlib

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


def map_split(desc) -> str:
  """The split a map belongs to: "train" if the CRC-32 of its rows is even, else "test"; so no
  held-out map is ever a training map, however many tasks each split draws."""
  return "train" if zlib.crc32("".join(desc).encode()) % 2 == 0 else "test"


def _task_env_kwargs(rng, split="train", size=4, is_slippery=True, **unused):
  """A random map of `size` x `size` cells from the task's generator: the first drawn that
  belongs to `split` (`map_split`)."""
  del unused
  while True:
    desc = tuple(frozen_lake.generate_random_map(size=size, seed=rng.randrange(1 << 30)))
    if map_split(desc) == split:
      return (("desc", desc), ("is_slippery", is_slippery))


def shortest_path(env) -> list[str] | None:
  """The fewest moves from the env's current cell to G that fall into no hole, by breadth-first
  search over its transitions `env.P` (state -> action -> [(p, next, reward, terminated)]);
  None if the ice is slippery (some move has more than one outcome) or no path exists."""
  if any(len(outcomes) != 1 for moves in env.P.values() for outcomes in moves.values()):
    return None
  goal = env.desc.ravel() == b"G"
  start = int(env.s)
  previous = {start: None}
  queue = collections.deque([start])
  while queue:
    state = queue.popleft()
    if goal[state]:
      path = []
      while previous[state] is not None:
        state, action = previous[state]
        path.append(SPEC.actions[action])
      return path[::-1]
    for action, [(_, nxt, _, terminated)] in sorted(env.P[state].items()):
      if nxt not in previous and (not terminated or goal[nxt]):
        previous[nxt] = (state, action)
        queue.append(nxt)
  return None


SPEC = gym_text.GymTextSpec(
    name="frozenlake",
    make_env=_make_env,
    actions=("left", "down", "right", "up"),
    state_attributes=("s", "lastaction"),
    goal="Goal: cross the ice from S to G without falling into a hole H.",
    describe=_describe,
    is_success=gym_text.success_on_positive_reward,
    max_steps=100,
    task_env_kwargs=_task_env_kwargs,
    expert=shortest_path,
)


# The registry's interface, and the action syntax for language-model agents (free_text.py).
make_sandbox = functools.partial(gym_text.make_sandbox, SPEC)
make_tasks = functools.partial(gym_text.make_tasks, SPEC)
parse_action = functools.partial(gym_text.parse_action, SPEC)
SYSTEM_PROMPT = NO_ACTION_HINT = gym_text.system_prompt(SPEC)
