"""Supervised warm start: expert episodes of training tasks fitted with the SFT step.

Expert episodes (`sandbox.expert_actions()`) become token chains (`text.
expert_tree_tokens`), each packed into one row, so that a tiny model starts with a non-zero
success rate. The policy-gradient optimiser then continues the warm start's Adam moments.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

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


def warm_start(exp: experiment_lib.Experiment, params,
               placement: placement_lib.Placement | None = None) -> tuple[Any, Any, list[dict]]:
  """Supervised steps on expert episodes of the first training tasks of the order.

  Batches of `warm_start.batch_size` episodes are drawn with a seeded generator; each episode is
  a chain packed into one row. On a sharded `placement` (default: one device, unsharded) the
  steps run like the update's: `params` laid out by it (`Placement.place_params`), the
  optimiser state made beside them, and each process feeding its rows of the packed batch.
  Returns the parameters, the optimiser state (None without a warm start) and one metrics
  record per logged step.
  """
  settings = exp.settings
  ws = settings.warm_start
  if ws.num_trajectories == 0 or ws.steps == 0:
    return params, None, []
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
  ones = [np.ones(e.tokens.num_nodes, np.float32) for e in episodes]
  records = []
  start = time.perf_counter()
  bar = None
  if settings.log.progress_bar and distributed.is_primary():
    import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm.tqdm(total=ws.steps, desc="warm start", unit="step", dynamic_ncols=True)
  for step in range(1, ws.steps + 1):
    batch_ids = rng.choice(len(episodes), size=min(ws.batch_size, len(episodes)), replace=False)
    batch = packing.pack_trees([episodes[i].tokens for i in batch_ids],
                               [ones[i] for i in batch_ids], [ones[i] for i in batch_ids],
                               buckets=translate.row_buckets(settings),
                               num_rows=placement_lib.row_count(
                                   len(batch_ids), micro * placement.row_shards))
    state, metrics = sft_step(state, placement.feed(batch), exp.frozen)
    if step == ws.steps or step % max(1, ws.steps // 10) == 0:
      metrics = placement.host(metrics)
      records.append({"phase": "warm_start", "iteration": 0, "step": step,
                      "loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
                      "expert_episodes": len(episodes),
                      "time/elapsed": time.perf_counter() - start})
      logging.info("warm start step %d/%d: loss %.4f", step, ws.steps, records[-1]["loss"])
      if bar is not None:
        bar.set_postfix_str(f"loss={records[-1]['loss']:.3f}")
    if bar is not None:
      bar.update(1)
  if bar is not None:
    bar.close()
  return state.params, state.opt_state, records
