"""Taxi (rainy, fickle passenger) as a text sandbox; see `bpo_jax.sandboxes.gym_text`.

The sandbox contract and the registry's interface: docs/DESIGN.md §4.
"""

from __future__ import annotations

import functools

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


def _task_env_kwargs(rng, is_rainy=True, fickle_passenger=True, **unused):
  del rng, unused
  return (("is_rainy", is_rainy), ("fickle_passenger", fickle_passenger))


SPEC = gym_text.GymTextSpec(
    name="taxi",
    make_env=_make_env,
    actions=("south", "north", "east", "west", "pickup", "dropoff"),
    state_attributes=("s", "lastaction", "taxi_orientation", "fickle_step"),
    goal="Goal: pick up the passenger and drop them off at their destination.",
    describe=_describe,
    is_success=gym_text.success_on_termination,
    max_steps=200,
    task_env_kwargs=_task_env_kwargs,
)


# The registry's interface, and the action syntax for language-model agents (free_text.py).
make_sandbox = functools.partial(gym_text.make_sandbox, SPEC)
make_tasks = functools.partial(gym_text.make_tasks, SPEC)
parse_action = functools.partial(gym_text.parse_action, SPEC)
SYSTEM_PROMPT = NO_ACTION_HINT = gym_text.system_prompt(SPEC)
