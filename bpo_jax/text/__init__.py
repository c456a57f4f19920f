"""The text path of a language-model agent: tokenizer, chat format, from-scratch BPE.

    chat.py    ChatFormat: an episode as the turns of a tokenizer's chat template, stop ids,
               token budgets; TokenizerError
    bpe.py     a byte-level BPE tokenizer trained on an environment's text, with a ChatML
               template, saved in Hugging Face format
    corpus.py  the environment's text: expert episodes as chat turns
    build.py   build_text: a run's tokenizer and format in one call (a checkpoint's, or a
               from-scratch BPE kept in the workdir)
    episodes.py  an episode as a chain of `packing.TreeTokens` (expert episodes for the warm
               start)

Actions are free text: each environment's system prompt and parser are in `bpo_jax.sandboxes`
(`free_text.py`, `registry.get_action_syntax`). Importing this package imports neither
`tokenizers`, `transformers` nor JAX; the functions that need them import them.
"""

import importlib

from bpo_jax.text.bpe import DEFAULT_VOCAB_SIZE, save_bpe, train_bpe
from bpo_jax.text.build import (TOKENIZER_DIR, build_text, ensure_bpe_tokenizer, load_format,
                                 load_tokenizer)
from bpo_jax.text.chat import ChatFormat, TokenizerError

# episodes.py packs tokens with JAX: its names load on first use (PEP 562), so that reading a
# configuration and its tokenizer does not load JAX.
_EPISODES = ("ExpertEpisode", "chain_tree_tokens", "expert_tree_tokens")


def __getattr__(name):
  if name in _EPISODES or name == "episodes":
    episodes = importlib.import_module("bpo_jax.text.episodes")
    return episodes if name == "episodes" else getattr(episodes, name)
  raise AttributeError(f"module 'bpo_jax.text' has no attribute {name!r}")


__all__ = ["ChatFormat", "DEFAULT_VOCAB_SIZE", "ExpertEpisode", "TOKENIZER_DIR", "TokenizerError",
           "build_text", "chain_tree_tokens", "ensure_bpe_tokenizer", "expert_tree_tokens",
           "load_format", "load_tokenizer", "save_bpe", "train_bpe"]
