"""bfloat16 parameters with float32 master weights: hand-computed steps, equivalence with the
wrapped optimizer for float32 parameters, and a tiny decoder that trains like its float32 twin."""

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

from bpo_jax import packing
from bpo_jax import sharding
from bpo_jax.models import Decoder, ModelConfig
from bpo_jax.training import precision
from bpo_jax.training import update
from bpo_jax.testing.tolerance import ulp_tol
from bpo_jax.training.settings import from_config

FLOAT32 = ModelConfig.tiny(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=8)
BFLOAT16 = FLOAT32.replace(dtype="bfloat16", param_dtype="bfloat16")


def _sgd_steps(tx, params, grad, steps):
  state = tx.init(params)
  for _ in range(steps):
    updates, state = tx.update(grad, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def test_small_updates_accumulate_in_the_master_copy():
  # SGD with lr 1 and gradient 1e-3: each update is far below half a bfloat16 ulp at 1.0
  # (2^-8 = 0.0039), so plain bfloat16 never moves; the master copy reaches 0.99 after ten
  # steps and the parameter is its bfloat16 rounding, 0.98828125 (0.9921875 is farther).
  params = {"w": jnp.ones((3,), jnp.bfloat16), "count": jnp.zeros((), jnp.int32)}
  grad = {"w": jnp.full((3,), 1e-3, jnp.bfloat16), "count": jnp.zeros((), jnp.int32)}
  plain, _ = _sgd_steps(optax.sgd(1.0), params, grad, 10)
  np.testing.assert_array_equal(plain["w"].astype(np.float32), np.ones(3, np.float32))
  tx = precision.with_float32_master_weights(optax.sgd(1.0))
  mixed, state = _sgd_steps(tx, params, grad, 10)
  assert mixed["w"].dtype == jnp.bfloat16 and mixed["count"].dtype == jnp.int32
  assert state.master["w"].dtype == jnp.float32
  expected_master = np.float32(1.0)
  for _ in range(10):  # the same float32 arithmetic, step by step
    expected_master = np.float32(expected_master - np.float32(jnp.bfloat16(1e-3)))
  np.testing.assert_array_equal(state.master["w"], np.full(3, expected_master))
  np.testing.assert_allclose(expected_master, 0.99, atol=1e-5)
  np.testing.assert_array_equal(mixed["w"].astype(np.float32), np.full(3, 0.98828125))


def test_float32_parameters_step_like_the_wrapped_optimizer():
  rng = np.random.default_rng(0)
  params = {"a": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
  inner = optax.adamw(1e-2, weight_decay=0.1)
  wrapped = precision.with_float32_master_weights(inner)
  p_inner, p_wrapped = params, params
  s_inner, s_wrapped = inner.init(params), wrapped.init(params)
  for _ in range(5):
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
    u, s_inner = inner.update(grads, s_inner, p_inner)
    p_inner = optax.apply_updates(p_inner, u)
    u, s_wrapped = wrapped.update(grads, s_wrapped, p_wrapped)
    p_wrapped = optax.apply_updates(p_wrapped, u)
    for name in params:
      np.testing.assert_array_equal(s_wrapped.master[name], p_inner[name])
      # float32 parameters are the master copy itself: bit for bit the plain optimizer's.
      np.testing.assert_array_equal(p_wrapped[name], p_inner[name])


def test_update_without_params_is_refused():
  tx = precision.with_float32_master_weights(optax.sgd(1.0))
  params = {"w": jnp.ones((2,), jnp.bfloat16)}
  with pytest.raises(ValueError, match="needs `params` in update"):
    tx.update(params, tx.init(params))


def test_master_copy_takes_the_parameter_sharding():
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=4, tensor=2), jax.devices()[:8])
  model = nnx.eval_shape(lambda: Decoder(BFLOAT16, rngs=nnx.Rngs(0)))
  _, params = nnx.split(model)
  tx = precision.with_float32_master_weights(optax.adamw(1e-3))
  opt_state = jax.eval_shape(tx.init, params)
  param_sh = sharding.param_shardings(params, mesh)
  opt_sh = sharding.optimizer_shardings(opt_state, params, param_sh, mesh)
  leaf = lambda tree: jax.tree.leaves(tree["layers"][0]["mlp"]["up_kernel"])[0]
  master = leaf(opt_state.master)
  assert master.dtype == jnp.float32 and master.shape == (32, 64)
  assert leaf(opt_sh.master).spec == leaf(param_sh).spec == P("fsdp", "tensor")
  assert leaf(opt_sh.inner[0].mu).spec == P("fsdp", "tensor")


def _sft_losses(config, master: bool, batch, steps=60, learning_rate=3e-5):
  graphdef, params = nnx.split(Decoder(FLOAT32, rngs=nnx.Rngs(0)))
  if config.param_dtype != "float32":  # the same initial weights, rounded
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))
    params = precision.cast_floating(params, config.params_dtype)
  tx = optax.adam(learning_rate)
  if master:
    tx = precision.with_float32_master_weights(tx)
  state = update.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                            opt_state=tx.init(params))
  step = update.make_sft_step(graphdef, tx, micro_batches=2)
  losses = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert all(leaf.dtype == config.params_dtype for leaf in jax.tree.leaves(state.params))
  return np.asarray(losses)


@pytest.mark.slow
def test_bfloat16_with_master_weights_trains_like_float32():
  rng = np.random.default_rng(0)
  trees = [packing.TreeTokens(
      prompt=rng.integers(0, 64, 5), parent=[-1, -1, 0, 0],
      action_tokens=[rng.integers(0, 64, 3) for _ in range(4)],
      action_logprobs=[np.full(3, -4.0) for _ in range(4)],
      observation_tokens=[rng.integers(0, 64, 2) for _ in range(4)]) for _ in range(4)]
  batch = packing.pack_trees(trees, [np.zeros(4)] * 4, [np.ones(4)] * 4, buckets=(32,))
  reference = _sft_losses(FLOAT32, master=False, batch=batch)
  mixed = _sft_losses(BFLOAT16, master=True, batch=batch)
  plain = _sft_losses(BFLOAT16, master=False, batch=batch)
  decrease = reference[0] - reference[-1]
  assert decrease > 0.05
  # Within one bfloat16 rounding of the float32 curve at every step (bfloat16 compute, at the
  # loss's magnitude), and the same progress.
  np.testing.assert_allclose(mixed, reference, rtol=0,
                             atol=ulp_tol(jnp.bfloat16, np.abs(reference).max(), 1))
  assert abs((mixed[0] - mixed[-1]) - decrease) < 0.05 * decrease
  # Without the master copy most of Adam's small steps round away: under half the progress.
  assert plain[0] - plain[-1] < 0.5 * decrease


def test_the_training_loop_reads_the_scale_precision_settings():
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top
  config = config_lib.default_config()
  plain = translate.model_config(from_config(config), vocab_size=50)
  assert (plain.param_dtype, plain.remat, plain.scan_layers) == ("float32", "none", False)
  params = {"w": jnp.ones((2,), jnp.float32)}
  assert not isinstance(translate.rl_optimizer(from_config(config)).init(params),
                        precision.MasterWeightsState)
  config.scale.param_dtype, config.scale.remat, config.scale.scan_layers = "bfloat16", "full", True
  mixed = translate.model_config(from_config(config), vocab_size=50)
  assert (mixed.param_dtype, mixed.remat, mixed.scan_layers) == ("bfloat16", "full", True)
  for make in (translate.rl_optimizer, translate.sft_optimizer):
    state = make(from_config(config)).init(precision.cast_floating(params, jnp.bfloat16))
    assert isinstance(state, precision.MasterWeightsState)
    assert state.master["w"].dtype == jnp.float32
  config.scale.master_weights = False
  assert not isinstance(translate.rl_optimizer(from_config(config)).init(params),
                        precision.MasterWeightsState)


def test_a_donated_step_takes_float32_parameters_and_their_master_copy():
  """A float32 parameter's master copy is its own buffer (a cast to float32 would return the
  same array), so a step donating the parameters and the optimizer state together runs: a
  float32 checkpoint trained with `scale.param_dtype = "bfloat16"` and master weights."""
  params = {"w": jnp.asarray([1.0, -2.0, 0.5], jnp.float32), "b": jnp.ones((2,), jnp.bfloat16)}
  tx = precision.with_float32_master_weights(optax.sgd(0.5))
  opt_state = tx.init(params)
  assert opt_state.master["w"] is not params["w"]
  np.testing.assert_array_equal(opt_state.master["w"], params["w"])

  def step(params, opt_state):
    grads = jax.tree.map(jnp.ones_like, params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params, opt_state = jax.jit(step, donate_argnums=(0, 1))(params, opt_state)
  np.testing.assert_array_equal(params["w"], np.asarray([0.5, -2.5, 0.0], np.float32))
  np.testing.assert_array_equal(opt_state.master["b"], np.full((2,), 0.5, np.float32))
