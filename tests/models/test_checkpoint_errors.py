"""Malformed checkpoints get one clear line: a CheckpointError (a ValueError) naming what is
wrong, for every case the loader meets."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bpo_jax import models
from bpo_jax.testing.hf_checkpoints import make_hf_checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
  """A single-file Qwen2 checkpoint and a Qwen3 one sharded by transformers, built once."""
  root = tmp_path_factory.mktemp("pristine")
  make_hf_checkpoint("qwen2", str(root / "qwen2"))
  make_hf_checkpoint("qwen3", str(root / "qwen3"), max_shard_size="30KB")
  return root


@pytest.fixture()
def qwen2_dir(pristine, tmp_path):
  path = tmp_path / "qwen2"
  path.mkdir()
  for name in os.listdir(pristine / "qwen2"):
    (path / name).write_bytes((pristine / "qwen2" / name).read_bytes())
  return str(path)


@pytest.fixture()
def sharded_dir(pristine, tmp_path):
  path = tmp_path / "qwen3"
  path.mkdir()
  for name in os.listdir(pristine / "qwen3"):
    (path / name).write_bytes((pristine / "qwen3" / name).read_bytes())
  return str(path)


def refused(path, message, **kwargs):
  """Loading `path` raises a one-line CheckpointError matching `message`."""
  with pytest.raises(models.CheckpointError, match=message) as error:
    models.load_hf_checkpoint(path, **kwargs)
  assert isinstance(error.value, ValueError)
  assert "\n" not in str(error.value)


def rewrite_tensors(path, change, file="model.safetensors"):
  tensors = load_file(os.path.join(path, file))
  change(tensors)
  save_file(tensors, os.path.join(path, file), metadata={"format": "pt"})


def rewrite_json(path, change, file="config.json"):
  with open(os.path.join(path, file)) as f:
    content = json.load(f)
  change(content)
  with open(os.path.join(path, file), "w") as f:
    json.dump(content, f)


def test_missing_directory_and_config(qwen2_dir, tmp_path):
  refused(str(tmp_path / "nowhere"), "does not exist")
  os.remove(os.path.join(qwen2_dir, "config.json"))
  refused(qwen2_dir, "no config.json in checkpoint directory")


def test_unreadable_or_incomplete_config(qwen2_dir):
  with open(os.path.join(qwen2_dir, "config.json"), "w") as f:
    f.write("{not json")
  refused(qwen2_dir, "cannot read the model config")
  with open(os.path.join(qwen2_dir, "config.json"), "w") as f:
    json.dump([1, 2], f)
  refused(qwen2_dir, "must hold a JSON object")


def test_generation_config_is_read_or_refused(qwen2_dir, tmp_path):
  assert models.read_generation_config(qwen2_dir)["eos_token_id"] == [2, 3]
  assert models.read_generation_config(str(tmp_path)) == {}  # none: no defaults to read
  with open(os.path.join(qwen2_dir, "generation_config.json"), "w") as f:
    f.write("[")
  with pytest.raises(models.CheckpointError, match="cannot read the generation config"):
    models.read_generation_config(qwen2_dir)


def test_config_without_a_shape_field(qwen2_dir):
  rewrite_json(qwen2_dir, lambda c: c.pop("vocab_size"))
  refused(qwen2_dir, "config.json has no 'vocab_size' field")


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2"),
     r"unsupported model_type 'gpt2' \(architectures \['GPT2LMHeadModel'\]\)"),
    (lambda c: c.update(architectures=["MistralForCausalLM"], model_type="mistral"),
     "unsupported model_type 'mistral'"),
    (lambda c: c.update(architectures=["Qwen2ForSequenceClassification"]),
     r"unsupported architecture \['Qwen2ForSequenceClassification'\]"),
    (lambda c: c.update(architectures=["LlamaForCausalLM"]),
     "model_type 'qwen2' does not match architectures"),
    (lambda c: c.update(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=1e4)),
     "unsupported rope_type 'yarn'"),
    (lambda c: c.update(use_sliding_window=True), "sliding-window"),
    (lambda c: c.update(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.update(mlp_bias=True), "mlp_bias"),
])
def test_unsupported_models(qwen2_dir, change, message):
  rewrite_json(qwen2_dir, change)
  refused(qwen2_dir, message)


def test_qwen3_with_attention_bias_is_unsupported(sharded_dir):
  rewrite_json(sharded_dir, lambda c: c.update(attention_bias=True))
  refused(sharded_dir, "qwen3 attention_bias=True")


def test_missing_unexpected_and_misshapen_tensors(qwen2_dir):
  original = load_file(os.path.join(qwen2_dir, "model.safetensors"))
  rewrite_tensors(qwen2_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  refused(qwen2_dir, r"missing tensors: \['model.layers.1.mlp.up_proj.weight'\]")
  save_file({**original, "model.extra.weight": np.zeros(3, np.float32)},
            os.path.join(qwen2_dir, "model.safetensors"))
  refused(qwen2_dir, r"unexpected tensors: \['model.extra.weight'\]")
  model, _ = models.load_hf_checkpoint(qwen2_dir, strict=False)  # explicitly tolerated
  assert model.config.num_layers == 2
  save_file({**original, "model.layers.0.self_attn.k_proj.weight": np.zeros((8, 32), np.float32)},
            os.path.join(qwen2_dir, "model.safetensors"))
  refused(qwen2_dir, r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 32\), "
                     r"expected \(16, 32\)")
  save_file({**original, "model.norm.weight": np.ones(32, np.int32)},
            os.path.join(qwen2_dir, "model.safetensors"))
  refused(qwen2_dir, "'model.norm.weight' has dtype int32, expected a float dtype")


def test_missing_or_broken_weight_files(qwen2_dir):
  file = os.path.join(qwen2_dir, "model.safetensors")
  data = open(file, "rb").read()
  with open(file, "wb") as f:
    f.write(data[:len(data) // 2])
  refused(qwen2_dir, "is truncated")
  with open(file, "wb") as f:
    f.write(b"\x05")
  refused(qwen2_dir, "cannot read the safetensors header")
  os.remove(file)
  refused(qwen2_dir, "no model.safetensors or model.safetensors.index.json")


def test_a_file_that_is_not_safetensors(qwen2_dir):
  file = os.path.join(qwen2_dir, "model.safetensors")
  size = os.path.getsize(file)
  # Random bytes: their first eight read as a header length of up to 2^64.
  random_bytes = np.random.default_rng(0).bytes(size)
  with open(file, "wb") as f:
    f.write(random_bytes)
  length = int.from_bytes(random_bytes[:8], "little")
  refused(qwen2_dir, f"'{file}' is not a safetensors file: its header length {length} exceeds "
                     f"the {size - 8} bytes the file and format allow")
  # A length the file holds, whose header is JSON but not an object of tensor entries.
  for header in (b"[1, 2]", b'{"a": 3}'):
    with open(file, "wb") as f:
      f.write(len(header).to_bytes(8, "little") + header)
    refused(qwen2_dir, f"'{file}' is not a safetensors file: its header is not a JSON object")
  # The format's own cap on the header (100 MB), whatever the file's size.
  with open(file, "wb") as f:
    f.write((models.params.MAX_HEADER_BYTES + 1).to_bytes(8, "little"))
    f.truncate(models.params.MAX_HEADER_BYTES + 100)
  refused(qwen2_dir, f"header length {models.params.MAX_HEADER_BYTES + 1} exceeds the "
                     f"{models.params.MAX_HEADER_BYTES} bytes")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_weights_that_are_not_finite(qwen2_dir, value):
  name = "model.layers.1.self_attn.k_proj.weight"
  def poison(tensors):
    tensors[name][0, 2] = value
    tensors[name][3, 1] = value
  rewrite_tensors(qwen2_dir, poison)
  size = load_file(os.path.join(qwen2_dir, "model.safetensors"))[name].size
  refused(qwen2_dir, rf"tensor '{name}' in '.*model.safetensors' has 2 NaN or Inf value\(s\) "
                     rf"of {size} as float32")


def test_weights_that_overflow_the_parameter_dtype(qwen2_dir):
  # 1e39 is finite as float64 and infinite as the float32 parameters hold it.
  name = "model.norm.weight"
  def widen(tensors):
    tensors[name] = tensors[name].astype(np.float64)
    tensors[name][0] = 1e39
  rewrite_tensors(qwen2_dir, widen)
  refused(qwen2_dir, rf"tensor '{name}' in .* has 1 NaN or Inf value\(s\) of 32 as float32")
def test_sharded_checkpoint_with_a_missing_or_wrong_shard(sharded_dir):
  models.load_hf_checkpoint(sharded_dir)  # loads as transformers saved it
  with open(os.path.join(sharded_dir, models.params.INDEX_FILE)) as f:
    weight_map = json.load(f)["weight_map"]
  shard = weight_map["model.norm.weight"]
  moved = weight_map["model.embed_tokens.weight"]
  assert shard != moved
  rewrite_json(sharded_dir, lambda i: i["weight_map"].update({"model.norm.weight": moved}),
               models.params.INDEX_FILE)
  refused(sharded_dir, f"'model.norm.weight' is not in shard '{moved}'")
  rewrite_json(sharded_dir, lambda i: i.pop("weight_map"), models.params.INDEX_FILE)
  refused(sharded_dir, "has no weight_map")
  rewrite_json(sharded_dir, lambda i: i.update(weight_map=weight_map), models.params.INDEX_FILE)
  os.remove(os.path.join(sharded_dir, shard))
  refused(sharded_dir, f"shard '{shard}' listed in model.safetensors.index.json is missing")


@pytest.mark.parametrize("kwargs, message", [
    (dict(lora_rank=-1), r"lora_rank must be >= 0 \(0 = no adapters\), got -1"),
    (dict(lora_rank=17), r"lora_rank 17 exceeds the k projection's smaller dimension "
                         r"\(32 -> 16\)"),
    (dict(lora_rank=4, lora_alpha=0.0), "lora_alpha must be positive"),
])
def test_lora_ranks_the_model_cannot_take(qwen2_dir, kwargs, message):
  refused(qwen2_dir, message, **kwargs)
  models.load_hf_checkpoint(qwen2_dir, lora_rank=16)  # the largest rank it can take


def test_unwritable_export_target(qwen2_dir, tmp_path):
  model, _ = models.load_hf_checkpoint(qwen2_dir)
  target = tmp_path / "a_file"
  target.write_text("not a directory")
  with pytest.raises(models.CheckpointError, match="it is a file"):
    models.save_hf_checkpoint(model, str(target))
  assert target.read_text() == "not a directory"
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint-")] == []
