"""Blackjack as a text sandbox; see `bpo_jax.sandboxes.gym_text`.

The deck is drawn from the environment's generator, so the snapshot's RNG state decides the
next card: restoring it replays the same cards.
"""

from __future__ import annotations

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


SPEC = gym_text.GymTextSpec(
    name="blackjack",
    make_env=_make_env,
    actions=("stick", "hit"),
    state_attributes=("player", "dealer"),
    goal="Goal: beat the dealer without going over 21. The dealer's first card is shown.",
    describe=_describe,
    is_success=lambda reward, terminated: reward > 0,
    max_steps=20,
)


# The action syntax for language-model agents (see free_text.py).
SYSTEM_PROMPT = gym_text.system_prompt(SPEC)
NO_ACTION_HINT = SYSTEM_PROMPT


def parse_action(text: str) -> str | None:
  return gym_text.parse_action(SPEC, text)


def make_sandbox(max_steps: int | None = None, **unused) -> gym_text.GymTextSandbox:
  del unused
  return gym_text.GymTextSandbox(SPEC, max_steps=max_steps)


def make_tasks(split: str, num: int, seed: int, natural: bool = False, sab: bool = False,
               **unused) -> list[gym_text.GymTask]:
  del unused
  kwargs = (("natural", natural), ("sab", sab))
  return gym_text.make_split_tasks("blackjack", split, num, seed, lambda rng: kwargs)
