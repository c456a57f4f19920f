"""The from-scratch byte-level BPE tokenizer: exact round trip, HF format, template, determinism."""

import json
import os
import subprocess
import sys

import pytest

from bpo_jax.sandboxes import rooms
from bpo_jax.text import bpe, corpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRICKY = [
    "search[Meridian Clip in Hair Extensions, Heat Resistant]",
    "click[B0B34SD43W]",
    "run python -m pytest -q",
    "replace m.py\n<<<<<<< SEARCH\n    return x - 1\n=======\n    return x\n>>>>>>> REPLACE",
    "  two leading spaces, three trailing   ",
    "\n\nblank lines\n\n\n",
    "tabs\tand\r\nwindows newlines",
    "don 't , spaced . punctuation ! ?",
    "naïve café — “quotes” 日本語 🙂 e\u0301 (decomposed)",
    "",
    " ",
    "\x00\x7f control",
]


@pytest.fixture(scope="module")
def rooms_texts():
  return corpus.environment_texts("rooms", rooms.make_tasks("train", 16, seed=0))


@pytest.fixture(scope="module")
def saved(rooms_texts, tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("bpe") / "tokenizer")
  core = bpe.train_bpe(rooms_texts, vocab_size=400)
  bpe.save_bpe(core, directory)
  return core, directory


def test_round_trip_is_exact(saved):
  import transformers  # pylint: disable=g-import-not-at-top
  core, directory = saved
  tok = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
  for text in TRICKY:
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == core.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text, repr(text)
  # Special-token strings encode as the special tokens and decode back.
  ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
  assert ids[0] == 1 and ids[-1] == 2
  assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
  assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_special_tokens_vocabulary_and_generation_config(saved):
  import transformers  # pylint: disable=g-import-not-at-top
  core, directory = saved
  assert sorted(os.listdir(directory)) == ["generation_config.json", "tokenizer.json",
                                           "tokenizer_config.json"]
  tok = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
  assert [tok.convert_tokens_to_ids(t) for t in bpe.SPECIAL_TOKENS] == [0, 1, 2]
  assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token) == (
      "<|im_end|>", 2, 0, None)
  assert len(tok) == core.get_vocab_size() == 400
  # Ids 3..258 are the 256 byte symbols: every byte encodes without an unknown token.
  assert tok.encode("\x00", add_special_tokens=False)[0] in range(3, 259)
  with open(os.path.join(directory, "generation_config.json")) as f:
    assert json.load(f) == {"eos_token_id": [2, 0], "pad_token_id": 0}


def test_chat_template_renders_chatml(saved):
  import transformers  # pylint: disable=g-import-not-at-top
  _, directory = saved
  tok = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Goal: x"},
              {"role": "assistant", "content": "go north"}]
  expected = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGoal: x<|im_end|>\n"
              "<|im_start|>assistant\ngo north<|im_end|>\n")
  assert tok.apply_chat_template(messages, tokenize=False) == expected
  assert bpe.chatml_text(messages) == expected
  assert tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True) == (
      bpe.chatml_text(messages[:2], add_generation_prompt=True))
  ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
  assert ids == tok.encode(expected, add_special_tokens=False)
  assert ids.count(1) == 3 and ids.count(2) == 3


@pytest.mark.slow
def test_training_is_deterministic_across_processes(rooms_texts, saved, tmp_path):
  _, directory = saved
  texts_file = tmp_path / "texts.json"
  texts_file.write_text(json.dumps(rooms_texts))
  script = ("import json, sys; from bpo_jax.text import bpe; "
            "bpe.save_bpe(bpe.train_bpe(json.load(open(sys.argv[1])), 400), sys.argv[2])")
  again = tmp_path / "again"
  subprocess.run([sys.executable, "-c", script, str(texts_file), str(again)], check=True,
                 cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "123"})
  for name in os.listdir(directory):
    with open(os.path.join(directory, name), "rb") as f, open(again / name, "rb") as g:
      assert f.read() == g.read(), name


def test_no_merge_spans_a_special_token():
  core = bpe.train_bpe(["<|im_end|>\nab<|im_end|>\n"] * 50, vocab_size=300)
  merged = [t for t in core.get_vocab() if len(t) > 1 and t not in bpe.SPECIAL_TOKENS]
  # Only "ab" and the newline after a special token occur often enough to merge.
  assert sorted(merged) == ["ab"]


def test_vocab_size_bounds():
  texts = ["the cat sat on the mat"] * 10
  assert bpe.train_bpe(texts, vocab_size=259).get_vocab_size() == 259  # no merges
  # A tiny corpus runs out of pairs (seen twice or more) before the requested size.
  assert bpe.train_bpe(texts, vocab_size=1024).get_vocab_size() < 300
  with pytest.raises(ValueError, match="vocab_size must be an integer >= 259"):
    bpe.train_bpe(texts, vocab_size=258)
  with pytest.raises(TypeError, match="training texts must be str"):
    bpe.train_bpe([b"bytes"], vocab_size=300)


def test_save_replaces_a_directory_and_leaves_no_staging(saved, tmp_path):
  core, _ = saved
  directory = tmp_path / "tokenizer"
  directory.mkdir()
  (directory / "stale.txt").write_text("old")
  bpe.save_bpe(core, str(directory))
  assert sorted(os.listdir(directory)) == ["generation_config.json", "tokenizer.json",
                                           "tokenizer_config.json"]
  assert os.listdir(tmp_path) == ["tokenizer"]


NAMES = ["B0B34SD43W", "B07XKQ2R1M", "ROOM-7"]


@pytest.fixture(scope="module")
def atomic_saved(rooms_texts, tmp_path_factory):
  texts = rooms_texts + [f"click[{n}] [SEP] {n} [SEP] go" for n in NAMES] * 5
  directory = str(tmp_path_factory.mktemp("bpe_atomic") / "tokenizer")
  core = bpe.train_bpe(texts, vocab_size=400, atomic=NAMES + NAMES[:1])
  bpe.save_bpe(core, directory)
  return core, directory


def test_atomic_strings_are_one_token_each_after_the_learnt_ones(atomic_saved):
  import transformers  # pylint: disable=g-import-not-at-top
  core, directory = atomic_saved
  tok = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
  assert len(tok) == core.get_vocab_size() == 403  # repeats dropped
  assert [tok.convert_tokens_to_ids(n) for n in NAMES] == [400, 401, 402]
  assert [tok.convert_tokens_to_ids(t) for t in bpe.SPECIAL_TOKENS] == [0, 1, 2]
  for name, i in zip(NAMES, (400, 401, 402)):
    assert tok.encode(name, add_special_tokens=False) == [i]
    ids = tok.encode(f"click[{name}]", add_special_tokens=False)
    assert ids == tok.encode("click[", add_special_tokens=False) + [i] + tok.encode(
        "]", add_special_tokens=False)
    assert tok.encode(f"x [SEP] {name} [SEP]", add_special_tokens=False).count(i) == 1
    # Not special: a decoded reply keeps it.
    assert tok.decode(ids, skip_special_tokens=True) == f"click[{name}]"
    # Only as a whole word: inside a longer word it encodes by its bytes.
    for longer in (f"x{name}", f"{name}9", f"_{name}", f"é{name}"):
      ids = tok.encode(longer, add_special_tokens=False)
      assert i not in ids and tok.decode(ids) == longer
  for text in TRICKY + [f" {NAMES[0]}{NAMES[1]} {NAMES[2]}\n{NAMES[0]}!"]:
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == core.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text, repr(text)
  with open(os.path.join(directory, "tokenizer_config.json")) as f:
    assert json.load(f) == bpe.tokenizer_config()


def test_atomic_strings_are_cut_out_before_counting():
  # The same merges as on the texts without the name: none spans or enters it.
  name = "B0B34SD43W"
  with_name = bpe.train_bpe([f"<|im_end|>\nab {name}, ab {name}<|im_end|>\n"] * 50, 300,
                            atomic=[name])
  without = bpe.train_bpe(["<|im_end|>\nab <|im_end|>, ab <|im_end|>\n"] * 50, 300)
  learnt = {t: i for t, i in with_name.get_vocab().items() if t != name}
  assert learnt == without.get_vocab()
  assert with_name.get_vocab()[name] == without.get_vocab_size()


def test_atomic_strings_are_checked(monkeypatch):
  texts = ["the cat sat on the mat"] * 10
  for bad in ("", " B0B34SD43W", "B0B34SD43W\n", "a<|im_end|>b"):
    with pytest.raises(ValueError, match="an atomic string must"):
      bpe.train_bpe(texts, 300, atomic=[bad])
  monkeypatch.setattr(bpe, "MAX_ATOMIC", 2)
  with pytest.raises(ValueError, match="3 atomic strings, more than MAX_ATOMIC = 2"):
    bpe.train_bpe(texts, 300, atomic=NAMES)
  # Without atomic strings the tokenizer is the plain BPE, byte for byte.
  assert bpe.train_bpe(texts, 300, atomic=()).to_str() == bpe.train_bpe(texts, 300).to_str()
