"""A run's closed program set, compiled at start-up (docs/DESIGN.md §2).

Everything the loop's rollouts, evaluations and updates execute is compiled before the first
of them, for every shape the run's settings allow:

  * the sampler's continued prefill and decode loops (`precompiled.compile_sampler_programs`)
    for the batch sizes of up to `max_decode_rows` live rows, every window of the cache and the
    token buckets of the longest prompt (on up to `prompt_rows` rows) and observation the chat
    format allows (`token_bounds`; `sampling_shapes.sampler_program_keys`), shared by rollouts
    and evaluations;
  * the update step (`update.make_train_step`, through `UpdateSetup.train_step`) on the
    loop's padded row count at every packed row length a tree can fill (`update_row_lengths`);
  * the estimator on the iteration's stacked trees (`compile_estimator`), and the fork
    threshold's update at each padded size of the iteration's decisions (`compile_threshold`).

Each program's seconds are logged (absl, one line each) and the total goes into the run's
metrics as one record of phase "startup". The executables are kept by shape where they are
called (`Sampler.programs`, `PrecompiledStep`, `iteration.estimate_and_pack`); a shape outside
the set still runs, compiled on its call, and counts as a miss (`ProgramSet.misses`,
`compile_misses` in each training record).

`scale.startup_compile`: "auto" compiles the set on accelerators, where a program's first call
would otherwise stall the first iteration (GEMM autotuning per shape), and leaves it off on the
CPU, where a short run meets a few of the set's shapes and compiling the others costs more than
the run saves; "on" and "off" force it. The set covers one device and a mesh alike: on a mesh
the decode programs take the parameters in the sampling layout of this process's devices
(`Placement.abstract_for_sampling`) and the cache in `sharding.cache_shardings`'s, the update
the train state's and the rows' layouts. A paged KV cache's pool has one size for the whole
run (`translate.kv_pool_pages`), so its programs are in the set as the dense cache's are.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from absl import logging
import jax

from bpo_jax import branching
from bpo_jax import packing
from bpo_jax import precompiled
from bpo_jax import rollout as rollout_lib
from bpo_jax import sampling_shapes
from bpo_jax import tree as tree_lib
from bpo_jax.rollout import records
from bpo_jax.training import estimator_registry
from bpo_jax.training import iteration as iteration_lib
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import translate

# `scale.startup_compile` values.
AUTO, ON, OFF = "auto", "on", "off"


def wanted(setting: str, platform: str | None = None) -> bool:
  """Whether `scale.startup_compile` = `setting` compiles the set on `platform` (default: the
  first local device's): "on", or "auto" anywhere but the CPU."""
  if setting not in (AUTO, ON, OFF):
    raise ValueError(f"scale.startup_compile must be 'auto', 'on' or 'off', got {setting!r}")
  platform = platform or jax.local_devices()[0].platform
  return setting == ON or (setting == AUTO and platform != "cpu")


def max_decode_rows(settings, process_count: int = 1) -> int:
  """The most rows one process decodes at once (`translate.decode_rows` of the run's training
  rollouts)."""
  return translate.decode_rows(settings, translate.rollout_config(settings), process_count)


def update_row_lengths(settings) -> list[int]:
  """The packed row lengths the update can meet: the row buckets (`translate.row_buckets`) up to
  the one holding the longest packed tree.

  A tree is packed into one row, each distinct token once. Its tokens lie on its leaves' paths,
  each at most L = `model.max_length` tokens, so a tree of at most n leaves (BPO: `max_leaves`;
  a group: its episodes) holds at most n·L; with the "worst_case" accounting BPO's trees also
  process at most `max_tree_tokens`. The row lengths are the buckets ≤ bucket(min of those).
  Example: 2 leaves of 320 tokens, max_tree_tokens 1024 → 640 → [128, 256, 512, 1024].
  """
  rollout = translate.rollout_config(settings)
  branches = (rollout.episodes_per_group if rollout.topology == "group"
              else rollout.max_leaves or rollout.node_capacity)
  longest = branches * rollout.max_length
  if rollout.max_tree_tokens is not None and rollout.budget_accounting == "worst_case":
    longest = min(longest, rollout.max_tree_tokens)
  buckets = translate.row_buckets(settings)
  return [b for b in buckets if b <= packing.choose_bucket(min(longest, buckets[-1]), buckets)]


def prompt_rows(settings, process_count: int = 1) -> int:
  """The most prompts one process prefills at once: its share of the iteration's trees (each
  tree or group starts from one backbone) or of the held-out tasks, whichever is more."""
  trees = settings.rollout.tasks_per_iteration * settings.rollout.trees_per_task
  return max(-(-trees // process_count), -(-settings.eval.num_tasks // process_count))


def token_bounds(fmt) -> tuple[int | None, int | None]:
  """(most tokens of a prompt, of an observation piece) in chat format `fmt`: the template's
  overheads plus `max_observation_tokens`, and a piece after a reply cut by the token limit
  one token more (`text.ChatFormat`); (None, None) when observations are not cut."""
  n = fmt.max_observation_tokens
  if n is None:
    return None, None
  return fmt.prompt_overhead + n, fmt.observation_overhead + n + 1


class PrecompiledStep:
  """The update step run from the set's executables, keyed by the packed batch's shape
  (`ProgramKey("train_step", rows, row_length)`); any other shape compiles on its call."""

  def __init__(self, train_step: Callable, programs: precompiled.ProgramSet):
    self.train_step = train_step
    self.programs = programs

  def __call__(self, state, batch, ref=None, num_trees=None, frozen=None):
    rows, length = batch.tokens.shape
    key = sampling_shapes.ProgramKey("train_step", rows, length, 0)
    return self.programs.run(key, (state, batch, ref, num_trees, frozen), {}, self.train_step)


def _abstract_on_device(tree):
  """`tree`'s arrays as abstract arrays with their shardings (None stays None)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tree)


def compile_update(programs: precompiled.ProgramSet, exp, setup, ref_params) -> None:
  """Compiles `setup.train_step` (a `loop.UpdateSetup`) into `programs` on the loop's padded
  row count at every packed row length it can meet (`update_row_lengths`), as `ppo_epochs`
  calls it."""
  settings = exp.settings
  placement = setup.placement
  num_tasks = settings.rollout.tasks_per_iteration * settings.rollout.trees_per_task
  rows = placement_lib.row_count(num_tasks, settings.train.micro_batches * placement.row_shards)
  state = placement.abstract(setup.local_state)
  ref = None if ref_params is None else state.params
  frozen = None if exp.frozen is None else _abstract_on_device(exp.frozen)
  jitted = getattr(setup.train_step, "jitted", setup.train_step)
  num_trees = jax.ShapeDtypeStruct((), jax.numpy.int32, weak_type=True)
  for length in update_row_lengths(settings):
    batch = packing.abstract_batch(rows, length, placement.row_sharding)
    programs.compile(sampling_shapes.ProgramKey("train_step", rows, length, 0),
                     lambda batch=batch: jitted.lower(state, batch, ref, num_trees, frozen))


def compile_estimator(programs: precompiled.ProgramSet, settings) -> None:
  """Compiles the estimator into `programs` on the iteration's stacked trees
  (`iteration.estimator_program`): trees of padding nodes give their shapes and dtypes."""
  key, static = iteration_lib.estimator_program(settings)
  trees = precompiled.abstract(tree_lib.stack_trees([tree_lib.empty_tree(key.tokens)] * key.batch))
  programs.compile(key, lambda: estimator_registry.advantages_and_weights.lower(trees, **static))


def compile_threshold(programs: precompiled.ProgramSet, settings) -> None:
  """Compiles the fork threshold's update (with `rollout.entropy_quantile` > 0) into `programs`
  at every padded size an iteration's decisions can take (`records.threshold_size`): a decision
  precedes each step and each step is a node, so its T trees of N nodes make at most T x N (a
  fork whose snapshot failed adds one without a node; a size past the set runs as a miss)."""
  quantile = settings.rollout.entropy_quantile
  if quantile <= 0:
    return
  key, _ = iteration_lib.estimator_program(settings)
  running = jax.eval_shape(lambda: branching.init_quantile_threshold(0.0))
  decay = records.THRESHOLD_DECAY
  for size in sorted({records.threshold_size(n) for n in range(1, key.batch * key.tokens + 1)}):
    entropy = jax.ShapeDtypeStruct((size,), jax.numpy.float32)
    mask = jax.ShapeDtypeStruct((size,), jax.numpy.bool_)
    programs.compile(records.threshold_key(size, quantile, decay),
                     lambda entropy=entropy, mask=mask: records.UPDATE_QUANTILE.lower(
                         running, entropy, mask, quantile=float(quantile), decay=decay))


def applies(settings) -> bool:
  """Whether the run compiles its set at start-up: `scale.startup_compile` says so for this
  platform (on one device or a mesh alike)."""
  return wanted(settings.scale.startup_compile)


def start(exp, setup, params, compile_set: bool = True) -> tuple[Any, Any, Callable, dict | None]:
  """The run's rollout engine and update step, their programs compiled first where that
  applies (`applies`) and `compile_set` asks for it (the loop: an iteration is left to run),
  for the trainable `params` (their shapes; values unused).

  Returns (the experiment, holding the set as `programs` for the evaluations, or None; the
  engine; the update step to call; the "startup" metrics record, or None without a set).
  """
  settings = exp.settings
  config = translate.rollout_config(settings)
  programs = None
  if compile_set and applies(settings):
    programs = precompiled.ProgramSet(config.sampling_params(exp.fmt.stop_token_ids).limits())
  exp = dataclasses.replace(exp, programs=programs)
  engine = rollout_lib.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt, exp.pool,
                                     config, programs=programs)
  if programs is None:
    return exp, engine, setup.train_step, None
  sampling_params = setup.placement.abstract_for_sampling(
      jax.eval_shape(exp.sampling_params, params))
  processes = jax.process_count()
  longest_prompt, longest_observation = token_bounds(exp.fmt)
  keys = engine.program_keys(max_decode_rows(settings, processes),
                             prompt_rows(settings, processes), longest_prompt,
                             longest_observation)
  precompiled.compile_sampler_programs(programs, engine.sampler, sampling_params, keys)
  compile_update(programs, exp, setup, params if settings.train.kl_coef > 0 else None)
  compile_estimator(programs, settings)
  compile_threshold(programs, settings)
  logging.info("start-up compile: %d programs in %.1f s", len(programs.seconds),
               programs.total_seconds)
  record = {"phase": "startup", "startup_programs": len(programs.seconds),
            "startup_longest_prompt": longest_prompt or 0,
            "startup_longest_observation": longest_observation or 0,
            "time/startup_compile": programs.total_seconds}
  return exp, engine, PrecompiledStep(setup.train_step, programs), record
