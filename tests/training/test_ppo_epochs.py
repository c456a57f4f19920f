"""`train.epochs`: PPO epochs in the training loop.

Two one-iteration runs of a tiny configuration that differ only in `train.epochs` grow the same
trees and take the same first step (the estimator's, at ratio 1); the second epoch then steps
again on the same batch, where the ratio has left 1, so its KL to the behaviour policy is > 0
and the final parameters differ.
"""

import json
import os
import sys

import jax
import numpy as np
import pytest

from bpo_jax.training import checkpoint as checkpoint_lib
from bpo_jax.training import loop
from bpo_jax.training import metrics
from bpo_jax.training.settings import from_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from experiments.configs import base  # pylint: disable=g-import-not-at-top,wrong-import-position


def _run(workdir, epochs):
  config = base.tiny(base.rooms("bpo"), iterations=1)
  config.train.epochs = epochs
  config.scale.num_devices = 1  # not this process's eight
  config.log.tensorboard = False
  loop.train(config, str(workdir))
  records = [r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
             if r["phase"] == "train"]
  exp, state, _ = loop.load_checkpoint(from_config(config), str(workdir))
  exp.close()
  return records, state


@pytest.mark.slow
def test_epochs_step_again_on_the_same_batch(tmp_path):
  (one,), state_one = _run(tmp_path / "one", 1)
  (two,), state_two = _run(tmp_path / "two", 2)
  # The same trees and the same first step.
  for key in ("success", "leaves", "env_steps", "loss", "grad_norm", "advantage_std"):
    assert one[key] == two[key], key
  assert one["approx_kl"] == two["approx_kl"] == 0.0
  assert "last_epoch_approx_kl" not in one
  assert two["last_epoch_approx_kl"] > 0.0
  assert 0.0 <= two["last_epoch_clip_fraction"] <= 1.0
  assert int(state_one.step) == 1 and int(state_two.step) == 2
  diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b))
                                                        .max()),
                                       state_one.params, state_two.params))
  assert max(diffs) > 0.0
