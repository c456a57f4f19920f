"""Supervised warm start: expert episodes of training tasks fitted with the SFT step.

Expert episodes (`sandbox.expert_actions()`) become token chains (`text.
expert_tree_tokens`), each packed into one row, so that a tiny model starts with a non-zero
success rate. The policy-gradient optimiser then continues the warm start's Adam moments.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from absl import logging
import numpy as np

from bpo_jax import text
from bpo_jax import packing
from bpo_jax.training import distributed
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib


def expert_episodes(exp: experiment_lib.Experiment,
                    tasks: Sequence[Any]) -> list[text.ExpertEpisode]:
  """The expert's episode of each task (`sandbox.expert_actions()` from the first state)."""
  # The pool's free-text sandbox: the expert's actions are parsed out of its replies as the
  # policy's are.
  sandbox = experiment_lib.sandbox_factory(exp.settings)()
  episodes = []
  try:
    for task in tasks:
      sandbox.reset(task)
      actions = sandbox.expert_actions()
      if not actions:
        continue
      episode = text.expert_tree_tokens(exp.fmt, sandbox, task,
                                                actions[:exp.settings.env.max_turns])
      episodes.append(episode)
  finally:
    sandbox.close()
  return episodes


def stop_step(checks: Sequence[tuple[int, float]], target: float) -> int | None:
  """The step at which a warm start with `warm_start.target_success` = `target` stops: the
  first checked step s whose validation success v_s >= target, or None while none has (the
  warm start then goes on, at most `warm_start.steps`). `checks`: (step, v_s) in step order.

  Example: target 0.3, checks [(20, 0.0), (40, 0.25), (60, 0.5), (80, 0.2)] -> 60.
  """
  for step, success in checks:
    if success >= target:
      return step
  return None


def validation_positions(num_train_tasks: int, num_tasks: int) -> tuple[int, int]:
  """(start, count) of the validation tasks in the seeded task order: its last `num_tasks`
  positions of the first epoch, [N − V, N), farthest from the demonstrated positions [0, n) and
  from the iterations' first ones (training tasks only: the held-out split is never read)."""
  return num_train_tasks - num_tasks, num_tasks


def _packed_batch(chains: list, settings, placement: placement_lib.Placement):
  """The expert `chains`, each in one row, every node's loss weight and advantage 1 (the SFT
  step), the rows a multiple of the micro-batches times the row shards."""
  ones = [np.ones(chain.num_nodes, np.float32) for chain in chains]
  return packing.pack_trees(chains, ones, ones, buckets=translate.row_buckets(settings),
                            num_rows=placement_lib.row_count(
                                len(chains), settings.train.micro_batches * placement.row_shards))


def warm_start(exp: experiment_lib.Experiment, params,
               placement: placement_lib.Placement | None = None,
               validate: Callable[[Any], float] | None = None) -> tuple[Any, Any, list[dict]]:
  """Supervised steps on expert episodes of the first training tasks of the order.

  Batches of `warm_start.batch_size` episodes are drawn with a seeded generator; each episode is
  a chain packed into one row. On a sharded `placement` (default: one device, unsharded) the
  steps run like the update's: `params` laid out by it (`Placement.place_params`), the
  optimiser state made beside them, and each process feeding its rows of the packed batch.
  With `warm_start.target_success` > 0 every `warm_start.check_every` steps `validate(params)`
  gives the success on the validation tasks, logged with the step, and the warm start stops at
  the first check that reaches the target (`stop_step`), else after `warm_start.steps`: a fixed
  step count lands seeds on either side of a sharp, seed-dependent rise in success, a target
  lands each where the policy gradient has room. The last record holds `stopped_at`.
  Returns the parameters, the optimiser state (None without a warm start) and one metrics
  record per logged step.
  """
  settings = exp.settings
  ws = settings.warm_start
  if ws.num_trajectories == 0 or ws.steps == 0:
    return params, None, []
  if ws.target_success > 0 and validate is None:
    raise ValueError(f"warm_start.target_success = {ws.target_success}: the warm start needs "
                     "`validate` (the loop's success on its validation tasks)")
  placement = placement or placement_lib.Placement()
  chosen = experiment_lib.task_order(len(exp.train_tasks), settings.seed, 0, ws.num_trajectories)
  episodes = expert_episodes(exp, [exp.train_tasks[i] for i in chosen])
  if not episodes:
    raise ValueError(f"the {settings.env.name} expert solved none of the warm-start tasks")
  tx = translate.sft_optimizer(settings)
  state = placement.init_state(tx, params)
  micro = settings.train.micro_batches
  sft_step = update_lib.make_sft_step(exp.graphdef, tx, micro_batches=micro,
                                      state_sharding=placement.shardings_of(state),
                                      batch_sharding=placement.row_sharding)
  rng = np.random.default_rng([settings.seed, 1])
  records = []
  checks = []
  start = time.perf_counter()
  bar = None
  if settings.log.progress_bar and distributed.is_primary():
    import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm.tqdm(total=ws.steps, desc="warm start", unit="step", dynamic_ncols=True)
  for step in range(1, ws.steps + 1):
    batch_ids = rng.choice(len(episodes), size=min(ws.batch_size, len(episodes)), replace=False)
    batch = _packed_batch([episodes[i].tokens for i in batch_ids], settings, placement)
    state, metrics = sft_step(state, placement.feed(batch), exp.frozen)
    checked = ws.target_success > 0 and step % ws.check_every == 0
    if checked:
      checks.append((step, float(validate(state.params))))
    stopped = checked and stop_step(checks, ws.target_success) is not None
    if step == ws.steps or step % max(1, ws.steps // 10) == 0 or checked:
      metrics = placement.host(metrics)
      records.append({"phase": "warm_start", "iteration": 0, "step": step,
                      "loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
                      "expert_episodes": len(episodes),
                      "time/elapsed": time.perf_counter() - start})
      if checked:
        records[-1]["validation_success"] = checks[-1][1]
      logging.info("warm start step %d/%d: loss %.4f", step, ws.steps, records[-1]["loss"])
      if bar is not None:
        bar.set_postfix_str(f"loss={records[-1]['loss']:.3f}")
    if bar is not None:
      bar.update(1)
    if stopped:
      break
  if bar is not None:
    bar.close()
  if ws.target_success > 0:
    records[-1]["stopped_at"] = step
  return state.params, state.opt_state, records
