"""A run's text path in one call: the tokenizer and the chat format the policy speaks in.

    tokenizer, fmt = build_text("webshop", workdir, train_tasks, env_options=options,
                                max_observation_tokens=384)

* With `checkpoint=DIR` (a Hugging Face model directory), the checkpoint's own tokenizer files,
  chat template and generation_config.json are used.
* Otherwise a byte-level BPE tokenizer is trained on the environment's text (`corpus.py`,
  `bpe.py`), with one token for each string the environment names as atomic (its
  `atomic_strings`, e.g. a shop's product ids; none when it names more than `bpe.MAX_ATOMIC`),
  and saved to `<workdir>/tokenizer`; a run that resumes finds it there and loads it (it is
  never retrained, so the ids stay those the checkpoints were trained with).

The system turn is the environment's `SYSTEM_PROMPT` (its action syntax; `system_prompt=""`
leaves the system turn out). A directory whose tokenizer cannot serve the chat format (no
tokenizer files, no chat template, a template without assistant turns, an unreadable
generation_config.json) raises `TokenizerError`, a ValueError with one line naming the directory
and the problem.

With several processes, one trains and saves while the others wait, then all load:

    if is_primary:
      ensure_bpe_tokenizer(env_name, workdir, tasks, env_options=options)
    barrier()
    tokenizer, fmt = load_format(os.path.join(workdir, TOKENIZER_DIR), system_prompt, ...)
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping, Sequence

from bpo_jax.sandboxes import registry
from bpo_jax.text import bpe
from bpo_jax.text import corpus
from bpo_jax.text.chat import ChatFormat, TokenizerError

TOKENIZER_DIR = "tokenizer"
GENERATION_CONFIG = "generation_config.json"
# Files of which a Hugging Face tokenizer directory holds at least one.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def read_eos_token_ids(directory: str) -> tuple[int, ...]:
  """generation_config.json's `eos_token_id` (an int or a list of ints); () without the file
  or the key."""
  path = os.path.join(directory, GENERATION_CONFIG)
  if not os.path.isfile(path):
    return ()
  try:
    with open(path, encoding="utf-8") as f:
      eos = json.load(f).get("eos_token_id")
  except (OSError, ValueError, AttributeError) as e:
    raise TokenizerError(f"{path}: not a JSON object ({e})".replace("\n", " ")) from None
  if eos is None:
    return ()
  ids = [eos] if isinstance(eos, int) else eos
  if (not isinstance(ids, list) or not ids
      or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
    raise TokenizerError(f"{path}: eos_token_id must be a token id or a list of them, got "
                         f"{eos!r}")
  return tuple(ids)


def _tokenizer_class(directory: str) -> str | None:
  """tokenizer_config.json's `tokenizer_class`, None where it names none (or does not read)."""
  try:
    with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
      value = json.load(f).get("tokenizer_class")
  except (OSError, ValueError, AttributeError):
    return None
  return value if isinstance(value, str) else None


def load_tokenizer(directory: str):
  """The Hugging Face tokenizer saved in `directory` (offline).

  `transformers.AutoTokenizer` picks the class that tokenizer_config.json names; when that is
  `PreTrainedTokenizerFast` (the from-scratch tokenizers', Llama 3's) the class is loaded
  directly, the same tokenizer without the import of the auto classes (and of PyTorch with
  them: about 3 s of every run's start).

  Raises:
    TokenizerError: no such directory, no tokenizer files in it, or files that do not load.
  """
  import transformers  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(directory):
    raise TokenizerError(f"{directory}: no such tokenizer directory")
  if not any(os.path.isfile(os.path.join(directory, f)) for f in _TOKENIZER_FILES):
    raise TokenizerError(f"{directory}: no tokenizer files (one of {', '.join(_TOKENIZER_FILES)})")
  try:
    if _tokenizer_class(directory) == "PreTrainedTokenizerFast":
      return transformers.PreTrainedTokenizerFast.from_pretrained(directory,
                                                                  local_files_only=True)
    return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
  except Exception as e:  # pylint: disable=broad-except
    reason = f"{type(e).__name__}: {e}".splitlines()[0]
    raise TokenizerError(f"{directory}: the tokenizer does not load ({reason})") from None


def load_format(directory: str, system_prompt: str | None = None,
                max_observation_tokens: int | None = None) -> tuple[Any, ChatFormat]:
  """(tokenizer, chat format) from a tokenizer directory: its tokenizer, its chat template, and
  generation_config.json's eos ids as extra stop tokens.

  Raises:
    TokenizerError: see `load_tokenizer` and `ChatFormat.from_tokenizer`; the message names
      `directory`.
  """
  tokenizer = load_tokenizer(directory)
  try:
    fmt = ChatFormat.from_tokenizer(tokenizer, system_prompt=system_prompt,
                                    eos_token_ids=read_eos_token_ids(directory),
                                    max_observation_tokens=max_observation_tokens)
  except TokenizerError as e:
    message = str(e)
    raise TokenizerError(message if message.startswith(directory) else
                         f"{directory}: {message}") from None
  return tokenizer, fmt


def ensure_bpe_tokenizer(env_name: str, workdir: str, tasks: Sequence[Any],
                         env_options: Mapping[str, Any] | None = None,
                         vocab_size: int = bpe.DEFAULT_VOCAB_SIZE,
                         system_prompt: str | None = None,
                         max_tasks: int = corpus.DEFAULT_MAX_TASKS) -> str:
  """`<workdir>/tokenizer`, trained on `tasks`' episodes and saved there unless it exists.

  The environment's atomic strings (`corpus.atomic_strings`) get a token each after the
  `vocab_size` learnt ones, unless there are more than `bpe.MAX_ATOMIC` of them (then none, and
  a warning says so). An existing tokenizer is kept as it is (a resumed run): `vocab_size` and
  the tasks then do not matter. Returns the directory.
  """
  directory = os.path.join(workdir, TOKENIZER_DIR)
  if os.path.isfile(os.path.join(directory, "tokenizer.json")):
    return directory
  texts = corpus.environment_texts(env_name, tasks, env_options, system_prompt=system_prompt,
                                   max_tasks=max_tasks)
  atomic = corpus.atomic_strings(env_name, env_options)
  if len(set(atomic)) > bpe.MAX_ATOMIC:
    logging.warning("%s names %d atomic strings, more than bpe.MAX_ATOMIC = %d: the tokenizer "
                    "keeps none of them whole", env_name, len(set(atomic)), bpe.MAX_ATOMIC)
    atomic = []
  bpe.save_bpe(bpe.train_bpe(texts, vocab_size, atomic=atomic), directory)
  return directory


def build_text(env_name: str, workdir: str | None, tasks: Sequence[Any], *,
               env_options: Mapping[str, Any] | None = None, checkpoint: str | None = None,
               vocab_size: int = bpe.DEFAULT_VOCAB_SIZE,
               max_observation_tokens: int | None = None,
               system_prompt: str | None = None) -> tuple[Any, ChatFormat]:
  """The tokenizer and chat format of a run (see the module docstring).

  Args:
    env_name: the registered environment (its system prompt and, from scratch, its text).
    workdir: the run's directory; from scratch the tokenizer lives in `<workdir>/tokenizer`.
    tasks: the training tasks whose expert episodes the tokenizer learns from (from scratch).
    env_options: the environment's `make_sandbox` keyword arguments.
    checkpoint: a Hugging Face model directory whose tokenizer to use; None or "": from scratch.
    vocab_size: the from-scratch tokenizer's size (at most; a small corpus may give fewer).
    max_observation_tokens: cut observations to this many tokens (None: no limit).
    system_prompt: the system turn; None: the environment's `SYSTEM_PROMPT`; "": none.

  Raises:
    TokenizerError: the tokenizer cannot serve the chat format (one line naming the directory).
  """
  if system_prompt is None:
    system_prompt = registry.get_action_syntax(env_name).system_prompt
  if checkpoint:
    directory = checkpoint
  else:
    if not workdir:
      raise ValueError("build_text needs a workdir to keep a from-scratch tokenizer in")
    directory = ensure_bpe_tokenizer(env_name, workdir, tasks, env_options, vocab_size,
                                     system_prompt)
  return load_format(directory, system_prompt or None, max_observation_tokens)
