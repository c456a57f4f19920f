"""What samplers decode: a LoRA run's policy with its adapters merged into the kernels, by one
compiled program, computing the adapter model's function."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bpo_jax import models
from bpo_jax.models import LoRAParam, ModelConfig
from bpo_jax.testing.model_rounding import forward_roundings, sum_roundings
from bpo_jax.testing.tolerance import assert_close
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import iteration as iteration_lib
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import update as update_lib

LORA = ModelConfig.tiny_qwen3(vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=8,
                              tie_word_embeddings=False, lora_rank=4, lora_alpha=8.0)
TOKENS = jnp.asarray(np.random.RandomState(0).randint(0, 64, (2, 10)), jnp.int32)
forward = jax.jit(models.forward, static_argnums=0)


def _experiment_and_adapters():
  """An experiment of the LoRA model (only its model fields), and its adapters with B drawn
  N(0, 0.3²) so that they change the function."""
  graphdef, state = nnx.split(models.Decoder(LORA, rngs=nnx.Rngs(0)))
  adapters, frozen = models.split_lora(state)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(adapters)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  adapters = jax.tree_util.tree_unflatten(treedef, [
      0.3 * jax.random.normal(k, x.shape, x.dtype) if "_lora_b" in jax.tree_util.keystr(p)
      else x for (p, x), k in zip(leaves, keys)])
  exp = experiment_lib.Experiment(settings=None, workdir="", tokenizer=None, fmt=None,
                                  model_config=LORA, graphdef=graphdef, train_tasks=[],
                                  eval_tasks=[], pool=None, frozen=frozen)
  return exp, adapters


@pytest.mark.slow
def test_sampling_params_are_the_merged_model_without_adapter_leaves():
  exp, adapters = _experiment_and_adapters()
  sampled = iteration_lib.policy_for_sampling(exp, placement_lib.Placement(), adapters)
  assert not jax.tree.leaves(nnx.state(nnx.merge(exp.sampling_graphdef, sampled), LoRAParam))
  assert not [p for p, _ in jax.tree_util.tree_flatten_with_path(sampled)[0]
              if "_lora_" in jax.tree_util.keystr(p)]
  assert nnx.merge(exp.sampling_graphdef, sampled).config == LORA.without_lora()
  unmerged, _ = forward(exp.graphdef, exp.full_params(adapters), TOKENS)
  base, _ = forward(exp.graphdef, exp.full_params(jax.tree.map(jnp.zeros_like, adapters)),
                    TOKENS)
  assert np.abs(np.asarray(unmerged) - np.asarray(base)).max() > 0.1  # the adapters matter
  merged, _ = forward(exp.sampling_graphdef, sampled, TOKENS)
  # A forward's roundings, plus on each layer's deepest path (q, o, gate, down) the adapter's
  # rank-r sum, the rounding of W + s·A·B and the addition of the two terms.
  steps = forward_roundings(LORA, TOKENS.shape[1]) + LORA.num_layers * 4 * (
      sum_roundings(LORA.lora_rank) + 2)
  assert_close(merged, unmerged, steps=steps)
  # The cached decode path (what a sampler runs) on the merged parameters, token by token.
  cache = models.KVCache.init(LORA, 2, 16)
  steps_out = []
  for t in range(TOKENS.shape[1]):
    logits, cache = forward(exp.sampling_graphdef, sampled, TOKENS[:, t:t + 1], cache=cache)
    steps_out.append(logits)
  assert_close(jnp.concatenate(steps_out, axis=1), unmerged, steps=steps)


def test_the_merge_compiles_once_across_iterations():
  exp, adapters = _experiment_and_adapters()
  program = experiment_lib._merge_program(LORA)  # pylint: disable=protected-access
  first = exp.sampling_params(adapters)
  moved = jax.tree.map(lambda x: x + 0.01, adapters)  # the next iteration's adapters
  second = exp.sampling_params(moved)
  assert program._cache_size() == 1  # pylint: disable=protected-access
  assert jax.tree.structure(first) == jax.tree.structure(second)
  q = lambda p: np.asarray(p["layers"][0]["attn"]["q_kernel"][...])
  assert not np.array_equal(q(first), q(second))
  # Without adapters the samplers decode the train state's parameters themselves.
  plain = experiment_lib.Experiment(settings=None, workdir="", tokenizer=None, fmt=None,
                                    model_config=LORA.without_lora(), graphdef=exp.graphdef,
                                    train_tasks=[], eval_tasks=[], pool=None)
  assert plain.sampling_params(adapters) is adapters
  assert plain.sampling_graphdef is plain.graphdef


def _adam_step(tx):
  """A train step of `tx` on a gradient of ones: the update's inputs and outputs, in kind."""

  def step(state):
    grads = jax.tree.map(jnp.ones_like, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return update_lib.TrainState(step=state.step + 1, opt_state=opt_state,
                                 params=optax.apply_updates(state.params, updates))

  return step


@pytest.mark.parametrize("precompiled", [False, True])
def test_the_initial_state_is_placed_as_the_update_returns_it(precompiled):
  """The unsharded initial train state and the first update's output have one placement, so
  the merge (and the update itself) run the program of the first call on the second: the
  update either jitted or an executable compiled ahead, as the start-up set runs it."""
  exp, adapters = _experiment_and_adapters()
  placement = placement_lib.Placement()
  tx = update_lib.with_fixed_state_dtypes(optax.adam(1e-3))
  state = placement.init_state(tx, placement.place_params(adapters))
  device = jax.local_devices()[0]
  assert all(x.committed and x.devices() == {device} for x in jax.tree.leaves(state))
  jitted = jax.jit(_adam_step(tx))
  # The start-up set lowers on abstract arrays placed on the first device (`compile_update`).
  update = jitted.lower(placement.abstract(state)).compile() if precompiled else jitted
  program = experiment_lib._merge_program(LORA)  # pylint: disable=protected-access
  exp.sampling_params(state.params)
  merges = program._cache_size()  # pylint: disable=protected-access
  updated = update(state)
  updated = update(updated)  # the second iteration's update, on the first one's output
  exp.sampling_params(updated.params)
  assert program._cache_size() == merges  # pylint: disable=protected-access
  assert jitted._cache_size() == (0 if precompiled else 1)  # pylint: disable=protected-access
  assert [(x.committed, x.devices()) for x in jax.tree.leaves(updated)] == [
      (x.committed, x.devices()) for x in jax.tree.leaves(state)]
  assert int(updated.step) == 2
