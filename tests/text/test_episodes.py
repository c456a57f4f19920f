"""Episodes as token chains: an expert's episode in a BPE tokenizer's chat format."""

import numpy as np
import pytest

from bpo_jax import packing
from bpo_jax import text
from bpo_jax.sandboxes import rooms


@pytest.fixture(scope="module")
def fmt(tmp_path_factory):
  tasks = rooms.make_tasks("train", num=16, seed=0, difficulty=1)
  return text.build_text("rooms", str(tmp_path_factory.mktemp("rooms_text")), tasks,
                         env_options={"difficulty": 1})[1]


def test_bad_inputs_are_named(fmt):
  with pytest.raises(TypeError, match="action must be text"):
    fmt.action_tokens(3)
  with pytest.raises(TypeError, match="observation must be text"):
    fmt.prompt_tokens(None)
  with pytest.raises(ValueError, match="2 actions but 1 observations"):
    text.chain_tree_tokens(fmt, "x", ["go north", "go east"], ["a"])


def test_expert_chain_matches_the_episode(fmt):
  task = rooms.make_tasks("train", num=1, seed=3, difficulty=3)[0]
  actions = rooms.expert_actions(task)
  episode = text.expert_tree_tokens(fmt, rooms.make_sandbox(), task, actions)
  assert episode.done and episode.success
  assert episode.rewards == [0.0] * (len(actions) - 1) + [1.0]
  chain = episode.tokens
  assert isinstance(chain, packing.TreeTokens)
  assert chain.parent.tolist() == list(range(-1, len(actions) - 1))
  assert chain.prompt.tolist() == fmt.prompt_tokens(episode.first_observation)
  for i, action in enumerate(actions):
    assert chain.action_tokens[i].tolist() == fmt.action_tokens(action)
    assert chain.action_logprobs[i].tolist() == [0.0] * len(chain.action_tokens[i])
  for i, obs in enumerate(episode.observations[:-1]):
    assert chain.observation_tokens[i].tolist() == fmt.observation_tokens(obs)
  assert chain.observation_tokens[-1].size == 0
  # The chain's one path is the whole episode: prompt, then action/observation alternating.
  expected = list(chain.prompt)
  for i in range(len(actions)):
    expected += list(chain.action_tokens[i]) + list(chain.observation_tokens[i])
  assert chain.num_unique_tokens() == len(expected)
  row = packing.pack_tree(chain, np.zeros(len(actions)), np.ones(len(actions)))
  assert row.tokens == [int(x) for x in expected]


def test_expert_chain_stops_when_the_episode_ends(fmt):
  task = rooms.make_tasks("train", num=1, seed=1, difficulty=1)[0]
  actions = rooms.expert_actions(task)
  episode = text.expert_tree_tokens(fmt, rooms.make_sandbox(), task,
                                    actions + ["go north"])
  assert episode.actions == actions and episode.tokens.num_nodes == len(actions)
  with pytest.raises(ValueError, match="at least one action"):
    text.expert_tree_tokens(fmt, rooms.make_sandbox(), task, [])
