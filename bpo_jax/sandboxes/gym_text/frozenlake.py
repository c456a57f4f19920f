"""FrozenLake (slippery) as a text sandbox; see `bpo_jax.sandboxes.gym_text`.

Each task has its own random map (size `size`, generated from the task's seed). Observation:
"Row 1, column 2 of 4. Map: S F F F / F H F H / ... The X marks you."
"""

from __future__ import annotations

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


SPEC = gym_text.GymTextSpec(
    name="frozenlake",
    make_env=_make_env,
    actions=("left", "down", "right", "up"),
    state_attributes=("s", "lastaction"),
    goal="Goal: cross the slippery ice from S to G without falling into a hole H.",
    describe=_describe,
    is_success=lambda reward, terminated: reward > 0,
    max_steps=100,
)


# The action syntax for language-model agents (see free_text.py).
SYSTEM_PROMPT = gym_text.system_prompt(SPEC)
NO_ACTION_HINT = SYSTEM_PROMPT


def parse_action(text: str) -> str | None:
  return gym_text.parse_action(SPEC, text)


def make_sandbox(max_steps: int | None = None, **unused) -> gym_text.GymTextSandbox:
  del unused
  return gym_text.GymTextSandbox(SPEC, max_steps=max_steps)


def make_tasks(split: str, num: int, seed: int, size: int = 4, is_slippery: bool = True,
               **unused) -> list[gym_text.GymTask]:
  del unused

  def env_kwargs(rng):
    desc = frozen_lake.generate_random_map(size=size, seed=rng.randrange(1 << 30))
    return (("desc", tuple(desc)), ("is_slippery", is_slippery))

  return gym_text.make_split_tasks("frozenlake", split, num, seed, env_kwargs)
