"""A byte-level BPE tokenizer trained from scratch, with a ChatML chat template.

For runs that train a model from scratch (the quickstart), the tokenizer is learnt from the
environment's own text (`corpus.py`) with the `tokenizers` library:

* byte-level: text is UTF-8 bytes mapped to 256 printable symbols (GPT-2's byte-level
  pre-tokenizer and its regular expression), so every string encodes and
  `decode(encode(text)) == text` exactly, spaces and newlines included (no normaliser, no
  clean-up of spaces on decoding);
* BPE merges learnt on the corpus up to `vocab_size` tokens (fewer when the corpus runs out of
  pairs seen at least `min_frequency` times);
* special tokens `<|endoftext|>` (id 0), `<|im_start|>` (1), `<|im_end|>` (2), then the 256
  byte symbols, then the merges;
* the ChatML chat template Qwen2.5 uses, without its default system prompt and tools:

      <|im_start|>system\\n{system prompt}<|im_end|>\\n
      <|im_start|>user\\n{observation}<|im_end|>\\n
      <|im_start|>assistant\\n{action}<|im_end|>\\n ...

  A turn ends with `<|im_end|>` (the tokenizer's eos token), a sequence with `<|endoftext|>`
  (the pad token); generation_config.json lists both as `eos_token_id`.

`save_bpe` writes a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json
with the chat template, generation_config.json) that `transformers.AutoTokenizer` loads. Training
is deterministic (the same texts give byte-identical files), and the files name no library
version.

Atomic strings: an environment can name strings of its text that a policy must copy whole, such
as the product ids of a shop (`corpus.atomic_strings`). `train_bpe(texts, atomic=names)` gives
each one token of its own, added after the learnt vocabulary (ids from the learnt size on, not
special: `decode(..., skip_special_tokens=True)` keeps them). Why: a policy that clicks
`click[B0B34SD43W]` must reproduce an id shown on the page. Byte-level BPE cuts such an id into
k pieces (5-10, 9.3 on average, in `webshop_cpu.py`'s shop), and the model has to copy all k in
order, each copy one attention lookup that finds the right position (the piece after the one
just written, within the right id) and returns its token: the reply is right with probability
p^k if each lookup succeeds with p (0.9^9 = 0.39). As one token e_i, the id is copied by one
lookup, and the copy itself is easy with tied embeddings: attention moves e_i (through its value
and output maps) into the residual stream, and the output logit of token j is <h, e_j>; for
embeddings drawn independently with variance s^2 per coordinate, <e_i, e_i> ~ d s^2 while
<e_i, e_j> (j != i) has standard deviation sqrt(d) s^2, so the id that was moved outscores the
others by sqrt(d) standard deviations (11 at d = 128) without id-specific training: a copy rule
learnt on some ids carries over to ids the demonstrations never click.

An atomic string matches only as a whole word (`single_word`: no letter, digit or `_` touching it
on either side), so a longer word that contains one still encodes by its bytes; the strings are
cut out of the training texts before counting, so no merge spans one; and the round trip stays
exact (an added token decodes to its own text, whitespace included). Their embedding rows cost
`hidden_size` parameters each (128 x 200 ids = 26k for `webshop_cpu.py`), so `MAX_ATOMIC` bounds
how many a tokenizer takes.

Why the default of 1024 tokens: the quickstart's decoder has hidden size 128, so each embedding
(input and output) costs 128 parameters a token next to the ~0.6M of its layers, and the corpus
decides how many tokens are worth having. Measured on the configs' training tasks (mean tokens
of an expert episode rendered as chat turns, at 512 / 1024 / 2048): WebShop 1493 / 1094 / 1014,
SWE 930 / 632 / 626, ALFWorld 444 / 374 / 374, TextWorld 449 / 396 / 396; rooms runs out of
pairs at 464 tokens whatever the size. 512 leaves WebShop's and SWE's episodes a third longer;
2048 shortens them by 7% at most, for twice the embedding parameters.

    core = train_bpe(texts, vocab_size=1024, atomic=["B0B34SD43W", "B07XKQ2R1M"])
    save_bpe(core, "workdir/tokenizer")
    tok = transformers.AutoTokenizer.from_pretrained("workdir/tokenizer")
    tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Iterable, Mapping, Sequence

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
DEFAULT_VOCAB_SIZE = 1024
# Most atomic strings a tokenizer adds (see the module docstring).
MAX_ATOMIC = 4096
# Special tokens and byte symbols come before any merge.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

_SPECIAL_PATTERN = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))


def chatml_text(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
  """What `CHATML_TEMPLATE` renders for `messages` (tests check the two agree).

  >>> chatml_text([{"role": "user", "content": "hi"}], add_generation_prompt=True)
  '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
  """
  text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
  return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def _split_pattern(atomic: Sequence[str]) -> re.Pattern:
  """Special tokens anywhere, atomic strings where they stand as whole words (longest first)."""
  parts = [_SPECIAL_PATTERN.pattern]
  if atomic:
    names = "|".join(re.escape(a) for a in sorted(atomic, key=lambda a: (-len(a), a)))
    parts.append(rf"(?<!\w)(?:{names})(?!\w)")
  return re.compile("|".join(parts))


def _text_pieces(texts: Iterable[str], atomic: Sequence[str] = ()) -> Iterable[str]:
  """The stretches of each text between special tokens and atomic strings (BPE learns no
  merges across them)."""
  pattern = _split_pattern(atomic)
  for text in texts:
    if not isinstance(text, str):
      raise TypeError(f"training texts must be str, got {type(text).__name__}")
    yield from (piece for piece in pattern.split(text) if piece)


def check_atomic(atomic: Iterable[str]) -> list[str]:
  """The atomic strings in their order, repeats dropped.

  Raises:
    ValueError: more than `MAX_ATOMIC`, or a string that is empty, is not str, has whitespace
      at either end or holds a special token.
  """
  out = list(dict.fromkeys(atomic))
  for name in out:
    if not isinstance(name, str) or not name or name != name.strip():
      raise ValueError(f"an atomic string must be non-empty text without whitespace at its "
                       f"ends, got {name!r}")
    if _SPECIAL_PATTERN.search(name):
      raise ValueError(f"an atomic string must not hold a special token, got {name!r}")
  if len(out) > MAX_ATOMIC:
    raise ValueError(f"{len(out)} atomic strings, more than MAX_ATOMIC = {MAX_ATOMIC}")
  return out


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE,
              min_frequency: int = 2, atomic: Iterable[str] = ()):
  """A byte-level BPE `tokenizers.Tokenizer` learnt from `texts` (see the module docstring).

  Special tokens and the `atomic` strings in the texts are cut out before counting, so no merge
  spans one. `vocab_size` bounds the learnt vocabulary; each atomic string then gets a token of
  its own after it (one that is already a learnt token keeps its id), in the order given.

  Raises:
    ValueError: `vocab_size` below `MIN_VOCAB_SIZE` (259), `min_frequency` below 1, or atomic
      strings that `check_atomic` refuses.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
    raise ValueError(f"vocab_size must be an integer >= {MIN_VOCAB_SIZE} (3 special tokens and "
                     f"256 bytes), got {vocab_size!r}")
  if not isinstance(min_frequency, int) or min_frequency < 1:
    raise ValueError(f"min_frequency must be an integer >= 1, got {min_frequency!r}")
  core = tokenizers.Tokenizer(models.BPE())
  core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  core.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  atomic = check_atomic(atomic)
  core.train_from_iterator(_text_pieces(texts, atomic), trainer=trainer)
  if atomic:
    core.add_tokens([tokenizers.AddedToken(name, single_word=True, lstrip=False, rstrip=False,
                                           normalized=False, special=False)
                     for name in atomic])
  return core


def tokenizer_config() -> dict:
  """tokenizer_config.json of a `train_bpe` tokenizer: the generic fast tokenizer class, the
  special tokens, no clean-up of spaces on decoding, and the chat template."""
  return {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "bos_token": None,
      "eos_token": IM_END,
      "pad_token": END_OF_TEXT,
      "unk_token": None,
      "additional_special_tokens": [IM_START, IM_END],
      "clean_up_tokenization_spaces": False,
      "chat_template": CHATML_TEMPLATE,
  }


def generation_config(core) -> dict:
  """generation_config.json: a turn ends with `<|im_end|>`, a sequence with `<|endoftext|>`."""
  return {"eos_token_id": [core.token_to_id(IM_END), core.token_to_id(END_OF_TEXT)],
          "pad_token_id": core.token_to_id(END_OF_TEXT)}


def save_bpe(core, directory: str) -> str:
  """Writes `core` as a Hugging Face tokenizer directory and returns its path.

  The files are written to a temporary directory beside `directory` and moved into place, so
  an interrupted save leaves no half-written tokenizer. An existing `directory` is replaced.
  """
  directory = os.path.abspath(directory)
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".tokenizer-", dir=parent)
  try:
    core.save(os.path.join(staging, "tokenizer.json"))
    for name, content in (("tokenizer_config.json", tokenizer_config()),
                          ("generation_config.json", generation_config(core))):
      with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, sort_keys=True)
        f.write("\n")
    if os.path.isdir(directory):
      shutil.rmtree(directory)
    os.replace(staging, directory)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return directory
