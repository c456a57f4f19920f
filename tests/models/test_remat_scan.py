"""Rematerialisation and the scanned layer stack change memory and compile time, not numbers:
logits and gradients equal the plain layer loop's, with and without a packed-tree mask."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax.models import Decoder, ModelConfig
from bpo_jax.models.decoder import forward
from bpo_jax.testing.model_rounding import forward_roundings, sum_roundings
from bpo_jax.testing.tolerance import assert_close

BASE = ModelConfig.tiny_llama(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3,
                              num_heads=4, num_kv_heads=2, head_dim=8)


def _graphdef(config):
  return nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))[0]


def _loss_and_grads(graphdef, params, tokens, mask):
  def loss(p):
    logits, _ = forward(graphdef, p, tokens, attention_mask=mask)
    # A nonlinear read-out so every logit's gradient differs.
    return jnp.sum(jnp.sin(logits) * jnp.arange(logits.shape[-1]) / logits.shape[-1]), logits
  (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return value, logits, grads


def _inputs():
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 64, (2, 10)), jnp.int32)
  # A packed-tree style mask: causal, with one branch (positions 6..9) not seeing 3..5.
  mask = np.tril(np.ones((10, 10), bool))
  mask[6:, 3:6] = False
  return tokens, jnp.asarray(np.broadcast_to(mask, (2, 10, 10)))


@pytest.fixture(scope="module")
def reference():
  _, params = nnx.split(Decoder(BASE, rngs=nnx.Rngs(3)))
  return params, _loss_and_grads(_graphdef(BASE), params, *_inputs())


@pytest.mark.parametrize("remat,scan_layers", [("full", False), ("full", True), ("dots", True)])
def test_remat_and_scan_match_the_layer_loop(reference, remat, scan_layers):
  params, (ref_value, ref_logits, ref_grads) = reference
  config = BASE.replace(remat=remat, scan_layers=scan_layers)
  value, logits, grads = _loss_and_grads(_graphdef(config), params, *_inputs())
  # The same operations in other fusions: a forward's roundings for the logits; the loss sums
  # B·T·V terms that carry the logits' relative error; the backward pass walks the path again.
  roundings = forward_roundings(BASE, 10)
  assert_close(logits, ref_logits, steps=roundings)
  assert_close(value, ref_value, steps=roundings + sum_roundings(ref_logits.size))
  for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)):
    assert_close(g, r, steps=2 * roundings, err_msg=jax.tree_util.keystr(path))


def test_remat_inserts_recomputation_and_scan_a_loop():
  _, params = nnx.split(Decoder(BASE, rngs=nnx.Rngs(3)))
  tokens = jnp.zeros((1, 4), jnp.int32)

  def grad_jaxpr(config):
    graphdef = _graphdef(config)
    return str(jax.make_jaxpr(jax.grad(
        lambda p: jnp.sum(forward(graphdef, p, tokens)[0])))(params))

  plain = grad_jaxpr(BASE)
  assert "remat" not in plain and "scan" not in plain
  rematerialised = grad_jaxpr(BASE.replace(remat="full"))
  assert rematerialised.count("checkpoint") + rematerialised.count("remat") >= BASE.num_layers
  scanned = grad_jaxpr(BASE.replace(scan_layers=True, remat="full"))
  assert "scan" in scanned


def test_unknown_remat_policy_is_refused():
  with pytest.raises(ValueError, match="remat must be one of .'none', 'full', 'dots'., got 'all'"):
    ModelConfig.tiny(remat="all")
