"""Estimator demo: the BPO estimator on a small tabular MDP, on CPU in seconds, no downloads.

Grows BPO trees with the online entropy fork rule, prints one tree's advantages and path weights,
the exact expected gradient (every tree enumerated) against the true policy gradient, a Monte
Carlo average over sampled trees, and the exact BPO-vs-RLOO gradient variance table.

    python experiments/run.py --config=experiments/configs/estimator_demo.py --workdir=workdirs/estimator_demo
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.demo = "estimators"
  c.seed = 0
  c.mdp = ml_collections.ConfigDict(dict(num_actions=2, horizon=3, root_logit=2.5,
                                         logit_scale=0.7))
  c.branching = ml_collections.ConfigDict(dict(entropy_threshold=0.55, fork_k=2, max_forks=2))
  c.num_sampled_trees = 2000
  # RLOO groups with more outcomes than this are left out of the variance table (time).
  c.max_enumerated_groups = 40_000
  return c
