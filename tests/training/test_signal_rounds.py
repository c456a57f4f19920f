"""`rollout.signal_rounds`: an iteration draws rounds of fresh tasks until its batch has signal.

The pure pieces by hand (which tasks carry signal, which are kept, which positions a round
draws), `grow_rounds` against a scripted engine whose returns are set per task (when it stops,
which trees it keeps, the keys of its rounds, the compute it counts), and a tiny run whose
records count what it drew.
"""

import os
import sys
import types

import jax
import numpy as np
import pytest

from bpo_jax import rollout as rollout_lib
from bpo_jax.training import config as config_lib
from bpo_jax.training import experiment
from bpo_jax.training import iteration
from bpo_jax.training import loop
from bpo_jax.training import metrics
from bpo_jax.training.settings import from_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from experiments.configs import base  # pylint: disable=g-import-not-at-top,wrong-import-position


def _rollout(returns):
  return types.SimpleNamespace(leaf_returns=lambda: np.asarray(returns, np.float32))


def _batch(returns_per_tree, env_steps=0, threshold=0.5):
  return rollout_lib.RolloutBatch(
      rollouts=[_rollout(r) for r in returns_per_tree],
      compute=rollout_lib.Compute(env_steps=env_steps), phase_seconds={"decode": 1.5},
      device_row_tokens=10, turns=3, threshold=threshold, decode_devices=1, decode_steps=7)


def test_select_tasks_by_hand():
  assert iteration.select_tasks([False, True, False, True], 2) == [1, 3]
  assert iteration.select_tasks([False, True, False, False], 2) == [0, 1]
  assert iteration.select_tasks([True, True, True, False], 2) == [0, 1]
  assert iteration.select_tasks([False, False, False], 2) == [0, 1]
  assert iteration.select_tasks([False, True], 2) == [0, 1]  # one round kept as it is


def test_task_signal_reads_the_returns_of_a_task_s_trees():
  batch = _batch([[1, 0], [1, 1], [], [0.5]])
  assert iteration.task_signal(batch, 1) == [True, False, False, False]
  # Two trees per task: (1, 0 | 1, 1) differ within a tree; ([] | 0.5) is one return.
  assert iteration.task_signal(batch, 2) == [True, False]
  # Each tree alike, the task's two trees not: the trees of a task are compared too.
  assert iteration.task_signal(_batch([[1, 1], [0, 0]]), 2) == [True]


def _exp(tasks_per_iteration, signal_rounds, trees_per_task=1, offset=0, num_tasks=40):
  config = config_lib.default_config()
  config.rollout.tasks_per_iteration = tasks_per_iteration
  config.rollout.signal_rounds = signal_rounds
  config.rollout.trees_per_task = trees_per_task
  config.rollout.task_offset = offset
  return types.SimpleNamespace(settings=from_config(config),
                               train_tasks=[f"t{i}" for i in range(num_tasks)])


def test_an_iteration_owns_its_rounds_positions():
  exp = _exp(3, 2, trees_per_task=2, offset=4)
  order = experiment.task_order(40, exp.settings.seed, 0, 20)
  expected = {(1, 0): order[4:7], (1, 1): order[7:10], (2, 0): order[10:13],
              (2, 1): order[13:16]}
  for (i, r), positions in expected.items():
    assert iteration.iteration_tasks(exp, i, r) == [f"t{p}" for p in positions for _ in "ab"]
  one = _exp(3, 1, trees_per_task=2, offset=4)
  assert iteration.iteration_tasks(one, 2) == [f"t{p}" for p in order[7:10] for _ in "ab"]


class _ScriptedEngine:
  """Returns per task from `script` (task -> leaf returns); 5 env steps a tree."""

  def __init__(self, script):
    self.script, self.calls = script, []

  def rollout(self, params, tasks, key, threshold, task_ids):
    del params, task_ids
    self.calls.append((list(tasks), np.asarray(jax.random.key_data(key))))
    return _batch([self.script[t] for t in tasks], env_steps=5 * len(tasks),
                  threshold=threshold)


def test_grow_rounds_draws_until_the_batch_has_signal():
  exp = _exp(2, 3)
  script = {t: [0, 0] for t in exp.train_tasks}
  first, second, third = (iteration.iteration_tasks(exp, 1, r) for r in range(3))
  script[first[1]] = [1, 0]   # round 0: one task of two with signal
  script[second[0]] = [0, 1]  # round 1: the second
  script[third[0]] = [1, 0]   # round 2 is not drawn
  engine = _ScriptedEngine(script)
  key = jax.random.key(7)
  drawn, rows, signal = iteration.grow_rounds(exp, engine, None, 1, key, 0.25)
  kept = drawn.select(rows)
  assert rows == [1, 2]
  assert [c[0] for c in engine.calls] == [first, second]
  np.testing.assert_array_equal(engine.calls[0][1], jax.random.key_data(key))
  np.testing.assert_array_equal(engine.calls[1][1],
                                jax.random.key_data(jax.random.fold_in(key, 1)))
  assert [r.leaf_returns().tolist() for r in kept.rollouts] == [[1, 0], [0, 1]]
  assert len(drawn.rollouts) == 4
  # The kept batch carries every round's cost.
  for batch in (kept, drawn):
    assert batch.compute.env_steps == 20
    assert batch.phase_seconds == {"decode": 3.0}
    assert (batch.turns, batch.decode_steps, batch.device_row_tokens) == (6, 14, 20)
    assert batch.threshold == 0.25


def test_grow_rounds_keeps_the_first_without_signal_when_rounds_run_out():
  exp = _exp(3, 2)
  script = {t: [1, 1] for t in exp.train_tasks}
  second = iteration.iteration_tasks(exp, 1, 1)
  script[second[2]] = [0, 1]
  drawn, rows, signal = iteration.grow_rounds(exp, _ScriptedEngine(script), None, 1,
                                      jax.random.key(0), 0.5)
  kept = drawn.select(rows)
  assert rows == [0, 1, 5] and len(drawn.rollouts) == 6
  # The task with signal (draw index 5), then the first two without (0, 1), in draw order.
  assert [r.leaf_returns().tolist() for r in kept.rollouts] == [[1, 1], [1, 1], [0, 1]]
  assert kept.rollouts[2] is drawn.rollouts[5] and kept.rollouts[0] is drawn.rollouts[0]


def test_one_round_keeps_the_round_as_drawn():
  exp = _exp(2, 1, trees_per_task=2)
  script = {t: [0] for t in exp.train_tasks}
  engine = _ScriptedEngine(script)
  drawn, rows, signal = iteration.grow_rounds(exp, engine, None, 3, jax.random.key(1), 0.5)
  assert rows == [0, 1, 2, 3] and len(engine.calls) == 1
  assert engine.calls[0][0] == iteration.iteration_tasks(exp, 3)


@pytest.mark.slow
def test_a_run_counts_every_round_it_drew(tmp_path):
  """A tiny run with up to three rounds: each record counts the tasks it drew, their env
  steps, and updates on T trees; the checkpoint's task position skips every owned round."""
  config = base.tiny(base.rooms("grpo"), iterations=2)
  config.rollout.signal_rounds = 3
  config.scale.num_devices = 1
  config.log.tensorboard = False
  loop.train(config, str(tmp_path))
  records = [r for r in metrics.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
             if r["phase"] == "train"]
  t = config.rollout.tasks_per_iteration
  assert len(records) == 2
  for record in records:
    assert 1 <= record["signal_rounds"] <= 3
    assert record["tasks_drawn"] == record["signal_rounds"] * t
    assert record["tasks_with_signal"] <= record["tasks_drawn"]
    if record["signal_rounds"] < 3:
      assert record["tasks_with_signal"] >= t
    # Every drawn tree's leaves are in the record, each leaf at least one env step.
    assert record["leaves"] >= record["tasks_drawn"]
    assert record["env_steps"] >= record["leaves"]
  _, _, saved = loop.load_checkpoint(from_config(config), str(tmp_path))
  assert saved["task_position"] == config.rollout.task_offset + 2 * 3 * t
