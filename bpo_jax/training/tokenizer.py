"""A word-level tokenizer for from-scratch models, saved and loaded in Hugging Face format.

The ids are those of `agent_format.WordTokenizer` over the same words (the special tokens first,
then the words in the order given), so a model trained with either sees the same tokens. The
tokenizer is built with the `tokenizers` library (a `WordLevel` model; words split as
`agent_format.split_words` splits them) and wrapped as a `PreTrainedTokenizerFast`, so a saved
directory loads with `transformers.AutoTokenizer.from_pretrained(directory)`.

Example:

  save_word_tokenizer(rooms.vocabulary(), "workdir/tokenizer")
  tokenizer = load_word_tokenizer("workdir/tokenizer")   # a WordTokenizerAdapter
  fmt = agent_format.AgentFormat.for_word_tokenizer(tokenizer)
  tokenizer.encode("go north.")                           # same ids as WordTokenizer
"""

from __future__ import annotations

import os
from typing import Sequence

from bpo_jax import agent_format

# A word is a run of letters, a run of digits or one other non-space character, exactly as
# `agent_format.split_words` has it.
_WORD_PATTERN = r"[A-Za-z]+|[0-9]+|[^A-Za-z0-9\s]"


def build_word_tokenizer(words: Sequence[str]):
  """A `PreTrainedTokenizerFast` over `agent_format.SPECIAL_TOKENS + words`.

  Raises:
    ValueError: duplicate words, or words that clash with the special tokens.
  """
  # Imported here: the tokenizer is only needed by the experiments, not by the pure core.
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  # WordTokenizer checks duplicates and clashes and fixes the id order.
  reference = agent_format.WordTokenizer(words)
  vocab = {word: i for i, word in enumerate(reference.words)}
  core = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=agent_format.UNK))
  # Whitespace first, then each piece into letter runs, digit runs and single marks; every
  # non-space character is inside some match, so nothing is dropped.
  core.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.WhitespaceSplit(),
      pre_tokenizers.Split(tokenizers.Regex(_WORD_PATTERN), behavior="isolated"),
  ])
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=core, pad_token=agent_format.PAD, unk_token=agent_format.UNK,
      bos_token=agent_format.BOS, eos_token=agent_format.STOP,
      additional_special_tokens=[agent_format.OBSERVATION, agent_format.ACTION])


def save_word_tokenizer(words: Sequence[str], directory: str):
  """Builds the tokenizer of `words` and saves it to `directory` (HF format); returns it."""
  hf_tokenizer = build_word_tokenizer(words)
  os.makedirs(directory, exist_ok=True)
  hf_tokenizer.save_pretrained(directory)
  return hf_tokenizer


class WordTokenizerAdapter:
  """A Hugging Face tokenizer behind the `agent_format.Tokenizer` protocol.

  `encode` adds no special tokens; `decode` skips `<pad>` and joins words as
  `agent_format.join_words` does, so encode/decode agree with `agent_format.WordTokenizer`.
  `token_id` lets `AgentFormat.for_word_tokenizer` find the marker tokens.
  """

  def __init__(self, hf_tokenizer):
    self.hf_tokenizer = hf_tokenizer
    self._vocab = hf_tokenizer.get_vocab()
    missing = [t for t in agent_format.SPECIAL_TOKENS if t not in self._vocab]
    if missing:
      raise ValueError(f"the tokenizer lacks the special tokens {missing}")
    self._words = [None] * len(self._vocab)
    for word, i in self._vocab.items():
      self._words[i] = word

  @property
  def vocab_size(self) -> int:
    return len(self._vocab)

  def token_id(self, word: str) -> int:
    if word not in self._vocab:
      raise KeyError(f"{word!r} is not in the vocabulary")
    return self._vocab[word]

  def encode(self, text: str) -> list[int]:
    return list(self.hf_tokenizer.encode(text, add_special_tokens=False))

  def decode(self, ids: Sequence[int]) -> str:
    words = []
    for i in ids:
      i = int(i)
      if not 0 <= i < len(self._words):
        raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self._words)})")
      if self._words[i] != agent_format.PAD:
        words.append(self._words[i])
    return agent_format.join_words(words)


def load_word_tokenizer(directory: str) -> WordTokenizerAdapter:
  """Loads a saved word tokenizer with `AutoTokenizer` (offline) and wraps it."""
  import transformers  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"no tokenizer directory at {directory!r}")
  return WordTokenizerAdapter(
      transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True))
