"""HF checkpoints: parity with transformers' PyTorch models, save/load, loader errors, tokenizer."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from bpo_jax import models
from bpo_jax.testing.model_rounding import forward_roundings
from bpo_jax.testing.tolerance import assert_close

forward = jax.jit(models.forward, static_argnums=0)
VOCAB = 97


def hf_config(architecture):
  common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
                max_position_embeddings=128)
  if architecture == "qwen2":
    return transformers.Qwen2Config(tie_word_embeddings=True, **common)
  # Llama 3 RoPE scaling with an original context of 16, so the 40-token prompts below reach
  # every branch of the frequency rescaling (kept, blended and stretched frequencies).
  return transformers.LlamaConfig(
      rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                        high_freq_factor=4.0, original_max_position_embeddings=16),
      rope_theta=500000.0, rms_norm_eps=1e-5, **common)


def make_hf_checkpoint(architecture, path, seed=0):
  torch.manual_seed(seed)
  model_class = {"qwen2": transformers.Qwen2ForCausalLM,
                 "llama": transformers.LlamaForCausalLM}[architecture]
  hf_model = model_class(hf_config(architecture)).eval()
  hf_model.save_pretrained(path)
  return hf_model


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def checkpoint(request, tmp_path_factory):
  path = str(tmp_path_factory.mktemp(request.param))
  return request.param, path, make_hf_checkpoint(request.param, path)


def hf_logits(hf_model, tokens):
  with torch.no_grad():
    return hf_model(torch.as_tensor(tokens)).logits.numpy()


PROMPTS = np.random.RandomState(0).randint(0, VOCAB, (2, 40))


def test_logits_equal_transformers(checkpoint):
  architecture, path, hf_model = checkpoint
  model, config = models.load_hf_checkpoint(path)
  assert config.architecture == architecture
  assert config.tie_word_embeddings == (architecture == "qwen2")
  assert (config.rope_scaling is not None) == (architecture == "llama")
  graphdef, state = nnx.split(model)
  want = hf_logits(hf_model, PROMPTS)
  assert np.abs(want).max() > 1.0  # logits far from flat: a wrong weight would show
  got, _ = forward(graphdef, state, jnp.asarray(PROMPTS))
  # XLA and PyTorch compute the same function with their own summation orders and kernels.
  assert_close(got, want, steps=forward_roundings(config, PROMPTS.shape[1]))


def test_saved_checkpoint_round_trips_and_loads_in_transformers(checkpoint, tmp_path):
  architecture, path, hf_model = checkpoint
  model, config = models.load_hf_checkpoint(path)
  out = str(tmp_path / "saved")
  models.save_hf_checkpoint(model, out, max_shard_bytes=20_000)  # forces several shards
  with open(os.path.join(out, models.params.INDEX_FILE)) as f:
    assert len(set(json.load(f)["weight_map"].values())) > 1
  reloaded, reloaded_config = models.load_hf_checkpoint(out)
  assert reloaded_config == config
  for (path_a, a), (path_b, b) in zip(
      jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)),
      jax.tree_util.tree_leaves_with_path(nnx.state(reloaded, nnx.Param))):
    assert path_a == path_b
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # transformers reads what we wrote, tensor for tensor.
  hf_reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  # The same weights in the same PyTorch program: the same numbers.
  np.testing.assert_array_equal(hf_logits(hf_reloaded, PROMPTS), hf_logits(hf_model, PROMPTS))


def test_bfloat16_load_and_placement_by_sharding(checkpoint):
  _, path, _ = checkpoint
  model, config = models.load_hf_checkpoint(path, dtype="bfloat16")
  assert config.dtype == config.param_dtype == "bfloat16"
  assert {x.dtype for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))} == {
      jnp.dtype(jnp.bfloat16)}

  devices = jax.devices()
  assert len(devices) >= 2, "tests/conftest.py provides several CPU devices"
  mesh = jax.sharding.Mesh(np.asarray(devices[:2]), ("model",))
  P = jax.sharding.PartitionSpec

  def sharding_for(state_path, shape):
    if state_path[-1] in ("q_kernel", "k_kernel", "v_kernel"):
      return jax.sharding.NamedSharding(mesh, P(None, "model", None))  # split over heads
    return jax.sharding.NamedSharding(mesh, P())

  sharded, _ = models.load_hf_checkpoint(path, sharding_for=sharding_for)
  q_kernel = sharded.layers[0].attn.q_kernel[...]
  assert q_kernel.sharding.spec == P(None, "model", None)
  assert q_kernel.addressable_shards[0].data.shape == (32, 2, 8)
  plain, config = models.load_hf_checkpoint(path)
  got, _ = forward(*nnx.split(sharded), jnp.asarray(PROMPTS))
  want, _ = forward(*nnx.split(plain), jnp.asarray(PROMPTS))
  assert_close(got, want, steps=forward_roundings(config, PROMPTS.shape[1]))


@pytest.fixture()
def qwen2_dir(tmp_path):
  path = str(tmp_path / "ckpt")
  make_hf_checkpoint("qwen2", path)
  return path


def rewrite_tensors(path, change):
  file = os.path.join(path, "model.safetensors")
  tensors = load_file(file)
  change(tensors)
  save_file(tensors, file, metadata={"format": "pt"})


def rewrite_config(path, change):
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  change(config)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)


def test_error_missing_tensor(qwen2_dir):
  rewrite_tensors(qwen2_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(models.CheckpointError,
                     match=r"missing tensors: \['model.layers.1.mlp.up_proj.weight'\]"):
    models.load_hf_checkpoint(qwen2_dir)


def test_error_unexpected_tensor(qwen2_dir):
  rewrite_tensors(qwen2_dir, lambda t: t.update({"model.extra.weight": np.zeros(3, np.float32)}))
  with pytest.raises(models.CheckpointError,
                     match=r"unexpected tensors: \['model.extra.weight'\]"):
    models.load_hf_checkpoint(qwen2_dir)
  model, _ = models.load_hf_checkpoint(qwen2_dir, strict=False)  # explicitly tolerated
  assert model.config.num_layers == 2


def test_error_shape_mismatch(qwen2_dir):
  def corrupt(tensors):
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
  rewrite_tensors(qwen2_dir, corrupt)
  with pytest.raises(models.CheckpointError,
                     match=r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 32\), "
                           r"expected \(16, 32\)"):
    models.load_hf_checkpoint(qwen2_dir)


def test_error_missing_files(qwen2_dir, tmp_path):
  os.remove(os.path.join(qwen2_dir, "model.safetensors"))
  with pytest.raises(FileNotFoundError, match="no model.safetensors"):
    models.load_hf_checkpoint(qwen2_dir)
  os.remove(os.path.join(qwen2_dir, "config.json"))
  with pytest.raises(FileNotFoundError, match="no config.json"):
    models.load_hf_checkpoint(qwen2_dir)
  # A sharded checkpoint with one shard gone.
  sharded = str(tmp_path / "sharded")
  models.save_hf_checkpoint(models.Decoder(models.ModelConfig.tiny(), rngs=nnx.Rngs(0)), sharded,
                            max_shard_bytes=100_000)
  with open(os.path.join(sharded, models.params.INDEX_FILE)) as f:
    shard_names = sorted(set(json.load(f)["weight_map"].values()))
  assert shard_names[1] == f"model-00002-of-{len(shard_names):05d}.safetensors"
  os.remove(os.path.join(sharded, shard_names[1]))
  with pytest.raises(FileNotFoundError, match=f"shard '{shard_names[1]}'"):
    models.load_hf_checkpoint(sharded)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2"),
     "unsupported architecture.*GPT2LMHeadModel"),
    (lambda c: c.update(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=1e4)),
     "unsupported rope_type 'yarn'"),
    (lambda c: c.update(use_sliding_window=True), "sliding-window"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
])
def test_error_unsupported_config(qwen2_dir, change, message):
  rewrite_config(qwen2_dir, change)
  with pytest.raises(ValueError, match=message):
    models.load_hf_checkpoint(qwen2_dir)


def test_preset_configs_round_trip_through_hf_config():
  for preset in (models.ModelConfig.qwen2_5_0_5b(), models.ModelConfig.qwen2_5_7b(),
                 models.ModelConfig.llama3_1_8b(), models.ModelConfig.tiny_llama()):
    assert models.ModelConfig.from_hf_config(preset.to_hf_config()) == preset
    # transformers accepts the written fields and derives the same shapes.
    hf = transformers.AutoConfig.for_model(**preset.to_hf_config())
    assert hf.num_key_value_heads == preset.num_kv_heads
    assert hf.head_dim == preset.head_dim


def test_tokenizer_and_chat_template_from_checkpoint_dir(qwen2_dir):
  # A byte-level BPE Qwen2 tokenizer over printable ASCII plus a few merges.
  chars = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]  # Ġ = space, Ċ = newline
  vocab = {c: i for i, c in enumerate(chars)}
  merges = [("g", "o"), ("n", "o"), ("no", "r"), ("nor", "t"), ("nort", "h"), ("Ġ", "north")]
  for a, b in merges:
    vocab[a + b] = len(vocab)
  tokenizer = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None,
                                          eos_token="<|im_end|>", pad_token="<|endoftext|>")
  tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
  tokenizer.chat_template = (
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  tokenizer.save_pretrained(qwen2_dir)

  loaded = models.load_tokenizer(qwen2_dir)
  text = loaded.apply_chat_template([{"role": "user", "content": "go north"}], tokenize=False,
                                    add_generation_prompt=True)
  assert text == "<|im_start|>user\ngo north<|im_end|>\n<|im_start|>assistant\n"
  im_start, im_end = loaded.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
  assert loaded.eos_token_id == im_end
  spell = lambda word: [vocab[c] for c in word]
  newline, go, space_north = vocab["Ċ"], vocab["go"], vocab["Ġnorth"]
  assert loaded.encode(text, add_special_tokens=False) == (
      [im_start] + spell("user") + [newline, go, space_north, im_end, newline, im_start] +
      spell("assistant") + [newline])
