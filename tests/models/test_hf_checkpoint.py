"""HF checkpoints of Qwen2, Qwen3 and Llama 3: parity with transformers' PyTorch models, export
that transformers loads as it is, bfloat16, placement, presets, tokenizer."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from bpo_jax import models
from bpo_jax.testing import hf_checkpoints
from bpo_jax.testing.hf_checkpoints import hf_logits, make_hf_checkpoint, VOCAB
from bpo_jax.testing.model_rounding import forward_roundings
from bpo_jax.testing.tolerance import assert_close

forward = jax.jit(models.forward, static_argnums=0)
PROMPTS = np.random.RandomState(0).randint(0, VOCAB, (2, 40))
HF_CLASS = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


@pytest.fixture(scope="module", params=list(hf_checkpoints.VARIANTS))
def checkpoint(request, tmp_path_factory):
  """(variant, directory, PyTorch model); two variants saved by transformers in shards."""
  variant = request.param
  path = str(tmp_path_factory.mktemp(variant))
  shard = "30KB" if variant in ("qwen3", "llama3.1") else None
  return variant, path, make_hf_checkpoint(variant, path, max_shard_size=shard)


def test_logits_equal_transformers(checkpoint):
  variant, path, hf_model = checkpoint
  family = hf_checkpoints.family(variant)
  if variant in ("qwen3", "llama3.1"):
    assert os.path.isfile(os.path.join(path, models.params.INDEX_FILE))
  model, config = models.load_hf_checkpoint(path)
  assert config.architecture == family
  assert config.tie_word_embeddings == hf_model.config.tie_word_embeddings
  assert (config.rope_scaling is not None) == (family == "llama")
  assert config.qkv_bias == (family == "qwen2") and config.qk_norm == (family == "qwen3")
  assert config.head_dim == (24 if family == "qwen3" else 8)
  want = hf_logits(hf_model, PROMPTS)
  assert np.abs(want).max() > 1.0  # logits far from flat: a wrong weight would show
  got, _ = forward(*nnx.split(model), jnp.asarray(PROMPTS))
  # XLA and PyTorch compute the same function with their own summation orders and kernels.
  assert_close(got, want, steps=forward_roundings(config, PROMPTS.shape[1]))


def test_cached_prefill_and_decode_equal_transformers(checkpoint):
  """The cached path (q/k norms and RoPE before the keys are cached): a 32-token prefill, then
  8 tokens one at a time, against transformers' full forward."""
  _, path, hf_model = checkpoint
  model, config = models.load_hf_checkpoint(path)
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray(PROMPTS)
  logits, cache = forward(graphdef, state, tokens[:, :32], cache=models.KVCache.init(config, 2, 48))
  steps = [logits]
  for t in range(32, 40):
    logits, cache = forward(graphdef, state, tokens[:, t:t + 1], cache=cache)
    steps.append(logits)
  assert_close(jnp.concatenate(steps, axis=1), hf_logits(hf_model, PROMPTS),
               steps=forward_roundings(config, 48))


def test_export_loads_in_transformers_with_the_same_logits(checkpoint, tmp_path):
  variant, path, hf_model = checkpoint
  model, config = models.load_hf_checkpoint(path)
  generation = models.read_generation_config(path)
  assert generation["eos_token_id"] == [2, 3]
  out = str(tmp_path / "saved")
  models.save_hf_checkpoint(model, out, max_shard_bytes=20_000,  # forces several shards
                            generation_config=generation)
  with open(os.path.join(out, models.params.INDEX_FILE)) as f:
    assert len(set(json.load(f)["weight_map"].values())) > 1
  with open(os.path.join(out, "config.json")) as f:
    written = json.load(f)
  family = hf_checkpoints.family(variant)
  assert written["architectures"] == [HF_CLASS[family]] and written["model_type"] == family
  assert written["dtype"] == "float32"
  # Our loader reads back the same bits.
  reloaded, reloaded_config = models.load_hf_checkpoint(out)
  assert reloaded_config == config
  for (path_a, a), (path_b, b) in zip(
      jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)),
      jax.tree_util.tree_leaves_with_path(nnx.state(reloaded, nnx.Param))):
    assert path_a == path_b
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # transformers reads what we wrote as it is: its logits are ours, and the original's bit for bit.
  hf_reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(hf_reloaded).__name__ == HF_CLASS[family]
  got, _ = forward(*nnx.split(model), jnp.asarray(PROMPTS))
  exported = hf_logits(hf_reloaded, PROMPTS)
  assert_close(exported, got, steps=forward_roundings(config, PROMPTS.shape[1]))
  np.testing.assert_array_equal(exported, hf_logits(hf_model, PROMPTS))
  assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == [2, 3]


def test_bfloat16_checkpoint_keeps_its_dtype_and_bits(tmp_path):
  path = str(tmp_path / "bf16")
  hf_model = make_hf_checkpoint("llama3.2", path, dtype=torch.bfloat16)
  with open(os.path.join(path, "config.json")) as f:
    assert json.load(f)["dtype"] == "bfloat16"
  model, config = models.load_hf_checkpoint(path)
  assert config.dtype == config.param_dtype == "bfloat16"
  assert {x.dtype for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))} == {
      jnp.dtype(jnp.bfloat16)}
  bits = lambda x: np.asarray(x).view(np.uint16)
  torch_bits = lambda t: t.detach().view(torch.int16).numpy().view(np.uint16)
  np.testing.assert_array_equal(bits(model.embed[...]),
                                torch_bits(hf_model.model.embed_tokens.weight))
  # Loaded as float32 (bf16 values are exact in float32): transformers' float32 logits of the
  # same checkpoint (loaded afresh: `.float()` on the bf16 model would keep its RoPE frequencies
  # rounded to bf16).
  as_float32, config32 = models.load_hf_checkpoint(path, dtype="float32")
  got, _ = forward(*nnx.split(as_float32), jnp.asarray(PROMPTS))
  hf_float32 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  assert_close(got, hf_logits(hf_float32.eval(), PROMPTS),
               steps=forward_roundings(config32, PROMPTS.shape[1]))
  # Exported in bfloat16: transformers loads bfloat16 tensors with the same bits.
  out = str(tmp_path / "saved")
  models.save_hf_checkpoint(model, out)
  hf_reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
  assert hf_reloaded.dtype == torch.bfloat16
  np.testing.assert_array_equal(torch_bits(hf_reloaded.model.layers[1].mlp.down_proj.weight),
                                bits(model.layers[1].mlp.down_kernel[...]).T)


def test_saving_over_a_checkpoint_replaces_its_weight_files(tmp_path):
  path = str(tmp_path / "ckpt")
  make_hf_checkpoint("qwen2", path)
  model, _ = models.load_hf_checkpoint(path)
  out = str(tmp_path / "out")
  models.save_hf_checkpoint(model, out, max_shard_bytes=20_000)
  assert os.path.isfile(os.path.join(out, models.params.INDEX_FILE))
  doubled = jax.tree_util.tree_map(lambda x: 2 * x, nnx.state(model))
  nnx.update(model, doubled)
  models.save_hf_checkpoint(model, out)  # one file now: the old shards and index go
  assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
  reloaded, _ = models.load_hf_checkpoint(out)
  np.testing.assert_array_equal(reloaded.embed[...], model.embed[...])


def test_placement_by_sharding(tmp_path):
  path = str(tmp_path / "qwen3")
  make_hf_checkpoint("qwen3", path)
  devices = jax.devices()
  assert len(devices) >= 2, "tests/conftest.py provides several CPU devices"
  mesh = jax.sharding.Mesh(np.asarray(devices[:2]), ("model",))
  P = jax.sharding.PartitionSpec

  def sharding_for(state_path, shape):
    if state_path[-1] in ("q_kernel", "k_kernel", "v_kernel"):
      return jax.sharding.NamedSharding(mesh, P(None, "model", None))  # split over heads
    return jax.sharding.NamedSharding(mesh, P())

  sharded, config = models.load_hf_checkpoint(path, sharding_for=sharding_for)
  q_kernel = sharded.layers[0].attn.q_kernel[...]
  assert q_kernel.sharding.spec == P(None, "model", None)
  assert q_kernel.addressable_shards[0].data.shape == (32, 2, 24)
  plain, _ = models.load_hf_checkpoint(path)
  got, _ = forward(*nnx.split(sharded), jnp.asarray(PROMPTS))
  want, _ = forward(*nnx.split(plain), jnp.asarray(PROMPTS))
  assert_close(got, want, steps=forward_roundings(config, PROMPTS.shape[1]))


PRESETS = [models.ModelConfig.qwen2_5_0_5b(), models.ModelConfig.qwen2_5_7b(),
           models.ModelConfig.qwen3_0_6b(), models.ModelConfig.llama3_2_1b(),
           models.ModelConfig.llama3_1_8b(), models.ModelConfig.tiny_llama(),
           models.ModelConfig.tiny_qwen3()]


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: f"{p.architecture}-{p.num_layers}L")
def test_presets_round_trip_and_count_what_transformers_builds(preset):
  assert models.ModelConfig.from_hf_config(preset.to_hf_config()) == preset
  hf_config = transformers.AutoConfig.for_model(**preset.to_hf_config())
  assert hf_config.num_key_value_heads == preset.num_kv_heads
  assert hf_config.head_dim == preset.head_dim
  # The model transformers builds from the written fields, without memory (meta device), has
  # exactly our parameter count; so does our shape-first build.
  with torch.device("meta"):
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
  assert type(hf_model).__name__ == preset.to_hf_config()["architectures"][0]
  assert sum(p.numel() for p in hf_model.parameters()) == preset.num_params()
  abstract = nnx.eval_shape(lambda: models.Decoder(preset, rngs=nnx.Rngs(0)))
  leaves = jax.tree_util.tree_leaves(nnx.state(abstract, nnx.Param))
  assert sum(int(np.prod(x.shape)) for x in leaves) == preset.num_params()


def test_tokenizer_and_chat_template_from_checkpoint_dir(tmp_path):
  path = str(tmp_path / "ckpt")
  make_hf_checkpoint("qwen2", path)
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
  tokenizer.save_pretrained(path)

  loaded = models.load_tokenizer(path)
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
