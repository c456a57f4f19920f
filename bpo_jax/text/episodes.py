"""Episodes as token chains: how an expert's (or any fixed) episode becomes `packing.TreeTokens`.

Rollout and supervised warm start both lay episodes out in the chat format (`chat.py`), so the
policy is trained on exactly the token layout it samples in. A path through a tree is
`prompt, action_1, observation_1, action_2, observation_2, ...`, which is the
`packing.TreeTokens` layout (a node's segment is its action tokens followed by the observation
tokens the sandbox returned). The observation after the last step of an episode (done) is never
read by the policy, so its tokens are empty; its text is kept for display.

    fmt = ChatFormat.from_tokenizer(tokenizer, system_prompt=syntax.system_prompt)
    episode = expert_tree_tokens(fmt, sandbox, task, sandbox.expert_actions())
    episode.tokens.num_nodes == len(episode.actions)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from bpo_jax import packing
from bpo_jax.text.chat import ChatFormat


def chain_tree_tokens(fmt: ChatFormat, first_observation: str, actions: Sequence[str],
                      observations: Sequence[str], done: bool = True,
                      action_logprobs: Sequence[Sequence[float]] | None = None
                      ) -> packing.TreeTokens:
  """One episode as a chain-shaped `TreeTokens` (node i's parent is i - 1).

  Args:
    fmt: the conversation format.
    first_observation: what `reset` returned.
    actions: the action texts, in order.
    observations: the observation after each action (same length as `actions`).
    done: the last action ended the episode (its observation tokens are then empty).
    action_logprobs: per action, the behaviour logprob of each token; zeros when not given
      (e.g. expert actions, which a supervised loss does not weight by).

  Example:
    chain_tree_tokens(fmt, "Goal: ...", ["take apple"], ["You won!"]).num_nodes == 1
  """
  if len(actions) != len(observations):
    raise ValueError(f"{len(actions)} actions but {len(observations)} observations")
  action_tokens = [np.asarray(fmt.action_tokens(a), np.int32) for a in actions]
  if action_logprobs is None:
    logprobs = [np.zeros(len(t), np.float32) for t in action_tokens]
  else:
    if len(action_logprobs) != len(actions):
      raise ValueError(f"{len(action_logprobs)} logprob lists for {len(actions)} actions")
    logprobs = [np.asarray(lp, np.float32) for lp in action_logprobs]
  last = len(actions) - 1
  observation_tokens = [
      np.asarray(fmt.observation_tokens(o, done=done and i == last), np.int32)
      for i, o in enumerate(observations)]
  return packing.TreeTokens(prompt=np.asarray(fmt.prompt_tokens(first_observation), np.int32),
                            parent=np.arange(len(actions), dtype=np.int32) - 1,
                            action_tokens=action_tokens, action_logprobs=logprobs,
                            observation_tokens=observation_tokens)


@dataclasses.dataclass
class ExpertEpisode:
  """An expert's episode played in a sandbox: its tokens, texts and outcome."""

  tokens: packing.TreeTokens
  first_observation: str
  actions: list[str]
  observations: list[str]
  rewards: list[float]
  done: bool
  success: bool


def expert_tree_tokens(fmt: ChatFormat, sandbox, task: Any, actions: Sequence[str]
                       ) -> ExpertEpisode:
  """Plays `actions` in `sandbox` from `task` and returns the episode as a chain of tokens.

  Stops early if the episode ends before the actions run out (the rest are dropped). Raises
  ValueError if `actions` is empty.
  """
  if not actions:
    raise ValueError("expert_tree_tokens needs at least one action")
  first_observation = sandbox.reset(task)
  taken, observations, rewards = [], [], []
  done = success = False
  for action in actions:
    step = sandbox.step(action)
    taken.append(action)
    observations.append(step.observation)
    rewards.append(float(step.reward))
    if step.done:
      done = True
      success = bool(step.info.get("success", False))
      break
  tokens = chain_tree_tokens(fmt, first_observation, taken, observations, done=done)
  return ExpertEpisode(tokens=tokens, first_observation=first_observation, actions=taken,
                       observations=observations, rewards=rewards, done=done, success=success)
