"""The conversation format: exact token layouts, action round trips, expert chains."""

import numpy as np
import pytest

from bpo_jax import agent_format
from bpo_jax import packing
from bpo_jax.sandboxes import rooms


@pytest.fixture(scope="module")
def tokenizer():
  return agent_format.WordTokenizer(rooms.vocabulary())


@pytest.fixture(scope="module")
def fmt(tokenizer):
  return agent_format.AgentFormat.for_word_tokenizer(tokenizer)


def test_word_tokenizer_ids_and_round_trip():
  tok = agent_format.WordTokenizer(["go", "north", ".", "one", "-", "way"])
  assert tok.vocab_size == 12
  assert tok.encode("go north.") == [6, 7, 8]
  assert tok.encode("go south") == [6, 1]  # unknown word -> <unk> = 1
  assert tok.decode([6, 7, 8]) == "go north."
  assert tok.decode([9, 10, 11, 0]) == "one-way"  # pad skipped, hyphen glued
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.decode([12])
  with pytest.raises(ValueError, match="duplicate words"):
    agent_format.WordTokenizer(["go", "go"])
  with pytest.raises(ValueError, match="clash"):
    agent_format.WordTokenizer(["<stop>"])


def test_layout_is_exact(fmt, tokenizer):
  t = tokenizer.token_id
  assert fmt.prompt_tokens("You see nothing.") == [
      t("<bos>"), t("<obs>"), t("You"), t("see"), t("nothing"), t("."), t("<act>")]
  assert fmt.action_tokens("take red key") == [t("take"), t("red"), t("key"), t("<stop>")]
  assert fmt.observation_tokens("You go north.") == [
      t("<obs>"), t("You"), t("go"), t("north"), t("."), t("<act>")]
  assert fmt.observation_tokens("You won!", done=True) == []
  assert fmt.stop_token_ids == (t("<stop>"),)


def test_decode_action_cuts_at_stop(fmt, tokenizer):
  t = tokenizer.token_id
  assert fmt.decode_action([t("go"), t("east"), t("<stop>"), t("north")]) == "go east"
  assert fmt.decode_action([t("go"), t("east")]) == "go east"  # cut by the token limit
  assert fmt.decode_action([t("<stop>")]) == ""
  for action in ["go north", "take red key", "open blue door", "put apple in box"]:
    assert fmt.decode_action(fmt.action_tokens(action)) == action


def test_observation_cut_keeps_markers(tokenizer):
  fmt = agent_format.AgentFormat.for_word_tokenizer(tokenizer, max_observation_tokens=2)
  t = tokenizer.token_id
  assert fmt.observation_tokens("You go north.") == [t("<obs>"), t("You"), t("go"), t("<act>")]
  with pytest.raises(ValueError, match="max_observation_tokens"):
    agent_format.AgentFormat.for_word_tokenizer(tokenizer, max_observation_tokens=-1)


def test_bad_inputs_are_named(fmt):
  with pytest.raises(TypeError, match="action must be text"):
    fmt.action_tokens(3)
  with pytest.raises(TypeError, match="observation must be text"):
    fmt.prompt_tokens(None)
  with pytest.raises(ValueError, match="2 actions but 1 observations"):
    agent_format.chain_tree_tokens(fmt, "x", ["go north", "go east"], ["a"])


def test_expert_chain_matches_the_episode(fmt):
  task = rooms.make_tasks("train", num=1, seed=3, difficulty=3)[0]
  actions = rooms.expert_actions(task)
  episode = agent_format.expert_tree_tokens(fmt, rooms.make_sandbox(), task, actions)
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
  episode = agent_format.expert_tree_tokens(fmt, rooms.make_sandbox(), task,
                                            actions + ["go north"])
  assert episode.actions == actions and episode.tokens.num_nodes == len(actions)
  with pytest.raises(ValueError, match="at least one action"):
    agent_format.expert_tree_tokens(fmt, rooms.make_sandbox(), task, [])


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_tokenizer(template=CHATML):
  """A word-level Hugging Face tokenizer with ChatML special tokens and a ChatML template."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  words = ["<unk>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "You", "are",
           "an", "agent", "see", "nothing", "take", "key", "go", "north", "won", ".", "!"]
  core = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  core.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
      tokenizers.pre_tokenizers.WhitespaceSplit(), tokenizers.pre_tokenizers.Punctuation()])
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=core, unk_token="<unk>",
      additional_special_tokens=["<|im_start|>", "<|im_end|>"])
  tok.chat_template = template
  return tok


def test_chat_template_layout_matches_the_rendered_conversation():
  tok = chat_tokenizer()
  fmt = agent_format.AgentFormat.for_chat_template(tok, system_prompt="You are an agent.")
  ids = tok.convert_tokens_to_ids
  assert fmt.stop_token_id == ids("<|im_end|>")
  assert fmt.prompt_prefix == tuple(ids(["<|im_start|>", "system", "You", "are", "an", "agent",
                                         ".", "<|im_end|>", "<|im_start|>", "user"]))
  assert fmt.action_cue == tuple(ids(["<|im_end|>", "<|im_start|>", "assistant"]))
  assert fmt.observation_prefix == tuple(ids(["<|im_start|>", "user"]))
  # A whole episode in the format equals the template's own rendering, token for token.
  episode = fmt.prompt_tokens("You see nothing.") + fmt.action_tokens("take key")
  episode += fmt.observation_tokens("You see key.") + fmt.action_tokens("go north")
  messages = [{"role": "system", "content": "You are an agent."},
              {"role": "user", "content": "You see nothing."},
              {"role": "assistant", "content": "take key"},
              {"role": "user", "content": "You see key."},
              {"role": "assistant", "content": "go north"}]
  rendered = tok.apply_chat_template(messages, tokenize=False)
  assert episode == tok.encode(rendered, add_special_tokens=False)
  assert fmt.decode_action(fmt.action_tokens("take key")) == "take key"
  assert fmt.decode_action(ids(["go", "north", "<|im_end|>", "key"])) == "go north"


def test_chat_template_without_assistant_turns_is_rejected():
  tok = chat_tokenizer("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}"
                       "{% endif %}{% endfor %}")
  with pytest.raises(ValueError, match="user/assistant/user"):
    agent_format.AgentFormat.for_chat_template(tok)
