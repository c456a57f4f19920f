"""The held-out record's per-task outcomes: one character per task, in the order of the tasks,
which the paired analyses read task by task."""

import types

import jax
import numpy as np

from bpo_jax.training import evaluation


class _Rollout:
  """One episode: a chain of `length` valid nodes whose last one ends it."""

  def __init__(self, success: bool, length: int):
    self.node_success = np.zeros(length, bool)
    self.node_success[-1] = success
    self.tree = types.SimpleNamespace(valid=np.ones(length, bool))
    self._length = length

  def leaves(self):
    return np.asarray([self._length - 1])

  def leaf_returns(self):
    return np.asarray([float(self.node_success[-1])])


def test_task_successes_hold_each_task_s_outcome_in_task_order(monkeypatch):
  # Task t succeeds where its digit says so, after t % 3 + 1 steps.
  pattern = "1001101"

  class Engine:

    def __init__(self, *args, **kwargs):
      del args, kwargs

    def rollout(self, params, tasks, key, task_ids):
      del params, key
      assert list(task_ids) == list(range(len(pattern)))
      rollouts = [_Rollout(pattern[t] == "1", t % 3 + 1) for t in tasks]
      return types.SimpleNamespace(rollouts=rollouts,
                                   compute=types.SimpleNamespace(failed_branches=0))

  monkeypatch.setattr(evaluation.rollout_lib, "RolloutEngine", Engine)
  monkeypatch.setattr(evaluation.translate, "rollout_config", lambda *a, **k: None)
  exp = types.SimpleNamespace(sampling_graphdef=None, model_config=None, fmt=None, pool=None,
                              settings=None, programs=None)
  record = evaluation.evaluate_policy(exp, None, list(range(len(pattern))), jax.random.key(0),
                                      0.95)
  assert record["task_successes"] == pattern
  assert record["successes"] == 4 and record["num_tasks"] == 7
  assert record["success_rate"] == 4 / 7
  assert record["episode_length"] == np.mean([t % 3 + 1 for t in range(7)])
