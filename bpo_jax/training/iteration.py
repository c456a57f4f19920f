"""One training iteration: rollout -> estimator -> packing -> update, and its metrics record.

The iteration's tasks are positions `[(i-1)·T, i·T)` of the seeded task order, sampled with
`fold_in(key(seed), i)`. With several processes each grows the trees of its share of the tasks
and `distributed.allgather_objects` gives every process the whole batch, so the estimator, the
packing, the fork threshold and the metrics are computed identically everywhere.
"""

from __future__ import annotations

import functools
import time

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import branching
from bpo_jax import estimators
from bpo_jax import packing
from bpo_jax import rollout as rollout_lib
from bpo_jax import sampling_shapes
from bpo_jax.training import distributed
from bpo_jax.training import estimator_registry
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import metrics as metrics_lib
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import translate


def rollout_stats(batch: rollout_lib.RolloutBatch) -> dict:
  leaves_success, leaves_return = [], []
  for r in batch.rollouts:
    leaves = r.leaves()
    leaves_success.extend(r.node_success[leaves].tolist())
    leaves_return.extend(r.leaf_returns().tolist())
  out = {
      "success": metrics_lib.mean_or_zero(float(s) for s in leaves_success),
      "return": metrics_lib.mean_or_zero(leaves_return),
      "tree_success": metrics_lib.mean_or_zero(float(r.node_success[r.leaves()].any())
                                               for r in batch.rollouts),
      "leaves": len(leaves_success),
      "nodes": int(sum(int(r.tree.valid.sum()) for r in batch.rollouts)),
  }
  state_entropy = batch.state_entropies()
  decisions = sum(len(r.decisions) for r in batch.rollouts)
  out["state_entropy_mean"] = float(state_entropy.mean()) if state_entropy.size else 0.0
  out["state_entropy_p90"] = (float(np.quantile(state_entropy, 0.9)) if state_entropy.size
                              else 0.0)
  out["fork_rate"] = batch.compute.forks / max(decisions, 1)
  out.update(batch.compute.as_dict())
  out["unique_tokens"] = int(sum(r.tokens.num_unique_tokens() for r in batch.rollouts))
  out["decode_devices"] = batch.decode_devices
  out["decode_steps"] = batch.decode_steps
  out.update({f"time/rollout_{k}": v for k, v in batch.phase_seconds.items()})
  return out


def advantage_stats(advantages: np.ndarray, weights: np.ndarray, valid: np.ndarray) -> dict:
  a = advantages[valid]
  w = weights[valid]
  if not a.size:
    return {"advantage_mean": 0.0, "advantage_std": 0.0, "advantage_abs_max": 0.0,
            "advantage_nonzero": 0.0, "weight_sum": 0.0}
  return {"advantage_mean": float(a.mean()), "advantage_std": float(a.std()),
          "advantage_abs_max": float(np.abs(a).max()),
          "advantage_nonzero": float(np.mean(a != 0)),
          "weight_sum": float(w.sum())}


_EXPLAINED_SHARES = jax.jit(jax.vmap(estimators.prefix_explained_variance, in_axes=(0, None)))


def explained_share_stats(trees, leaf_returns, gamma: float) -> dict:
  """How much this iteration's trees' returns differ by fork.

  `prefix_explained_share`: the mean over the trees whose leaves' returns differ of
  `estimators.prefix_explained_variance`, the spread of each path's last-fork sibling mean as
  a share of the tree's return spread (an upper-biased reading of Var(E[G | s_f]) / Var(G):
  see there); 0.0 when no tree's returns differ. `variance_trees`: how many trees it is the
  mean over. `trees` are stacked, `leaf_returns` the trees' leaf returns in the same order.
  """
  differ = np.asarray([np.ptp(r) > 0 if len(r) else False for r in leaf_returns])
  if not differ.any():
    return {"prefix_explained_share": 0.0, "variance_trees": 0}
  shares = np.asarray(_EXPLAINED_SHARES(jax.device_put(trees), float(gamma)))
  return {"prefix_explained_share": float(shares[differ].mean()),
          "variance_trees": int(differ.sum())}


def initial_fork_threshold(settings) -> dict:
  """The fork threshold's running state before the first iteration (JSON-able)."""
  return {"threshold": float(settings.rollout.entropy_threshold), "updates": 0}


def next_fork_threshold(settings, threshold: dict, batch: rollout_lib.RolloutBatch,
                        programs=None) -> dict:
  """The threshold for the next iteration: with `rollout.entropy_quantile` > 0, an average of
  the quantiles of the state entropies seen so far (`branching.update_quantile_threshold`),
  from the start-up set's executable where `programs` holds one."""
  quantile = settings.rollout.entropy_quantile
  if quantile <= 0:
    return threshold
  running = branching.QuantileThreshold(jnp.float32(threshold["threshold"]),
                                        jnp.int32(threshold["updates"]))
  running = batch.update_threshold(running, quantile=quantile, programs=programs)
  return {"threshold": float(running.threshold), "updates": int(running.num_updates)}


def ppo_epochs(train_step, state, fed, num_trees: int, epochs: int,
               placement: placement_lib.Placement, ref=None, frozen=None):
  """`epochs` update steps on the same batch, its behaviour logprobs fixed (PPO epochs).

  The first step's metrics are the estimator's (ratio 1) and are the ones reported; the last
  one's KL and clipping (`last_epoch_*`) show how far the later epochs moved the policy.
  `skipped` is 1 if any step was skipped (a non-finite loss or gradient).
  """
  skipped = 0.0
  for epoch in range(epochs):
    state, epoch_metrics = train_step(state, fed, ref, num_trees, frozen)
    epoch_metrics = {k: float(v) for k, v in placement.host(epoch_metrics).items()}
    skipped = max(skipped, epoch_metrics["skipped"])
    if epoch == 0:
      update_metrics = epoch_metrics
  if epochs > 1:
    update_metrics["last_epoch_approx_kl"] = epoch_metrics["approx_kl"]
    update_metrics["last_epoch_clip_fraction"] = epoch_metrics["clip_fraction"]
  update_metrics["skipped"] = skipped
  return state, update_metrics


class NonFiniteUpdates(RuntimeError):
  """The run's updates kept being skipped for a non-finite loss or gradient
  (`train.max_skipped_updates` iterations in a row): it learns nothing, so it stops."""


def skipped_streak(history) -> list[dict]:
  """The training records at the end of `history` whose update was skipped, in order: the
  iterations since the last one that updated (evaluation records in between do not count).

  Example: training records with skipped 1, 0, 1, 1 (an evaluation between the last two)
  -> the last two.
  """
  streak = []
  for record in reversed(history):
    if record.get("phase") != "train":
      continue
    if not record.get("skipped"):
      break
    streak.insert(0, record)
  return streak


def check_skipped_updates(history, limit: int) -> None:
  """Raises NonFiniteUpdates (one line) when the last `limit` iterations of `history` all
  skipped their update; `limit` 0 never does."""
  streak = skipped_streak(history)
  if limit <= 0 or len(streak) < limit:
    return
  last = streak[-1]
  raise NonFiniteUpdates(
      f"iterations {streak[0]['iteration']}-{last['iteration']}: the loss or gradient was not "
      f"finite in {len(streak)} updates in a row, each skipped (last loss {last.get('loss')}, "
      f"grad_norm {last.get('grad_norm')}); the run stops (train.max_skipped_updates = "
      f"{limit}): lower train.learning_rate, or check the weights it started from")


def iteration_tasks(exp: experiment_lib.Experiment, iteration: int, round_: int = 0) -> list:
  """The tasks of round r of iteration i: positions `[o + ((i-1)·R + r)·T, o + ((i-1)·R + r +
  1)·T)` of the seeded order (o = `rollout.task_offset`, T = `rollout.tasks_per_iteration`, R =
  `rollout.signal_rounds`), each repeated `rollout.trees_per_task` times (one entry per tree or
  group). Iteration i owns R·T positions whether or not it draws every round, so its tasks do not
  depend on earlier iterations' draws (exact resume).

  Example: T = 8, R = 2, o = 0: iteration 1 draws positions [0, 8), then [8, 16) if it needs a
  second round; iteration 2 starts at 16. With R = 1 iteration i draws [(i-1)·T, i·T).
  """
  r = exp.settings.rollout
  start = r.task_offset + ((iteration - 1) * r.signal_rounds + round_) * r.tasks_per_iteration
  positions = experiment_lib.task_order(len(exp.train_tasks), exp.settings.seed, start,
                                        r.tasks_per_iteration)
  return [exp.train_tasks[p] for p in positions for _ in range(r.trees_per_task)]


def task_signal(batch: rollout_lib.RolloutBatch, trees_per_task: int) -> list[bool]:
  """Per task of `batch` (its `trees_per_task` consecutive rollouts): whether the returns of its
  leaves differ, within a tree or group or between its trees. A task whose episodes all return
  alike gives a group's advantages zero, and a tree's every sibling comparison too.

  Example: one tree per task, leaf returns (1, 0) and (1, 1) -> [True, False].
  """
  returns = [r.leaf_returns() for r in batch.rollouts]
  out = []
  for start in range(0, len(returns), trees_per_task):
    task = np.concatenate(returns[start:start + trees_per_task])
    out.append(bool(task.size) and bool(np.ptp(task) > 0))
  return out


def select_tasks(signal, count: int) -> list[int]:
  """The `count` tasks an iteration keeps of those it drew (`signal` per task, in draw order):
  every task with signal, then the first without as long as fewer than `count` are kept; the
  kept indices in draw order.

  Example: signal (F, T, F, T), count 2 -> [1, 3]; (F, T, F, F), count 2 -> [0, 1].
  """
  with_signal = [i for i, s in enumerate(signal) if s][:count]
  without = [i for i, s in enumerate(signal) if not s][:count - len(with_signal)]
  return sorted(with_signal + without)


def policy_for_sampling(exp: experiment_lib.Experiment, placement: placement_lib.Placement,
                        params):
  """The whole policy of the train state's `params` (a LoRA run's frozen base joined) in the
  sampling layout on this process's devices (`Placement.for_sampling`): what rollouts and
  evaluations decode with."""
  return placement.for_sampling(exp.sampling_params(params))


def grow(engine: rollout_lib.RolloutEngine, params, tasks: list, key: jax.Array,
         threshold: float) -> rollout_lib.RolloutBatch:
  """The trees (or groups) of `tasks` sampled with `key`; with several processes each grows its
  share and every process gets the whole batch."""
  share = distributed.process_share(len(tasks))
  batch = engine.rollout(params, tasks[share.start:share.stop], key, threshold=threshold,
                         task_ids=share)
  return rollout_lib.RolloutBatch.concatenate(distributed.allgather_objects(batch))


def grow_rounds(exp: experiment_lib.Experiment, engine: rollout_lib.RolloutEngine, params,
                iteration: int, key: jax.Array, threshold: float):
  """(drawn, rows, signal): iteration i's trees, grown in rounds until the batch carries signal.

  Round r grows the trees of `iteration_tasks(exp, i, r)` with `key` (r = 0) or `fold_in(key,
  r)`, and stops once T = `rollout.tasks_per_iteration` of the tasks drawn so far have signal
  (`task_signal`) or `rollout.signal_rounds` rounds are drawn. `drawn` holds every round's
  trees and compute (the budget counts each env step drawn); `rows` the indices in it of the
  trees of the T tasks `select_tasks` keeps, `drawn.select(rows)` the batch the update takes.
  Row j is the tree of the j // trees_per_task-th task the iteration owns; `signal` says per
  task drawn whether it has signal. The rule reads returns only, so it is the same for every
  estimator; one round is kept as it is.
  """
  r = exp.settings.rollout
  batches, signal = [], []
  for round_ in range(r.signal_rounds):
    tasks = iteration_tasks(exp, iteration, round_)
    round_key = jax.random.fold_in(key, round_) if round_ else key
    batches.append(grow(engine, params, tasks, round_key, threshold))
    signal += task_signal(batches[-1], r.trees_per_task)
    if sum(signal) >= r.tasks_per_iteration:
      break
  rows = [t * r.trees_per_task + j for t in select_tasks(signal, r.tasks_per_iteration)
          for j in range(r.trees_per_task)]
  return rollout_lib.RolloutBatch.concatenate(batches, side_by_side=False), rows, signal


def estimator_program(settings) -> tuple[sampling_shapes.ProgramKey, dict]:
  """The estimator as an iteration runs it: its program's key, `ProgramKey("estimator", T, N,
  0)` for the iteration's T = tasks x trees per task stacked trees of the rollout's node
  capacity N, and the static arguments of `estimator_registry.advantages_and_weights`."""
  r = settings.rollout
  key = sampling_shapes.ProgramKey("estimator", r.tasks_per_iteration * r.trees_per_task,
                                   translate.rollout_config(settings).node_capacity, 0)
  return key, dict(estimator=r.estimator, gamma=float(r.gamma), trees_per_task=r.trees_per_task,
                   trunk=r.trunk_baseline, options=estimator_registry.config_options(r))


def estimate_and_pack(settings, batch: rollout_lib.RolloutBatch, num_tasks: int,
                      placement: placement_lib.Placement, programs=None):
  """(packed batch, advantages, weights, stacked trees): the estimator's per-node advantages and
  path weights (from the start-up set's executable where `programs` holds one,
  `estimator_program`), and one row per tree, the rows a multiple of the micro-batches, each
  split evenly over the devices of the batch axes."""
  trees = batch.stacked_trees()
  key, static = estimator_program(settings)
  estimate = functools.partial(estimator_registry.advantages_and_weights, **static)
  on_device = jax.device_put(trees)
  if programs is None:
    advantages, weights = estimate(on_device)
  else:
    advantages, weights = programs.run(key, (on_device,), {}, estimate)
  advantages, weights = np.asarray(advantages), np.asarray(weights)
  num_rows = placement_lib.row_count(num_tasks,
                                     settings.train.micro_batches * placement.row_shards)
  packed = packing.pack_trees(batch.tree_tokens(), list(advantages), list(weights),
                              buckets=translate.row_buckets(settings), num_rows=num_rows)
  return packed, advantages, weights, trees


def run_iteration(exp: experiment_lib.Experiment, engine: rollout_lib.RolloutEngine,
                  train_step, state, iteration: int, root_key: jax.Array,
                  threshold: dict | None = None, placement: placement_lib.Placement | None = None,
                  ref=None):
  """One rollout → estimator → update iteration.

  `ref`: the reference parameters of the KL term (`train.kl_coef > 0`), structured like
  `state.params`; its per-token k3 estimate is logged as `kl_ref`.

  With several processes (`placement` sharded), each grows the trees of its share of the tasks
  and every process then holds the whole batch (see the module docstring).

  Returns:
    (state, metrics record, the whole rollout batch, the fork threshold for the next iteration).
  """
  settings = exp.settings
  placement = placement or placement_lib.Placement()
  threshold = threshold or initial_fork_threshold(settings)
  times = {}
  start = time.perf_counter()
  num_trees = settings.rollout.tasks_per_iteration * settings.rollout.trees_per_task
  key = jax.random.fold_in(root_key, iteration)
  policy = policy_for_sampling(exp, placement, state.params)
  drawn, rows, signal = grow_rounds(exp, engine, policy, iteration, key,
                                    threshold["threshold"])
  batch = drawn.select(rows)
  sample_bytes = placement_lib.state_bytes(policy)
  del policy
  times["time/rollout"] = time.perf_counter() - start

  start = time.perf_counter()
  packed, advantages, weights, trees = estimate_and_pack(settings, batch, num_trees, placement,
                                                         exp.programs)
  times["time/estimate_and_pack"] = time.perf_counter() - start

  start = time.perf_counter()
  state, update_metrics = ppo_epochs(train_step, state, placement.feed(packed), num_trees,
                                     settings.train.epochs, placement, ref, exp.frozen)
  times["time/update"] = time.perf_counter() - start

  record = {"phase": "train", "iteration": iteration, "row_length": int(packed.shape[1]),
            "fork_threshold": threshold["threshold"]}
  record.update(rollout_stats(drawn))
  if settings.rollout.signal_rounds > 1:
    record.update({"signal_rounds": len(drawn.rollouts) // num_trees, "tasks_drawn": len(signal),
                   "tasks_with_signal": int(sum(signal))})
  record.update(advantage_stats(advantages, weights, np.asarray(trees.valid)))
  if estimator_registry.get(settings.rollout.estimator).topology == "tree":
    record.update(explained_share_stats(trees, [r.leaf_returns() for r in batch.rollouts],
                                        settings.rollout.gamma))
  record.update(update_metrics)
  if "ref_kl" in update_metrics:
    record["kl_ref"] = record.pop("ref_kl")
  record["grad_norm_variance"] = update_metrics["micro_grad_norm_var"]
  record["state_bytes"], record["state_bytes_per_device"] = placement_lib.state_bytes(state)
  record["sample_bytes"], record["sample_bytes_per_device"] = sample_bytes
  record.update(times)
  if record["skipped"]:
    logging.warning("iteration %d: non-finite loss or gradient (loss %s); update skipped",
                    iteration, record["loss"])
  return state, record, batch, next_fork_threshold(settings, threshold, batch, exp.programs)

