"""Held-out evaluation: one episode per task, success rate with its Wilson interval."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax

from bpo_jax import rollout as rollout_lib
from bpo_jax.training import distributed
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import metrics as metrics_lib
from bpo_jax.training import translate


def evaluate_policy(exp: experiment_lib.Experiment, params, tasks: Sequence[Any],
                    key: jax.Array, confidence: float, temperature: float | None = None) -> dict:
  """Success rate on `tasks`, one episode each at `temperature` (default `eval.temperature`;
  0: greedy), with its Wilson interval; also the mean return and episode length, and each
  task's outcome in the order of `tasks` (`task_successes`, a string of "1" and "0": the
  paired analyses of experiments/ compare methods task by task on the same held-out set).
  `params`: the whole policy (a LoRA run's adapters merged into the base,
  `Experiment.sampling_params`), laid out where it is to decode.

  With several processes each plays its share of the tasks (under their global indices) and
  the outcomes are gathered, so every process returns the same record.
  """
  config = translate.rollout_config(exp.settings, evaluation=True)
  if temperature is not None:
    config = dataclasses.replace(config, temperature=float(temperature))
  engine = rollout_lib.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt, exp.pool,
                                     config, programs=exp.programs)
  start = time.perf_counter()
  share = distributed.process_share(len(tasks))
  batch = engine.rollout(params, list(tasks)[share.start:share.stop], key, task_ids=share)
  outcomes = [(bool(r.node_success[r.leaves()].any()), float(r.leaf_returns().sum()),
               int(r.tree.valid.sum())) for r in batch.rollouts]
  parts = distributed.allgather_objects((outcomes, batch.compute.failed_branches))
  outcomes = [o for part, _ in parts for o in part]
  successes = sum(success for success, _, _ in outcomes)
  low, high = metrics_lib.wilson_interval(successes, len(tasks), confidence)
  return {"success_rate": successes / len(tasks), "success_low": low, "success_high": high,
          "successes": successes, "num_tasks": len(tasks), "confidence": confidence,
          "task_successes": "".join("1" if success else "0" for success, _, _ in outcomes),
          "return": metrics_lib.mean_or_zero(r for _, r, _ in outcomes),
          "episode_length": metrics_lib.mean_or_zero(n for _, _, n in outcomes),
          "failed_branches": sum(failed for _, failed in parts),
          "time/eval": time.perf_counter() - start}


def eval_record(exp: experiment_lib.Experiment, params, iteration: int,
                stage: str = "train") -> dict:
  """A held-out evaluation record; `stage` is "init" (the untrained model), "warm_start" or
  "train". `params`: the whole policy where it decodes (`iteration.policy_for_sampling`)."""
  settings = exp.settings
  key = jax.random.fold_in(jax.random.key(settings.seed + 1), iteration)
  result = evaluate_policy(exp, params, exp.eval_tasks[:settings.eval.num_tasks], key,
                           settings.eval.confidence)
  return {"phase": "eval", "iteration": iteration, "stage": stage, **result}

