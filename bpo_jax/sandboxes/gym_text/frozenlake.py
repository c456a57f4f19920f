"""FrozenLake (slippery unless `is_slippery=False`) as a text sandbox; see `sandboxes.gym_text`.

Each task has its own random map (size `size`, generated from the task's seed). Observation:
"Row 1, column 2 of 4, on frozen ice. Map: S X F F / F H F H / ...", the X marking the agent.
With `neighbours=True` it also names the four cells next to the agent's, "Right H, down F, left
S, up edge.", before the map: what the map says there, read off for the agent.

Without slipping (`is_slippery=False`) the lake is deterministic and the sandbox's
`expert_actions()` is a shortest path to G that avoids the holes, ties broken by a fixed order
of moves (`shortest_path`), the expert a warm start imitates; on slippery ice there is no such
plan (None).

The sandbox contract and the registry's interface: docs/DESIGN.md §4.
"""

from __future__ import annotations

import functools
import zlib

from gymnasium.envs.toy_text import frozen_lake

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import gym_text


class _Lake(frozen_lake.FrozenLakeEnv):
  """gymnasium's lake, plus whether its description names the agent's neighbours."""

  def __init__(self, desc, is_slippery, neighbours=False):
    super().__init__(desc=list(desc), is_slippery=is_slippery)
    self.neighbours = neighbours


def _make_env(desc=None, is_slippery=True, neighbours=False):
  return _Lake(desc, is_slippery, neighbours)


# (name, row step, column step) of each neighbour, in the order the description names them.
_NEIGHBOURS = (("right", 0, 1), ("down", 1, 0), ("left", 0, -1), ("up", -1, 0))


def _describe(env) -> str:
  rows, cols = env.desc.shape
  row, col = divmod(int(env.s), cols)
  grid = [[c.decode() for c in line] for line in env.desc]
  here = {"S": "the start", "F": "frozen ice", "H": "a hole", "G": "the goal"}
  cell = here[grid[row][col]]
  around = ""
  if env.neighbours:
    cells = [grid[row + dr][col + dc] if 0 <= row + dr < rows and 0 <= col + dc < cols
             else "edge" for _, dr, dc in _NEIGHBOURS]
    text = ", ".join(f"{name} {c}" for (name, _, _), c in zip(_NEIGHBOURS, cells))
    around = f" {text[0].upper()}{text[1:]}."
  grid[row][col] = "X"
  return (f"Row {row + 1}, column {col + 1} of {rows}, on {cell}.{around} "
          f"Map: {' / '.join(' '.join(line) for line in grid)}.")


def map_split(desc) -> str:
  """The split a map belongs to: "train" if the CRC-32 of its rows is even, else "test"; so no
  held-out map is ever a training map, however many tasks each split draws."""
  return "train" if zlib.crc32("".join(desc).encode()) % 2 == 0 else "test"


# Maps drawn for one task before its split is taken to have none of this size.
MAX_MAP_DRAWS = 1000


def _task_env_kwargs(rng, split="train", size=4, is_slippery=True, neighbours=False,
                     **unused):
  """A random map of `size` x `size` cells from the task's generator: the first drawn that
  belongs to `split` (`map_split`). A size too small to give the split a map (2: all three
  valid maps are "train") is a `TaskInputError`, not an endless draw. `neighbours` changes
  the description only, not the maps drawn."""
  del unused
  for _ in range(MAX_MAP_DRAWS):
    desc = tuple(frozen_lake.generate_random_map(size=size, seed=rng.randrange(1 << 30)))
    if map_split(desc) == split:
      kwargs = (("desc", desc), ("is_slippery", is_slippery))
      return kwargs + ((("neighbours", True),) if neighbours else ())
  raise base.TaskInputError(f"env.options.size = {size}: no {split} map in {MAX_MAP_DRAWS} "
                            "drawn (a map's split is the parity of its CRC-32); use a larger "
                            "size")


# The order in which the expert breaks ties between moves that start a shortest path.
EXPERT_PREFERENCE = ("right", "down", "left", "up")


def shortest_path(env) -> list[str] | None:
  """The fewest moves from the env's current cell to G that fall into no hole; where several
  moves start such a path, the first of `EXPERT_PREFERENCE` (a rule the policy can read off the
  map near its cell most of the time). None if the ice is slippery (a move with more than one
  outcome in the env's transitions `env.P`: state -> action -> [(p, next, reward, terminated)])
  or G is out of reach.

  The distance d(s) to G is the fixed point of d(G) = 0, d(s) = 1 + min over moves a of
  d(next(s, a)) (a hole's distance infinite), reached in at most as many sweeps as cells.
  """
  if any(len(outcomes) != 1 for moves in env.P.values() for outcomes in moves.values()):
    return None
  cells = env.desc.ravel()
  nxt = {s: {a: outcomes[0][1] for a, outcomes in moves.items()} for s, moves in env.P.items()}
  dist = {s: 0 if cells[s] == b"G" else float("inf") for s in nxt}
  for _ in range(len(nxt)):
    for s in nxt:
      if cells[s] not in (b"G", b"H"):
        dist[s] = min(dist[s], 1 + min(dist[t] for t in nxt[s].values()))
  state, path = int(env.s), []
  if dist[state] == float("inf"):
    return None
  while dist[state] > 0:
    action = next(a for a in EXPERT_PREFERENCE
                  if dist[nxt[state][SPEC.actions.index(a)]] == dist[state] - 1)
    path.append(action)
    state = nxt[state][SPEC.actions.index(action)]
  return path


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
