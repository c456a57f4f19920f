"""The run's start-up program set: when it is compiled, and the shapes it covers, by hand."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import branching
from bpo_jax import precompiled
from bpo_jax import sampling_shapes
from bpo_jax import tree as tree_lib
from bpo_jax.rollout import records
from bpo_jax.training import estimator_registry
from bpo_jax.training import iteration
from bpo_jax.training import settings as settings_lib
from bpo_jax.training import startup
from bpo_jax.training import translate
from experiments.configs import base


def test_auto_compiles_on_accelerators_only():
  assert [startup.wanted(s, "cpu") for s in ("auto", "on", "off")] == [False, True, False]
  assert [startup.wanted(s, "gpu") for s in ("auto", "on", "off")] == [True, True, False]
  assert startup.wanted("auto", "tpu")
  with pytest.raises(ValueError, match="startup_compile"):
    startup.wanted("yes", "cpu")


def _settings(estimator: str, **changes):
  config = base.tiny(base.rooms(estimator))
  for key, value in changes.items():
    section, name = key.split("__")
    config[section][name] = value
  return settings_lib.from_config(config)


def test_decode_rows_and_row_lengths_of_the_tiny_runs_by_hand():
  # BPO: 2 tasks x 1 tree x 2 leaves = 4 rows, 4 held-out tasks; trees of at most
  # 2 x 320 = 640 tokens (under max_tree_tokens 1024) fill rows up to the 1024 bucket.
  bpo = _settings("bpo")
  assert startup.max_decode_rows(bpo) == 4
  assert startup.update_row_lengths(bpo) == [128, 256, 512, 1024]
  # 8 held-out tasks are more rows than the rollout's 4; over 3 processes: ceil(8 / 3) = 3.
  assert startup.max_decode_rows(_settings("bpo", eval__num_tasks=8)) == 8
  assert startup.max_decode_rows(_settings("bpo", eval__num_tasks=8), process_count=3) == 3
  # 4 leaves x 320 = 1280 tokens, but max_tree_tokens 1000 caps a tree: buckets to 1024.
  capped = _settings("bpo", rollout__max_leaves=4, rollout__max_tree_tokens=1000)
  assert startup.max_decode_rows(capped) == 8
  assert startup.update_row_lengths(capped) == [128, 256, 512, 1024]
  # GRPO: groups of 2 episodes (the env-step budget of one fork's leaves), 2 x 320 tokens.
  grpo = _settings("grpo")
  assert startup.max_decode_rows(grpo) == 4
  assert startup.update_row_lengths(grpo) == [128, 256, 512, 1024]


def test_a_paged_pool_is_sized_once_for_the_rollouts_and_the_evaluations():
  # 8 held-out tasks decode 8 rows at once, each 320 slots in pages of 16 (20 pages) plus one
  # copied page: 8 · 21 + 1 (the null page) = 169 pages; the evaluation's engine the same.
  paged = _settings("bpo", eval__num_tasks=8, model__kv_page_size=16)
  assert translate.kv_pool_pages(8, 320, 16) == 169
  assert translate.rollout_config(paged).kv_pool_pages == 169
  assert translate.rollout_config(paged, evaluation=True).kv_pool_pages == 169
  # A page of 24 slots: ⌈320 / 24⌉ = 14 pages per row.
  assert translate.kv_pool_pages(8, 320, 24) == 8 * 15 + 1
  assert translate.rollout_config(_settings("bpo")).kv_pool_pages == 0  # the dense cache


def test_prompt_rows_and_token_bounds_by_hand():
  # 2 trees or 4 held-out prompts at once; 8 held-out tasks over 3 processes: 3.
  assert startup.prompt_rows(_settings("bpo")) == 4
  assert startup.prompt_rows(_settings("bpo", eval__num_tasks=8), process_count=3) == 3
  fmt = types.SimpleNamespace(max_observation_tokens=40, prompt_overhead=57,
                              observation_overhead=9)
  assert startup.token_bounds(fmt) == (57 + 40, 9 + 40 + 1)
  assert startup.token_bounds(types.SimpleNamespace(max_observation_tokens=None)) == (None, None)


def test_the_tiny_run_set_has_eleven_appends_two_decode_loops_per_batch():
  keys = sampling_shapes.sampler_program_keys(
      sampling_shapes.batch_sizes((8, 16, 32, 64, 128, 256), 4), 320)
  assert [k.batch for k in keys] == [8] * 13
  assert sum(k.name == "append" for k in keys) == 11


@pytest.mark.parametrize("estimator", ["bpo", "grpo"])
def test_the_estimator_compiled_at_start_up_gives_the_jitted_estimators_numbers(estimator):
  """The set's estimator (2 tasks x 1 tree of the tiny run's node capacity) on two trees of
  two 3-step episodes from the root, leaf rewards (1, 0) and (0.5, 2): the numbers of the
  estimator jitted on first use, bit for bit (one program, two compiles), run from the set (a
  hit, no miss)."""
  settings = _settings(estimator)
  key, static = iteration.estimator_program(settings)
  capacity = translate.rollout_config(settings).node_capacity
  assert (key.name, key.batch, key.tokens) == ("estimator", 2, capacity)
  programs = precompiled.ProgramSet()
  startup.compile_estimator(programs, settings)
  assert list(programs.seconds) == [key]
  trees = tree_lib.stack_trees([
      tree_lib.from_parents([-1, 0, 1, -1, 3, 4], [0, 0, a, 0, 0, b], capacity=capacity)
      for a, b in ((1.0, 0.0), (0.5, 2.0))])
  on_device = jax.device_put(trees)
  ran = programs.run(key, (on_device,), {}, None)
  jitted = estimator_registry.advantages_and_weights(on_device, **static)
  assert (programs.hits, programs.misses) == (1, 0)
  for a, b in zip(ran, jitted):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert np.abs(np.asarray(ran[0])).max() > 0  # the advantages are not all zero


def test_the_threshold_update_compiled_at_start_up_gives_the_jitted_numbers():
  """With `rollout.entropy_quantile` 0.5 the set holds the threshold's update at every padded
  size of at most 2 trees x N nodes (16 for the tiny run's 2 x 8); on 5 decisions' entropies
  it gives the jitted update's numbers bit for bit, as a hit. By hand: entropies 0..4, median
  2, mixed with the running 1.0 as 0.9 x 1.0 + 0.1 x 2 = 1.1."""
  settings = _settings("bpo", rollout__entropy_quantile=0.5)
  capacity = translate.rollout_config(settings).node_capacity
  programs = precompiled.ProgramSet()
  startup.compile_threshold(programs, settings)
  sizes = sorted({records.threshold_size(n) for n in range(1, 2 * capacity + 1)})
  assert (capacity, sizes) == (8, [16])
  assert list(programs.seconds) == [records.threshold_key(s, 0.5, 0.9) for s in sizes]
  batch = types.SimpleNamespace(state_entropies=lambda: np.arange(5, dtype=np.float32))
  running = branching.QuantileThreshold(jnp.float32(1.0), jnp.int32(3))
  ran = records.RolloutBatch.update_threshold(batch, running, 0.5, programs=programs)
  jitted = records.RolloutBatch.update_threshold(batch, running, 0.5)
  assert (programs.hits, programs.misses) == (1, 0)
  assert (float(ran.threshold), int(ran.num_updates)) == (float(jitted.threshold), 4)
  assert float(ran.threshold) == pytest.approx(1.1, abs=1e-6)
  empty = precompiled.ProgramSet()
  startup.compile_threshold(empty, _settings("bpo", rollout__entropy_quantile=0.0))
  assert not empty.seconds  # without a quantile the threshold stays as configured
