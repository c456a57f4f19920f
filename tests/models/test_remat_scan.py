"""Rematerialisation and the scanned layer stack change memory and compile time, not numbers:
logits and gradients equal the plain layer loop's, with and without a packed-tree mask; the
sampler's scanned decode draws the layer loop's tokens, from a program whose size does not grow
with depth."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import sampling
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


@pytest.mark.slow
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


def _decode(config, params, page_size=0):
  """Prompts of four lengths prefilled, 8 drawn tokens, 3 tokens appended to two rows, 8
  more drawn (a donating sampler, as the rollout engine's), with fixed keys: each generate's
  (tokens, logprobs, entropies)."""
  sampler = sampling.Sampler(_graphdef(config), config, 48, donate=True, page_size=page_size)
  prompts = [np.random.RandomState(s).randint(0, 64, n).tolist()
             for s, n in ((1, 5), (2, 11), (3, 8), (4, 2))]
  draw = sampling.SamplingParams(temperature=1.0, max_new_tokens=8)
  ds = sampler.prefill(params, prompts)
  ds, first = sampler.generate(params, ds, jax.random.key(0), draw)
  ds = sampler.append(params, ds, {0: [3, 4, 5], 2: [6, 7, 8]})
  _, second = sampler.generate(params, ds, jax.random.key(1), draw)
  return [np.asarray(x) for out in (first, second)
          for x in (out.tokens, out.logprobs, out.entropies)]


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [0, 8])
def test_scanned_decode_samples_the_unrolled_tokens(page_size):
  """The sampler's programs with the layers scanned (the dense cache's layers stacked in the
  scan's carry, or the paged cache's pools, each layer at its pages' offset) draw the same
  tokens for the same keys, and their logprobs and entropies agree within a cached forward's
  roundings."""
  _, params = nnx.split(Decoder(BASE, rngs=nnx.Rngs(3)))
  unrolled = _decode(BASE, params, page_size)
  scanned = _decode(BASE.replace(scan_layers=True), params, page_size)
  steps = forward_roundings(BASE, 48, logprobs=True)
  for i, (a, b) in enumerate(zip(scanned, unrolled)):
    if i % 3 == 0:
      np.testing.assert_array_equal(a, b)
    else:
      assert_close(a, b, steps=steps, magnitude=max(1.0, float(np.abs(b).max())))


def _decode_program(config, page_size=0):
  """The text of the sampler's decode loop (`generate`) lowered for 2 rows of 32 slots, and
  of a continued prefill (`append`), on the dense cache or a paged one (pages of
  `page_size`)."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))
  sampler = sampling.Sampler(graphdef, config, 32, page_size=page_size)
  if page_size:  # as a compiled call takes it: the host's bookkeeping left out
    ds = sampler.init_state(2)
    ds = ds.replace(cache=ds.cache.without_book())
  else:
    ds = jax.eval_shape(lambda: sampling.init_decode_state(config, 2, 32))
  generate = sampler.lower_generate(state, ds, jax.random.key(0),
                                    sampling.SamplingParams(max_new_tokens=4),
                                    jnp.ones((2,), bool)).as_text()
  append = sampling._append_jit.lower(  # pylint: disable=protected-access
      graphdef, state, ds, jnp.zeros((2, 3), jnp.int32), jnp.ones((2,), jnp.int32)).as_text()
  return generate, append


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [0, 8])
def test_the_scanned_decode_program_does_not_grow_with_depth(page_size):
  """From 2 to 8 layers the scanned decode loop keeps its matmuls (one layer body) and its
  text grows by under 10% (the stacking of each layer's weights, and of a dense cache: a line
  or two per layer); the layer loop's doubles. The same with a paged cache."""
  shallow, deep = (BASE.replace(num_layers=n) for n in (2, 8))
  for scan in (True, False):
    (gen2, app2), (gen8, app8) = (_decode_program(c.replace(scan_layers=scan), page_size)
                                  for c in (shallow, deep))
    dots = [text.count("dot_general") for text in (gen2, gen8, app2, app8)]
    lines = [len(text.splitlines()) for text in (gen2, gen8)]
    if scan:
      assert dots[0] == dots[1] and dots[2] == dots[3], dots
      assert lines[1] <= 1.1 * lines[0], lines
    else:
      assert dots[1] > 3 * dots[0] and dots[3] > 3 * dots[2], dots
      assert lines[1] > 1.5 * lines[0], lines
