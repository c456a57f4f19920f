"""The variance of the policy-gradient estimator at fixed parameters (docs/DESIGN.md §3).

With the parameters θ held fixed and the tasks of one iteration fixed, draw m = 1..M grows the
iteration's trees (BPO) or groups (the baselines) with its own rollout key, in the iteration's
rounds, estimates and packs them as the iteration does (`iteration.grow_rounds`,
`iteration.estimate_and_pack`), and takes the
update's gradient g_m of them (`update.make_gradient_fn`: the first PPO epoch, ratio 1; the
same loss and normalisation; no clipping of its norm, no optimizer step). Measured:

  variance       Σ_m ||g_m - ḡ||² / (M - 1): the trace of the estimator's covariance, unbiased
  mean_sq_norm   ||ḡ||², ḡ = Σ_m g_m / M: the squared norm of the mean gradient. It estimates
                 ||E g||² + variance / M, not ||E g||² (experiments/aggregate.py's
                 `true_sq_norm` removes that term)
  env_steps_per_task, tokens_per_task: what a draw spent per task of the iteration (all of a
                 task's trees together), averaged over the draws: the budget the variance is at
  fork_shares    [Var(E[G | s_τk]) / Var(G) for k = 1..FORK_LEVELS] from the draws' trees
                 (`fork_share`, `fork_variance.fork_moments`): the share of the return's
                 variance the states of the trees' k-th forks explain; a group, and a tree that
                 forks at its first decision, read about 0 at k = 1 (their first fork is the root)
  fork_reach     per level, the mean over the draws' trees of the weight of the paths that have
                 a k-th fork (a path without one counts as resolved at its end)

With `gram`, the measurement also keeps every used draw's gradient (flattened, float64, on the
host: M times the parameters' size) and returns their Gram matrix `gram` [M][M], G_ij =
⟨g_i, g_j⟩, from which the variance of any resample of the draws follows exactly
(`testbed.analysis.gram_moments`): the bootstrap over draws of a variance ratio
(`analysis.variance_ratio_over_draws`). Its variance equals Welford's up to float32 rounding.
Draw m of every estimator at a checkpoint has the same key, so two estimators' draws m and m'
are independent for m ≠ m': the products ⟨g_m, h_m'⟩ of two estimators' kept draws
(`keep_draws`) estimate ⟨E g, E h⟩ without bias (`analysis.same_expectation`).

A draw in which a branch failed (a sandbox that raised or could not restore; docs/DESIGN.md §4) is
not a draw of the estimator: it is left out and counted in `failed_draws`, with the first
failure's operation and reason in `failure`, and fewer than two draws left is an error that
names it. A variance over draws whose sandboxes failed would measure the failures.

The sum runs as Welford's recurrence over the parameter pytree, so that two gradients are held
whatever M (the running mean and the current draw, both in float32 or the parameters' wider
dtype): ḡ_m = ḡ_{m-1} + (g_m - ḡ_{m-1}) / m, and the scalar S_m = S_{m-1} + Σ_i (g_m,i -
ḡ_{m-1},i)(g_m,i - ḡ_m,i), each draw's term summed on the device and S in float64 on the host;
S_M = Σ_m ||g_m - ḡ_M||². M draws with one key give S = 0 exactly (ḡ_1 = g_1, every later
difference is 0).

It differs from the `grad_norm_variance` an iteration logs: that is the variance of the norms
of the micro-batch gradients of one batch (a scalar spread, at whatever θ the iteration had),
not the spread of the gradient vector over independent batches at one θ.

`checkpoint_gradient_variance(settings, workdir, steps, draws)` does this at checkpoints of a
finished run: the tasks are those of the iteration after the checkpoint, the fork threshold that
of the measuring configuration (`fork_threshold`: its fixed threshold, or with a quantile the
running one saved with the checkpoint), and draw m's key
`fold_in(fold_in(fold_in(key(seed), DRAW_STREAM), step), m)`, a stream the run's own
iterations (`fold_in(key(seed), i)`, i < DRAW_STREAM) never use. One process; the update's
micro-batches as configured.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import fork_variance
from bpo_jax import rollout as rollout_lib
from bpo_jax.training import checkpoint as checkpoint_lib
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import iteration as iteration_lib
from bpo_jax.training import loop as loop_lib
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib

# The key stream of the draws: ASCII "grad" (above any iteration number a run reaches).
DRAW_STREAM = 0x67726164
MIN_DRAWS = 2


@jax.jit
def welford_step(mean, grads, count):
  """(ḡ_m, its term of S) from ḡ_{m-1} and g_m, `count` = m (module docstring)."""
  delta = jax.tree.map(lambda g, a: g.astype(a.dtype) - a, grads, mean)
  mean = jax.tree.map(lambda a, d: a + d / count.astype(a.dtype), mean, delta)
  term = sum(jnp.sum(d * (g.astype(a.dtype) - a))
             for d, g, a in zip(jax.tree.leaves(delta), jax.tree.leaves(grads),
                                jax.tree.leaves(mean)))
  return mean, term


# The fork levels whose shares a measurement gives (module docstring).
FORK_LEVELS = 3
_MOMENTS = [jax.jit(jax.vmap(functools.partial(fork_variance.fork_moments, level=k),
                             in_axes=(0, None))) for k in range(1, FORK_LEVELS + 1)]


def draw_gradient(exp: experiment_lib.Experiment, engine: rollout_lib.RolloutEngine,
                  gradient: Callable, params, iteration: int, key: jax.Array, threshold: float,
                  ref=None):
  """(g, compute counters with the trees' `fork_moments` under "moments", [trees, FORK_LEVELS,
  4], a row per tree the update takes, a column per level, and each row's task under
  "task_index"; first failure or None) of one draw: iteration `iteration`'s trees grown with
  `key` in its rounds (`iteration.grow_rounds`), estimated and packed as the iteration does,
  and the update's gradient of them at `params`; g is None when a branch failed (the gradient
  is not taken). The counters are every round's."""
  drawn, rows, _ = iteration_lib.grow_rounds(exp, engine, exp.sampling_params(params), iteration,
                                             key, threshold)
  failure = first_failure(drawn)
  if failure is not None:
    return None, drawn.compute.as_dict(), failure
  compute = drawn.compute.as_dict()
  batch = drawn.select(rows)
  trees = jax.tree.map(jnp.asarray, batch.stacked_trees())
  gamma = float(exp.settings.rollout.gamma)
  levels = [np.stack([np.asarray(m, np.float64) for m in moments(trees, gamma)], 1)
            for moments in _MOMENTS]  # each [trees, 4]: mean, mean_square, within, reach
  compute["moments"] = np.stack(levels, 1)
  compute["task_index"] = [row // exp.settings.rollout.trees_per_task for row in rows]
  num_trees = len(rows)
  packed, _, _, _ = iteration_lib.estimate_and_pack(exp.settings, batch, num_trees,
                                                    placement_lib.Placement())
  grads, _, _, _ = gradient(params, jax.tree.map(jnp.asarray, packed), ref, num_trees,
                            exp.frozen)
  return grads, compute, None


def fork_share(task_index: Sequence[Sequence[int]],
               moments: Sequence[np.ndarray]) -> float | None:
  """Var(E[G | s_τ]) / Var(G) at one level of the trees' forks, from every draw's trees
  (`fork_variance.fork_moments`; `moments` one [trees, ≥ 3] array of (mean, mean_square,
  within) per draw, `task_index` per draw its trees' tasks): per task, Var(G) = mean of
  mean_square − (mean of mean)² + (their variance) / n over its n trees, and E[Var(G | s_τ)]
  the mean of within; the share is 1 − Σ_tasks E[within] / Σ_tasks Var(G), pooled over the
  tasks. None when no task's returns vary or a task has fewer than two trees.

  Example: one task, trees with (mean, mean_square, within) = (1, 2, 0.5) and (3, 10, 0.5):
  Var(G) = 6 − 4 + 2/2 = 3 (the squared mean unbiased: 4 − Var(mean)/n), within 0.5 → 5/6.
  """
  rows = np.concatenate(moments, 0)
  tasks = np.concatenate([np.asarray(t) for t in task_index])
  var_g, within = 0.0, 0.0
  for task in np.unique(tasks):
    mean, mean_square, inner = rows[tasks == task][:, :3].T
    if len(mean) < 2:
      return None
    var_g += mean_square.mean() - mean.mean() ** 2 + mean.var(ddof=1) / len(mean)
    within += inner.mean()
  return 1.0 - within / var_g if var_g > 0 else None


def first_failure(batch: rollout_lib.RolloutBatch) -> str | None:
  """"OP: REASON" of the batch's first failed branch, or None when no branch failed."""
  for rollout in batch.rollouts:
    for failure in rollout.failures:
      return f"{failure.op}: {failure.reason}"
  return None


def gradient_variance(exp: experiment_lib.Experiment, engine: rollout_lib.RolloutEngine,
                      gradient: Callable, params, iteration: int, keys: Sequence[jax.Array],
                      threshold: float, ref=None, gram: bool = False,
                      keep_draws: bool = False) -> dict:
  """The estimator's variance at `params` over one draw per key of `keys` (module docstring),
  with the draws' Gram matrix under "gram" when `gram`, and with `keep_draws` the draws' flattened
  gradients themselves under "draws_matrix" ([used draws, parameters] float64, for products
  with another estimator's draws; not for a JSON file).

  `gradient` is `update.make_gradient_fn`'s (jitted); each draw grows the trees of iteration
  `iteration` (`draw_gradient`). A draw whose gradient is not finite (the update would
  skip it) is left out and counted in `skipped_draws`, one with a failed branch in
  `failed_draws` (module docstring).
  """
  mean, total, used, skipped, failed, failure = None, 0.0, 0, 0, 0, None
  env_steps, tokens, moments, task_index, kept = [], [], [], [], []
  for key in keys:
    grads, compute, draw_failure = draw_gradient(exp, engine, gradient, params, iteration, key,
                                                 threshold, ref)
    if draw_failure is not None:
      failed += 1
      failure = failure or draw_failure
      continue
    env_steps.append(compute["env_steps"])
    tokens.append(compute["tokens_processed"])
    moments.append(compute["moments"])
    task_index.append(compute["task_index"])
    if not all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads)):
      skipped += 1
      continue
    used += 1
    mean = jax.tree.map(jnp.zeros_like, grads) if mean is None else mean
    mean, term = welford_step(mean, grads, jnp.asarray(used, jnp.float32))
    total += float(term)
    if gram or keep_draws:
      kept.append(np.concatenate([np.asarray(g, np.float64).ravel()
                                  for g in jax.tree.leaves(grads)]))
  if used < MIN_DRAWS:
    because = f"; {failed} had a failed branch, the first {failure}" if failed else ""
    raise ValueError(f"{used} draws with a finite gradient out of {len(keys)}{because}: the "
                     f"variance needs at least {MIN_DRAWS}")
  per_task = exp.settings.rollout.tasks_per_iteration
  kept = np.stack(kept) if gram or keep_draws else None
  extra = {"gram": (kept @ kept.T).tolist()} if gram else {}
  if keep_draws:
    extra["draws_matrix"] = kept
  return {**extra, "variance": total / (used - 1),
          "fork_shares": [fork_share(task_index, [m[:, k] for m in moments])
                          for k in range(FORK_LEVELS)],
          "fork_reach": [float(np.mean([m[:, k, 3] for m in moments]))
                         for k in range(FORK_LEVELS)],
          "mean_sq_norm": float(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(mean))),
          "draws": used, "skipped_draws": skipped, "failed_draws": failed, "failure": failure,
          "env_steps_per_task": float(np.mean(env_steps)) / per_task,
          "tokens_per_task": float(np.mean(tokens)) / per_task}


def draw_keys(seed: int, step: int, draws: int) -> list[jax.Array]:
  """The rollout keys of the draws at checkpoint `step` (module docstring)."""
  base = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), DRAW_STREAM), step)
  return [jax.random.fold_in(base, m) for m in range(draws)]


def kept_steps(workdir: str) -> list[int]:
  """The iterations of the checkpoints `workdir` holds, in order."""
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), create=False)
  try:
    return sorted(checkpointer.all_steps())
  finally:
    checkpointer.close()


def spread(steps: Sequence[int], count: int) -> list[int]:
  """`count` of `steps` spread from the first to the last (all of them if fewer).

  Example: spread([0, 2, 4, 6, 8], 3) == [0, 4, 8]; spread([0, 8], 3) == [0, 8].
  """
  steps = sorted(steps)
  if count >= len(steps):
    return steps
  if count == 1:
    return [steps[-1]]
  picks = sorted({round(i * (len(steps) - 1) / (count - 1)) for i in range(count)})
  return [steps[i] for i in picks]


def fork_threshold(settings, saved: dict) -> float:
  """The entropy threshold the draws fork at, given the running state `saved` with a
  checkpoint: the configuration's own `rollout.entropy_threshold` when it is fixed
  (`entropy_quantile` 0), so that another fork rule can be measured at a run's parameters; with
  a quantile, the running threshold the run reached (the run's own rule is then measured).

  Example: threshold 0.5, quantile 0, saved {"threshold": 0.0} → 0.5; quantile 0.8, saved
  {"threshold": 1.3} → 1.3.
  """
  if settings.rollout.entropy_quantile > 0:
    return float(saved["threshold"])
  return float(settings.rollout.entropy_threshold)


def checkpoint_gradient_variance(settings, workdir: str, steps: Sequence[int],
                                 draws: int, gram: bool = False,
                                 keep_draws: bool = False) -> list[dict]:
  """`gradient_variance` at each checkpoint `steps` of the run in `workdir` (module docstring),
  each result with its `step` (and the draws' Gram matrix with `gram`, their gradients with
  `keep_draws`); the experiment (tasks, tokenizer, sandboxes) is built once."""
  if draws < MIN_DRAWS:
    raise ValueError(f"draws = {draws}: the variance needs at least {MIN_DRAWS}")
  if jax.process_count() > 1:
    raise ValueError(f"the gradient variance is measured in one process, not "
                     f"{jax.process_count()}")
  exp, state = experiment_lib.build_experiment(settings, workdir)
  try:
    engine = rollout_lib.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt, exp.pool,
                                       translate.rollout_config(settings))
    gradient = jax.jit(update_lib.make_gradient_fn(exp.graphdef, translate.update_config(settings),
                                                   use_ref=settings.train.kl_coef > 0))
    out = []
    for step in steps:
      restored, ref, loop = loop_lib.restore_checkpoint(exp, state, step)
      result = gradient_variance(exp, engine, gradient, restored.params, step + 1,
                                 draw_keys(settings.seed, step, draws),
                                 fork_threshold(settings, loop["fork_threshold"]), ref, gram,
                                 keep_draws)
      out.append({"step": step, **result})
    return out
  finally:
    exp.close()
