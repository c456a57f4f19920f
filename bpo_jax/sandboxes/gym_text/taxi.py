"""Taxi (rainy, fickle passenger) as a text sandbox; see `bpo_jax.sandboxes.gym_text`."""

from __future__ import annotations

from gymnasium.envs.toy_text import taxi

from bpo_jax.sandboxes import gym_text

_STOPS = ("red", "green", "yellow", "blue")


def _make_env(is_rainy=True, fickle_passenger=True):
  return taxi.TaxiEnv(is_rainy=is_rainy, fickle_passenger=fickle_passenger)


def _describe(env) -> str:
  row, col, passenger, destination = (int(v) for v in env.decode(int(env.s)))
  where = "in the taxi" if passenger == 4 else f"at the {_STOPS[passenger]} stop"
  stops = ", ".join(f"{name} at row {r + 1} column {c + 1}"
                    for name, (r, c) in zip(_STOPS, env.locs))
  return (f"Taxi at row {row + 1}, column {col + 1}. Passenger {where}, going to the "
          f"{_STOPS[destination]} stop. Stops: {stops}.")


SPEC = gym_text.GymTextSpec(
    name="taxi",
    make_env=_make_env,
    actions=("south", "north", "east", "west", "pickup", "dropoff"),
    state_attributes=("s", "lastaction", "taxi_orientation", "fickle_step"),
    goal="Goal: pick up the passenger and drop them off at their destination.",
    describe=_describe,
    is_success=lambda reward, terminated: terminated,
    max_steps=200,
)


# The action syntax for language-model agents (see free_text.py).
SYSTEM_PROMPT = gym_text.system_prompt(SPEC)
NO_ACTION_HINT = SYSTEM_PROMPT


def parse_action(text: str) -> str | None:
  return gym_text.parse_action(SPEC, text)


def make_sandbox(max_steps: int | None = None, **unused) -> gym_text.GymTextSandbox:
  del unused
  return gym_text.GymTextSandbox(SPEC, max_steps=max_steps)


def make_tasks(split: str, num: int, seed: int, is_rainy: bool = True,
               fickle_passenger: bool = True, **unused) -> list[gym_text.GymTask]:
  del unused
  kwargs = (("is_rainy", is_rainy), ("fickle_passenger", fickle_passenger))
  return gym_text.make_split_tasks("taxi", split, num, seed, lambda rng: kwargs)
