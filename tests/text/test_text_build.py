"""build_text: a from-scratch tokenizer kept in the workdir, or a checkpoint's own; clear errors."""

import json
import os

import pytest

from bpo_jax.sandboxes import registry, rooms
from bpo_jax.testing import chat_tokenizers
from bpo_jax.text import build, chat, corpus

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "fixtures", "chat_templates")


def test_from_scratch_trains_saves_and_reloads(tmp_path, monkeypatch):
  import transformers  # pylint: disable=g-import-not-at-top
  tasks = rooms.make_tasks("train", 8, seed=0)
  tok, fmt = build.build_text("rooms", str(tmp_path), tasks, max_observation_tokens=40)
  directory = tmp_path / "tokenizer"
  assert sorted(os.listdir(directory)) == ["generation_config.json", "tokenizer.json",
                                           "tokenizer_config.json"]
  assert sorted(os.listdir(tmp_path)) == ["tokenizer"]
  loaded = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
  assert loaded.get_vocab() == tok.get_vocab()
  system = registry.get_action_syntax("rooms").system_prompt
  assert fmt.system_prompt == system and fmt.max_observation_tokens == 40
  assert fmt.stop_token_ids == (2, 0)
  assert fmt.prompt_head == f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
  # A resumed run loads the saved tokenizer and trains nothing.
  with open(directory / "tokenizer.json", "rb") as f:
    saved = f.read()

  def no_training(*args, **kwargs):
    raise AssertionError("the tokenizer was trained again")

  monkeypatch.setattr(corpus, "environment_texts", no_training)
  tok2, fmt2 = build.build_text("rooms", str(tmp_path), rooms.make_tasks("train", 2, seed=5),
                                vocab_size=300)
  assert tok2.get_vocab() == tok.get_vocab()
  assert fmt2.prompt_tokens("Goal: x") == fmt.prompt_tokens("Goal: x")
  with open(directory / "tokenizer.json", "rb") as f:
    assert f.read() == saved


def test_system_prompt_can_be_left_out(tmp_path):
  tasks = rooms.make_tasks("train", 2, seed=0)
  _, fmt = build.build_text("rooms", str(tmp_path), tasks, system_prompt="")
  assert fmt.system_prompt is None
  assert fmt.prompt_head == "<|im_start|>user\n"
  with pytest.raises(ValueError, match="needs a workdir"):
    build.build_text("rooms", None, tasks)


@pytest.fixture(scope="module")
def qwen_checkpoint(tmp_path_factory):
  with open(os.path.join(TEMPLATES, "qwen2_5.jinja")) as f:
    template = f.read()
  texts = ["user\nassistant\nsystem\n", "go north take red key"] * 20
  tok = chat_tokenizers.family_tokenizer("qwen2", texts, template, vocab_size=300)
  directory = str(tmp_path_factory.mktemp("checkpoint"))
  return chat_tokenizers.save_family_tokenizer(tok, "qwen2", directory)


def test_checkpoint_tokenizer_is_used_as_it_is(qwen_checkpoint, tmp_path):
  tok, fmt = build.build_text("webshop", str(tmp_path), [], checkpoint=qwen_checkpoint)
  assert os.listdir(tmp_path) == []  # nothing trained or written
  ids = tok.convert_tokens_to_ids
  assert fmt.stop_token_ids == (ids("<|im_end|>"), ids("<|endoftext|>"))
  assert fmt.system_prompt == registry.get_action_syntax("webshop").system_prompt
  # Without a system prompt, Qwen's template puts in its default one.
  _, fmt = build.build_text("webshop", None, [], checkpoint=qwen_checkpoint, system_prompt="")
  assert fmt.prompt_head == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
                             "are a helpful assistant.<|im_end|>\n<|im_start|>user\n")


def test_generation_config_eos_forms(tmp_path):
  path = tmp_path / "generation_config.json"
  assert build.read_eos_token_ids(str(tmp_path)) == ()
  for content, expected in (({"eos_token_id": 7}, (7,)), ({"eos_token_id": [7, 3]}, (7, 3)),
                            ({"bos_token_id": 1}, ())):
    path.write_text(json.dumps(content))
    assert build.read_eos_token_ids(str(tmp_path)) == expected
  for content in ('{"eos_token_id": "<eos>"}', '{"eos_token_id": []}', "[1, 2]", "{oops"):
    path.write_text(content)
    with pytest.raises(chat.TokenizerError, match="generation_config.json"):
      build.read_eos_token_ids(str(tmp_path))


def _one_line_error(**kwargs) -> str:
  with pytest.raises(chat.TokenizerError) as error:
    build.build_text("rooms", None, [], **kwargs)
  assert isinstance(error.value, ValueError)
  message = str(error.value)
  assert "\n" not in message
  return message


def test_unusable_checkpoints_get_one_line(qwen_checkpoint, tmp_path):
  missing = str(tmp_path / "nowhere")
  assert _one_line_error(checkpoint=missing) == f"{missing}: no such tokenizer directory"
  empty = tmp_path / "empty"
  empty.mkdir()
  assert _one_line_error(checkpoint=str(empty)).startswith(f"{empty}: no tokenizer files")
  # The same tokenizer without its chat template.
  bare = tmp_path / "bare"
  bare.mkdir()
  for name in os.listdir(qwen_checkpoint):
    with open(os.path.join(qwen_checkpoint, name)) as f:
      content = f.read()
    if name == "tokenizer_config.json":
      config = json.loads(content)
      config.pop("chat_template", None)
      content = json.dumps(config)
    if name != "chat_template.jinja":
      (bare / name).write_text(content)
  assert _one_line_error(checkpoint=str(bare)) == (
      f"{bare}: the tokenizer has no chat template (tokenizer_config.json 'chat_template' or "
      "chat_template.jinja)")
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "tokenizer.json").write_text("{not json")
  assert _one_line_error(checkpoint=str(broken)).startswith(
      f"{broken}: the tokenizer does not load (")


# webshop_cpu.py's shop.
WEBSHOP_CPU = {"num_products": 200, "catalogue_seed": 0, "goals_per_product": 2, "max_steps": 6,
               "results_per_page": 3}


def test_webshop_product_ids_are_one_token_each(tmp_path):
  """Every product id of the generated shop is one token of the from-scratch tokenizer (the
  plain BPE cuts them into 9.3 tokens on average), clicks and results pages round-trip exactly
  through the saved tokenizer and the chat format."""
  import transformers  # pylint: disable=g-import-not-at-top
  from bpo_jax.sandboxes import webshop  # pylint: disable=g-import-not-at-top
  from bpo_jax.text import bpe  # pylint: disable=g-import-not-at-top
  tasks = webshop.make_tasks("train", 64, seed=0, **WEBSHOP_CPU)
  tok, fmt = build.build_text("webshop", str(tmp_path), tasks, env_options=WEBSHOP_CPU,
                              max_observation_tokens=128)
  asins = corpus.atomic_strings("webshop", WEBSHOP_CPU)
  catalogue, _ = webshop.get_shop(**{k: v for k, v in WEBSHOP_CPU.items()
                                     if k not in ("max_steps", "results_per_page")})
  assert asins == [p.asin for p in catalogue.products] and len(set(asins)) == 200
  assert fmt.vocab_size == bpe.DEFAULT_VOCAB_SIZE + 200
  loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"),
                                                      local_files_only=True)
  ids = [loaded.encode(a, add_special_tokens=False) for a in asins]
  assert ids == [[bpe.DEFAULT_VOCAB_SIZE + i] for i in range(200)]
  sandbox = webshop.make_sandbox(**WEBSHOP_CPU)
  for asin, (i,) in zip(asins, ids):
    action = fmt.action_tokens(f"click[{asin}]")
    assert action.count(i) == 1 and len(action) == 5  # click, [, the id, ], end of turn
    assert fmt.decode_action(action) == f"click[{asin}]"
    # The results page that lists it, as the policy sees it.
    sandbox.reset(tasks[0])
    page = sandbox.step(f"search[{catalogue.by_asin[asin].title}]").observation
    assert asin in page
    body = loaded.encode(page, add_special_tokens=False)
    assert i in body and loaded.decode(body) == page
    assert i in fmt.observation_tokens(page)
  # 1024 learnt tokens besides the ids; the plain BPE of the same texts cuts them in 5-10.
  assert sum(t not in set(asins) for t in tok.get_vocab()) == bpe.DEFAULT_VOCAB_SIZE
  plain = bpe.train_bpe(corpus.environment_texts("webshop", tasks, WEBSHOP_CPU), 1024)
  pieces = [len(plain.encode(a).ids) for a in asins]
  assert 5 <= min(pieces) and max(pieces) <= 10 and sum(pieces) / 200 > 8


def test_too_many_atomic_strings_leave_the_plain_bpe(tmp_path, monkeypatch, caplog):
  from bpo_jax.sandboxes import webshop  # pylint: disable=g-import-not-at-top
  from bpo_jax.text import bpe  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(bpe, "MAX_ATOMIC", 199)
  tasks = webshop.make_tasks("train", 8, seed=0, **WEBSHOP_CPU)
  with caplog.at_level("WARNING"):
    tok, _ = build.build_text("webshop", str(tmp_path), tasks, env_options=WEBSHOP_CPU)
  assert "webshop names 200 atomic strings, more than bpe.MAX_ATOMIC = 199" in caplog.text
  assert len(tok) <= bpe.DEFAULT_VOCAB_SIZE
  assert len(tok.encode(tasks[0].asin, add_special_tokens=False)) > 1
  # Environments without the hook name none.
  assert corpus.atomic_strings("rooms") == []
