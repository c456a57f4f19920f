"""The HF-format word tokenizer: the same ids as agent_format.WordTokenizer, loadable offline."""

import random

import pytest
import transformers

from bpo_jax import agent_format
from bpo_jax.sandboxes import rooms
from bpo_jax.training import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("tokenizer"))
  tokenizer_lib.save_word_tokenizer(rooms.vocabulary(), directory)
  return directory


def _episode_texts(num_tasks=6, num_steps=8):
  """First observations, random admissible actions and the observations after them that the
  policy reads (not the final one of an episode), at several levels."""
  texts, rng = [], random.Random(0)
  sandbox = rooms.make_sandbox()
  for difficulty in (1, 3, 5):
    for task in rooms.make_tasks("train", num_tasks, seed=0, difficulty=difficulty):
      texts.append(sandbox.reset(task))
      for _ in range(num_steps):
        actions = sandbox.admissible_actions()
        if not actions:
          break
        action = rng.choice(actions)
        step = sandbox.step(action)
        texts.append(action)
        if step.done:
          break
        texts.append(step.observation)
  return texts


def test_same_ids_and_text_as_word_tokenizer(saved):
  loaded = tokenizer_lib.load_word_tokenizer(saved)
  reference = agent_format.WordTokenizer(rooms.vocabulary())
  assert loaded.vocab_size == reference.vocab_size == len(rooms.vocabulary()) + 6
  texts = _episode_texts()
  assert len(texts) > 50
  for text in texts:
    ids = loaded.encode(text)
    assert ids == reference.encode(text), text
    assert agent_format.UNK not in [reference.words[i] for i in ids], text
    assert loaded.decode(ids) == reference.decode(ids)
  # Unknown words, digits and stray marks map as the reference maps them.
  for text in ("xyzzy 42 go north!", "put  apple\tin   box", "", "#$%"):
    assert loaded.encode(text) == reference.encode(text)


def test_auto_tokenizer_loads_the_directory(saved):
  hf = transformers.AutoTokenizer.from_pretrained(saved, local_files_only=True)
  reference = agent_format.WordTokenizer(rooms.vocabulary())
  assert hf.pad_token_id == reference.token_id(agent_format.PAD) == 0
  assert hf.unk_token_id == reference.token_id(agent_format.UNK) == 1
  assert hf.eos_token_id == reference.token_id(agent_format.STOP)
  assert hf.encode("take red key", add_special_tokens=False) == reference.encode("take red key")


def test_agent_format_over_the_loaded_tokenizer(saved):
  loaded = tokenizer_lib.load_word_tokenizer(saved)
  fmt = agent_format.AgentFormat.for_word_tokenizer(loaded)
  reference = agent_format.AgentFormat.for_word_tokenizer(
      agent_format.WordTokenizer(rooms.vocabulary()))
  assert fmt.stop_token_id == reference.stop_token_id
  assert fmt.prompt_prefix == reference.prompt_prefix
  ids = fmt.action_tokens("put apple in box")
  assert ids == reference.action_tokens("put apple in box")
  assert fmt.decode_action(ids) == "put apple in box"


def test_errors(tmp_path):
  with pytest.raises(ValueError, match="duplicate"):
    tokenizer_lib.build_word_tokenizer(["go", "go"])
  with pytest.raises(ValueError, match="clash"):
    tokenizer_lib.build_word_tokenizer(["go", "<stop>"])
  with pytest.raises(FileNotFoundError, match="no tokenizer directory"):
    tokenizer_lib.load_word_tokenizer(str(tmp_path / "missing"))
