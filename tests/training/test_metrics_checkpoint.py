"""Metrics records, the Wilson interval, and checkpoints that restore bit for bit."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bpo_jax.training import checkpoint as checkpoint_lib
from bpo_jax.training import metrics as metrics_lib


@pytest.mark.parametrize("successes,trials,confidence,low,high", [
    # Hand-computed: z = 1.959964; e.g. 8/10: centre (0.8 + 0.19207)/1.38415 = 0.71673,
    # half 1.41600 * sqrt(0.016 + 0.0096037) = 0.22660.
    (8, 10, 0.95, 0.490160, 0.943317),
    (0, 10, 0.95, 0.0, 0.277533),
    (10, 10, 0.95, 0.722467, 1.0),
    (50, 100, 0.90, 0.418848, 0.581152),  # z = 1.644854: half = 1.601528 * 0.050672
])
def test_wilson_interval(successes, trials, confidence, low, high):
  got = metrics_lib.wilson_interval(successes, trials, confidence)
  np.testing.assert_allclose(got, (low, high), atol=5e-6)


@pytest.mark.parametrize("trials", [1, 10, 40, 64, 1000])
def test_wilson_interval_is_exactly_closed_at_no_and_all_successes(trials):
  # 0 of n: the lower bound is exactly 0 (the formula's difference leaves ~1e-17 at n = 40);
  # n of n: the upper bound is exactly 1.
  assert metrics_lib.wilson_interval(0, trials)[0] == 0.0
  assert metrics_lib.wilson_interval(trials, trials)[1] == 1.0


def test_wilson_interval_errors():
  with pytest.raises(ValueError, match="trials must be positive"):
    metrics_lib.wilson_interval(0, 0)
  with pytest.raises(ValueError, match="successes must be in"):
    metrics_lib.wilson_interval(11, 10)
  with pytest.raises(ValueError, match="confidence"):
    metrics_lib.wilson_interval(1, 10, 1.0)


def test_writer_jsonl_and_history(tmp_path):
  workdir = str(tmp_path)
  history = [{"iteration": 0, "phase": "eval", "success_rate": 0.25}]
  writer = metrics_lib.MetricsWriter(workdir, tensorboard=True, progress_bar=False,
                                     history=history)
  writer.write({"iteration": 1, "phase": "train", "loss": np.float32(0.5), "success": 0.75,
                "time/rollout": 1.25, "grad_norm": float("nan")})
  writer.close()
  records = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert records[0] == history[0]
  assert records[1] == {"iteration": 1, "phase": "train", "loss": 0.5, "success": 0.75,
                        "time/rollout": 1.25, "grad_norm": "nan"}
  assert metrics_lib.deterministic_part(records[1]) == {
      "iteration": 1, "phase": "train", "loss": 0.5, "success": 0.75, "grad_norm": "nan"}
  # TensorBoard reads back the numbers of the record, under "<phase>/<key>" (the NaN gradient
  # norm is the string "nan" in the record, so it is not a scalar there).
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  events = event_accumulator.EventAccumulator(os.path.join(workdir, "tensorboard"))
  events.Reload()
  assert sorted(events.Tags()["scalars"]) == ["train/loss", "train/success",
                                              "train/time/rollout"]
  assert [(s.step, s.value) for s in events.Scalars("train/loss")] == [(1, 0.5)]
  assert [(s.step, s.value) for s in events.Scalars("train/success")] == [(1, 0.75)]
  # A writer started from a shorter history drops what came after it (the resume case).
  metrics_lib.MetricsWriter(workdir, tensorboard=False, progress_bar=False,
                            history=history).close()
  assert metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl")) == history


def test_checkpoint_restores_exactly(tmp_path):
  params = {"w": jax.random.normal(jax.random.key(0), (3, 4)), "b": jnp.arange(4.0)}
  tx = optax.adam(1e-2)
  opt_state = tx.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, opt_state = tx.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  state = {"params": params, "opt_state": opt_state}
  key = jax.random.split(jax.random.key(7))[1]
  loop = {"iteration": 3, "key": checkpoint_lib.key_to_json(key), "task_position": 17,
          "history": [{"iteration": 1, "loss": 0.1}]}
  checkpointer = checkpoint_lib.Checkpointer(str(tmp_path / "ckpt"), keep=2)
  for step in (1, 2, 3):
    checkpointer.save(step, state, loop)
  assert checkpointer.all_steps() == [2, 3]
  assert checkpointer.latest_step() == 3
  abstract = jax.tree.map(jnp.zeros_like, state)
  restored, restored_loop = checkpointer.restore(3, abstract)
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert restored_loop == loop
  restored_key = checkpoint_lib.key_from_json(restored_loop["key"])
  np.testing.assert_array_equal(jax.random.uniform(restored_key, (5,)),
                                jax.random.uniform(jax.random.key_data(key), (5,)))
  with pytest.raises(FileNotFoundError, match="no checkpoint for step 9"):
    checkpointer.restore(9, abstract)
  checkpointer.close()
  with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
    checkpoint_lib.Checkpointer(str(tmp_path / "absent"), create=False)


def test_evaluations_print_beneath_the_progress_bar(tmp_path, capsys):
  record = {"phase": "eval", "iteration": 0, "stage": "warm_start", "success_rate": 0.5,
            "success_low": 0.25, "success_high": 0.75, "num_tasks": 4}
  writer = metrics_lib.MetricsWriter(str(tmp_path), tensorboard=False, progress_bar=True,
                                     total_iterations=2, history=[record])
  writer.write(dict(record, iteration=1, stage="train", success_rate=1.0, success_low=0.5,
                    success_high=1.0))
  writer.close()
  captured = capsys.readouterr()
  lines = (captured.out + captured.err).replace("\r", "\n").splitlines()
  assert "eval at iteration 0 (warm_start): success 0.500 [0.250, 0.750] over 4 tasks" in lines
  assert "eval at iteration 1 (train): success 1.000 [0.500, 1.000] over 4 tasks" in lines
