"""Small BPE tokenizers shaped like the Qwen2.5 and Llama 3.1 families', for tests (no downloads).

Each carries its family's special tokens, eos/bos/pad tokens, generation_config.json
`eos_token_id` list and pre-tokenizer (the family's splitting expression, then byte-level
symbols), with merges learnt on whatever text the test gives; the chat template is passed in
(tests keep the families' templates in tests/fixtures/chat_templates/). The families' facts:

    family   special tokens (in id order)                      eos (turn)   generation eos
    qwen2    <|endoftext|> <|im_start|> <|im_end|>              <|im_end|>   <|im_end|>, <|endoftext|>
    llama3   <|begin_of_text|> <|end_of_text|> <|start_header_id|> <|end_header_id|>
             <|eom_id|> <|eot_id|>                              <|eot_id|>   <|end_of_text|>,
                                                                             <|eom_id|>, <|eot_id|>

Qwen2's tokenizer also normalises to NFC; Llama 3's groups digits by three, Qwen2's splits them.

    tok = family_tokenizer("qwen2", texts, template_text)
    save_family_tokenizer(tok, "qwen2", directory)   # + generation_config.json
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


@dataclasses.dataclass(frozen=True)
class Family:
  special_tokens: tuple[str, ...]
  eos_token: str
  bos_token: str | None
  pad_token: str | None
  generation_eos: tuple[str, ...]
  split_pattern: str
  nfc: bool


FAMILIES = {
    "qwen2": Family(
        special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        eos_token="<|im_end|>", bos_token=None, pad_token="<|endoftext|>",
        generation_eos=("<|im_end|>", "<|endoftext|>"),
        split_pattern=_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _REST, nfc=True),
    "llama3": Family(
        special_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                        "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>"),
        eos_token="<|eot_id|>", bos_token="<|begin_of_text|>", pad_token=None,
        generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        split_pattern=_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _REST, nfc=False),
}


def family_tokenizer(family: str, texts: Iterable[str], chat_template: str,
                     vocab_size: int = 600):
  """A `transformers` fast tokenizer of `family`'s shape with BPE merges learnt on `texts`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  spec = FAMILIES[family]
  core = tokenizers.Tokenizer(models.BPE())
  if spec.nfc:
    core.normalizer = normalizers.NFC()
  core.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(spec.split_pattern), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  core.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(spec.special_tokens),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  core.train_from_iterator(list(texts), trainer=trainer)
  tokenizer = transformers.PreTrainedTokenizerFast(
      tokenizer_object=core, eos_token=spec.eos_token, bos_token=spec.bos_token,
      pad_token=spec.pad_token, additional_special_tokens=list(spec.special_tokens),
      clean_up_tokenization_spaces=False)
  tokenizer.chat_template = chat_template
  return tokenizer


def generation_eos_ids(tokenizer, family: str) -> list[int]:
  return [tokenizer.convert_tokens_to_ids(t) for t in FAMILIES[family].generation_eos]


def save_family_tokenizer(tokenizer, family: str, directory: str) -> str:
  """`save_pretrained` plus the family's generation_config.json; returns `directory`."""
  tokenizer.save_pretrained(directory)
  with open(os.path.join(directory, "generation_config.json"), "w", encoding="utf-8") as f:
    json.dump({"eos_token_id": generation_eos_ids(tokenizer, family)}, f)
  return directory
