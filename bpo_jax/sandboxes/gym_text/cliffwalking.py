"""CliffWalking (slippery) as a text sandbox; see `bpo_jax.sandboxes.gym_text`."""

from __future__ import annotations

from gymnasium.envs.toy_text import cliffwalking

from bpo_jax.sandboxes import gym_text


def _make_env(is_slippery=True):
  return cliffwalking.CliffWalkingEnv(is_slippery=is_slippery)


def _describe(env) -> str:
  rows, cols = env.shape
  row, col = divmod(int(env.s), cols)
  return (f"Row {row + 1}, column {col + 1} of a {rows} by {cols} grid. The cliff runs along "
          f"row {rows} between columns 2 and {cols - 1}; the goal is row {rows}, column {cols}.")


SPEC = gym_text.GymTextSpec(
    name="cliffwalking",
    make_env=_make_env,
    actions=("up", "right", "down", "left"),
    state_attributes=("s", "lastaction"),
    goal="Goal: walk from the start to the goal without falling off the cliff.",
    describe=_describe,
    is_success=lambda reward, terminated: terminated,
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


def make_tasks(split: str, num: int, seed: int, is_slippery: bool = True,
               **unused) -> list[gym_text.GymTask]:
  del unused
  kwargs = (("is_slippery", is_slippery),)
  return gym_text.make_split_tasks("cliffwalking", split, num, seed, lambda rng: kwargs)
