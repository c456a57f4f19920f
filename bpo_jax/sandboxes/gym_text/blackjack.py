"""Blackjack as a text sandbox; see `bpo_jax.sandboxes.gym_text`.

The deck is drawn from the environment's generator, so the snapshot's RNG state decides the
next card: restoring it replays the same cards.

The sandbox contract and the registry's interface: docs/DESIGN.md §4.
"""

from __future__ import annotations

import functools

from gymnasium.envs.toy_text import blackjack

from bpo_jax.sandboxes import gym_text


def _make_env(natural=False, sab=False):
  return blackjack.BlackjackEnv(natural=natural, sab=sab)


def _describe(env) -> str:
  total = blackjack.sum_hand(env.player)
  ace = ", with a usable ace" if blackjack.usable_ace(env.player) else ""
  cards = " ".join(str(c) for c in env.player)
  # Only the dealer's first card is face up; the rest would give the outcome away.
  return f"Your cards: {cards} (sum {total}{ace}). The dealer shows {env.dealer[0]}."


def _task_env_kwargs(rng, natural=False, sab=False, **unused):
  del rng, unused
  return (("natural", natural), ("sab", sab))


SPEC = gym_text.GymTextSpec(
    name="blackjack",
    make_env=_make_env,
    actions=("stick", "hit"),
    state_attributes=("player", "dealer"),
    goal="Goal: beat the dealer without going over 21. The dealer's first card is shown.",
    describe=_describe,
    is_success=gym_text.success_on_positive_reward,
    max_steps=20,
    task_env_kwargs=_task_env_kwargs,
)


# The registry's interface, and the action syntax for language-model agents (free_text.py).
make_sandbox = functools.partial(gym_text.make_sandbox, SPEC)
make_tasks = functools.partial(gym_text.make_tasks, SPEC)
parse_action = functools.partial(gym_text.parse_action, SPEC)
SYSTEM_PROMPT = NO_ACTION_HINT = gym_text.system_prompt(SPEC)
