"""The drawn tree's advantages: it is grown with the trees its trunk baseline reads."""

from bpo_jax.training import config as config_lib
from bpo_jax.training import display


def test_trunk_batch_grows_the_trees_the_trunk_baseline_reads():
  config = config_lib.default_config()  # BPO, "batch" trunk, 16 tasks of one tree
  assert display.trunk_batch(config) == (16, 1, "batch")
  config.rollout.tasks_per_iteration, config.rollout.trees_per_task = 4, 2
  assert display.trunk_batch(config) == (4, 2, "batch")
  config.rollout.trunk_baseline = "loo"  # the other trees of the same task
  assert display.trunk_batch(config) == (1, 2, "loo")
  config.rollout.trunk_baseline = "zero"
  assert display.trunk_batch(config) == (1, 1, "zero")
  # A baseline group has no trunk: the group alone.
  config.rollout.trunk_baseline, config.rollout.estimator = "batch", "rloo"
  assert display.trunk_batch(config) == (1, 1, "zero")
