"""LoRA adapters: B = 0 is the base model exactly, training moves only the adapters, merging
keeps the function, export loads in transformers, and the k3 KL pulls toward the base."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import transformers
from flax import nnx

from bpo_jax import losses
from bpo_jax import models
from bpo_jax import sharding
from bpo_jax.models import KVCache, LoRAParam, ModelConfig
from bpo_jax.testing.hf_checkpoints import hf_logits
from bpo_jax.testing.model_rounding import forward_roundings, sum_roundings
from bpo_jax.testing.tolerance import assert_close

BASE = ModelConfig.tiny_qwen3(vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=8,
                              tie_word_embeddings=False)
LORA = BASE.replace(lora_rank=4, lora_alpha=8.0)
TOKENS = jnp.asarray(np.random.RandomState(0).randint(0, 64, (2, 10)), jnp.int32)
forward = jax.jit(models.forward, static_argnums=0)


def graphdef_of(config):
  return nnx.split(nnx.eval_shape(lambda: models.Decoder(config, rngs=nnx.Rngs(0))))[0]


def lora_model(b_scale=0.0, seed=0):
  """A LoRA model with base weights N(0, 0.2²) (norms around 1) and B ~ N(0, b_scale²)."""
  model = models.Decoder(LORA, rngs=nnx.Rngs(seed))
  state = nnx.state(model)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  new = []
  for (path, x), key in zip(leaves, keys):
    name = jax.tree_util.keystr(path)
    if "_lora_a" in name:
      new.append(x)
    elif "_lora_b" in name:
      new.append(b_scale * jax.random.normal(key, x.shape, x.dtype))
    else:
      new.append(x + 0.2 * jax.random.normal(key, x.shape, x.dtype))
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
  return model


def merging_roundings(config, slots):
  """A forward's roundings, plus on each layer's deepest path (q, o, gate, down) the rank-r sum
  of the adapter, the rounding of W + s·A·B and the addition of the two terms."""
  return forward_roundings(config, slots) + config.num_layers * 4 * (
      sum_roundings(config.lora_rank) + 2)


@pytest.mark.slow
def test_adapters_are_lora_params_and_counted():
  model = lora_model()
  adapters = jax.tree_util.tree_leaves(nnx.state(model, LoRAParam))
  base = jax.tree_util.tree_leaves(nnx.state(model, models.BASE_PARAMS))
  assert len(adapters) == 2 * 7 * LORA.num_layers
  assert sum(x.size for x in adapters) == LORA.num_lora_params()
  assert sum(x.size for x in base) == LORA.num_params() == BASE.num_params()
  q_a, q_b = model.layers[0].attn.q_lora_a[...], model.layers[0].attn.q_lora_b[...]
  assert q_a.shape == (32, 4) and q_b.shape == (4, 4, 8)  # A [in, r], B [r, heads, head_dim]
  assert model.layers[1].attn.o_lora_a[...].shape == (4, 8, 4)  # o's input is heads x head_dim
  assert not np.any(np.asarray(q_b))
  assert models.trainable_filter(LORA) is LoRAParam
  assert models.trainable_filter(BASE) is nnx.Param
  # Adapters are drawn after the base weights: the same base as without them.
  plain = models.Decoder(BASE, rngs=nnx.Rngs(3))
  adapted = models.Decoder(LORA, rngs=nnx.Rngs(3))
  for a, b in zip(jax.tree_util.tree_leaves(nnx.state(plain)),
                  jax.tree_util.tree_leaves(nnx.state(adapted, models.BASE_PARAMS))):
    np.testing.assert_array_equal(a, b)


def test_zero_b_gives_the_base_models_logits_exactly():
  model = lora_model()
  graphdef, state = nnx.split(model)
  base_state = models.merge_lora(state, LORA)  # W + s·A·0 = W exactly
  base_graphdef = graphdef_of(BASE)
  np.testing.assert_array_equal(forward(graphdef, state, TOKENS)[0],
                                forward(base_graphdef, base_state, TOKENS)[0])
  # With a cache too (the k / v adapters write the cached keys and values).
  cache = KVCache.init(BASE, 2, 16)
  got, got_cache = forward(graphdef, state, TOKENS, cache=cache)
  want, want_cache = forward(base_graphdef, base_state, TOKENS, cache=cache)
  np.testing.assert_array_equal(got, want)
  for a, b in zip(got_cache.keys + got_cache.values, want_cache.keys + want_cache.values):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_gradient_step_moves_only_the_adapters():
  model = lora_model()
  before = jax.tree_util.tree_map(np.asarray, nnx.state(model, models.BASE_PARAMS))
  optimizer = nnx.Optimizer(model, optax.sgd(0.5), wrt=LoRAParam)

  def loss(m):
    logits, _ = m(TOKENS)
    return jnp.mean(jnp.sin(logits) * jnp.arange(logits.shape[-1]) / logits.shape[-1])

  a_before = np.asarray(model.layers[0].mlp.up_lora_a[...])
  for step in range(2):
    grads = nnx.grad(loss, argnums=nnx.DiffState(0, LoRAParam))(model)
    assert {type(v) for v in jax.tree_util.tree_leaves(
        grads, is_leaf=lambda x: isinstance(x, nnx.Variable))} == {LoRAParam}
    optimizer.update(model, grads)
    if step == 0:
      # With B = 0 the gradient of A, x^T (∂L/∂y) B^T s, is exactly 0: only B moves at first.
      np.testing.assert_array_equal(model.layers[0].mlp.up_lora_a[...], a_before)
      assert np.abs(np.asarray(model.layers[0].mlp.up_lora_b[...])).max() > 0
  assert np.abs(np.asarray(model.layers[0].mlp.up_lora_a[...]) - a_before).max() > 0
  after = nnx.state(model, models.BASE_PARAMS)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(before),
                          jax.tree_util.tree_leaves(after)):
    np.testing.assert_array_equal(x, np.asarray(y), err_msg=jax.tree_util.keystr(path))
  # The pure form for a jitted update: differentiate the adapters with the base held fixed.
  graphdef, state = nnx.split(model)
  adapters, frozen = models.split_lora(state)
  pure_loss = lambda t: loss(nnx.merge(graphdef, nnx.merge_state(t, frozen)))
  pure_grads = jax.grad(pure_loss)(adapters)
  nnx_grads = nnx.grad(loss, argnums=nnx.DiffState(0, LoRAParam))(model)
  for g, h in zip(jax.tree_util.tree_leaves(pure_grads), jax.tree_util.tree_leaves(nnx_grads)):
    np.testing.assert_array_equal(g, h)


def test_merged_model_computes_the_unmerged_function():
  model = lora_model(b_scale=0.3)
  graphdef, state = nnx.split(model)
  unmerged, _ = forward(graphdef, state, TOKENS)
  base, _ = forward(graphdef_of(BASE), models.merge_lora(nnx.state(lora_model()), LORA), TOKENS)
  assert np.abs(np.asarray(unmerged) - np.asarray(base)).max() > 0.1  # the adapters matter
  merged = models.merged_model(model)
  assert merged.config == BASE and not nnx.state(merged, LoRAParam)
  got, _ = forward(*nnx.split(merged), TOKENS)
  assert_close(got, unmerged, steps=merging_roundings(LORA, TOKENS.shape[1]))
  # The input state is left as it was.
  assert model.layers[0].attn.q_lora_b[...].shape == (4, 4, 8)


def test_cached_decode_and_scanned_layers_with_adapters():
  model = lora_model(b_scale=0.3)
  graphdef, state = nnx.split(model)
  full, _ = forward(graphdef, state, TOKENS)
  roundings = forward_roundings(LORA, TOKENS.shape[1])
  logits, cache = forward(graphdef, state, TOKENS[:, :7], cache=KVCache.init(LORA, 2, 16))
  steps = [logits]
  for t in range(7, 10):
    logits, cache = forward(graphdef, state, TOKENS[:, t:t + 1], cache=cache)
    steps.append(logits)
  assert_close(jnp.concatenate(steps, axis=1), full, steps=roundings)
  scanned, _ = forward(graphdef_of(LORA.replace(scan_layers=True, remat="full")), state, TOKENS)
  assert_close(scanned, full, steps=roundings)


def test_export_merges_and_loads_in_transformers(tmp_path):
  model = lora_model(b_scale=0.3)
  unmerged, _ = forward(*nnx.split(model), TOKENS)
  out = str(tmp_path / "export")
  models.save_hf_checkpoint(model, out)
  with open(os.path.join(out, "config.json")) as f:
    assert not [k for k in json.load(f) if "lora" in k]
  reloaded, config = models.load_hf_checkpoint(out)
  assert config == BASE
  merged = models.merged_model(model)
  for a, b in zip(jax.tree_util.tree_leaves(nnx.state(merged, nnx.Param)),
                  jax.tree_util.tree_leaves(nnx.state(reloaded, nnx.Param))):
    np.testing.assert_array_equal(a, b)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(hf_model).__name__ == "Qwen3ForCausalLM"
  assert_close(hf_logits(hf_model, np.asarray(TOKENS)), unmerged,
               steps=merging_roundings(LORA, TOKENS.shape[1]))


@pytest.mark.slow
def test_k3_kl_to_the_base_model_shrinks_under_its_gradient():
  """The reference is the base model (B = 0); a policy whose adapters moved away descends the
  k3 KL on its own tokens toward it."""
  policy = lora_model(b_scale=0.3)
  graphdef, state = nnx.split(policy)
  adapters, frozen = models.split_lora(state)
  reference = models.merge_lora(nnx.state(lora_model()), LORA)
  targets = jnp.roll(TOKENS, -1, axis=1)
  mask = jnp.ones(TOKENS.shape).at[:, -1].set(0.0)
  ref_logp, _ = models.token_logprobs_and_entropy(graphdef_of(BASE), reference, TOKENS, targets)

  @jax.jit
  def mean_kl(t):
    logp, _ = models.token_logprobs_and_entropy(graphdef, nnx.merge_state(t, frozen), TOKENS,
                                                targets)
    return jnp.sum(losses.k3_kl(logp, ref_logp, mask)) / jnp.sum(mask)

  kls = [float(mean_kl(adapters))]
  for _ in range(5):  # plain gradient descent, a step small enough to descend monotonically
    grads = jax.grad(mean_kl)(adapters)
    adapters = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, adapters, grads)
    kls.append(float(mean_kl(adapters)))
  assert kls[0] > 0.05, kls
  assert all(b < a for a, b in zip(kls, kls[1:])) and kls[-1] < 0.5 * kls[0], kls


def test_adapters_have_logical_axes_for_sharding():
  model = lora_model()
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]).reshape(1, 1, 2), sharding.MESH_AXES)
  specs = sharding.param_specs(nnx.state(model), mesh)
  P = jax.sharding.PartitionSpec
  # B follows its kernel's output axes (q: heads over "tensor"); the rank axis is replicated.
  assert specs["layers"][0]["attn"]["q_lora_b"] == P(None, "tensor", None)
  assert specs["layers"][0]["mlp"]["down_lora_a"] == P("tensor", None)


@pytest.mark.parametrize("fields, message", [
    (dict(lora_rank=-2), r"lora_rank must be >= 0"),
    (dict(lora_rank=True), "lora_rank must be an int"),
    (dict(lora_rank=9), r"lora_rank 9 exceeds the k projection's smaller dimension \(32 -> 8\)"),
    (dict(lora_rank=2, lora_alpha=-1.0), "lora_alpha must be positive"),
])
def test_config_refuses_ranks_the_model_cannot_take(fields, message):
  small = dict(hidden_size=32, num_heads=4, num_kv_heads=1, head_dim=8)
  with pytest.raises(ValueError, match=message):
    ModelConfig.tiny(**small, **fields)
  assert ModelConfig.tiny(**small, lora_rank=8).lora_scale == 16.0 / 8
