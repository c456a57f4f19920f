"""The estimator demo: BPO trees on a tabular MDP, their advantages, gradients and variances.

A config with `demo = "estimators"` (experiments/configs/estimator_demo.py) runs this instead of
training:

    python experiments/run.py --config=experiments/configs/estimator_demo.py \
        --workdir=workdirs/estimator_demo

It grows BPO trees with the online entropy fork rule, prints one tree's values, baselines,
advantages and path weights, the exact expected gradient (every tree enumerated) and a Monte
Carlo average against the true policy gradient, and the exact BPO-vs-RLOO gradient variance
table, in seconds on a CPU; the figures go to `<workdir>/summary.json`.
"""

import json
import os

import jax
import numpy as np

from bpo_jax import estimators
from bpo_jax.testing import tabular


def run(config, workdir: str) -> dict:
  """Grows BPO trees on a tabular MDP and prints advantages, gradients and the variance table."""
  m, b = config.mdp, config.branching
  mdp = tabular.make_mdp(config.seed, num_actions=m.num_actions, horizon=m.horizon,
                         root_logits=(m.root_logit,) + (-m.root_logit,) * (m.num_actions - 1),
                         logit_scale=m.logit_scale)
  rule = dict(threshold=b.entropy_threshold, fork_k=b.fork_k, max_forks=b.max_forks)
  print(f"Tabular MDP: {m.num_actions} actions, depth {m.horizon}; entropy per state "
        f"{np.round(mdp.entropy(), 3).tolist()}; fork {b.fork_k} ways when entropy > "
        f"{b.entropy_threshold}, at most {b.max_forks} forks per tree.")

  rng = np.random.default_rng(config.seed)
  one = tabular.to_batch([tabular.sample_online_tree(mdp, rng, **rule)], mdp,
                         capacity=mdp.horizon * b.fork_k ** b.max_forks)
  tree = jax.tree_util.tree_map(lambda x: x[0], one.trees)
  out = jax.jit(estimators.bpo_advantages)(tree)
  print("\nOne sampled tree (node: parent, reward, value Q, baseline b, advantage A, weight w):")
  for i in np.flatnonzero(tree.valid):
    print(f"  {i:2d}: parent {tree.parent[i]:2d}  r {tree.reward[i]:+.3f}  Q {out.values[i]:+.3f}"
          f"  b {out.baselines[i]:+.3f}  A {out.advantages[i]:+.3f}  w {out.weights[i]:.3f}")

  truth = tabular.true_gradient(mdp)
  batch = tabular.to_batch(tabular.enumerate_online_trees(mdp, **rule), mdp)
  exact, _ = tabular.bpo_gradient_moments(batch, mdp, "zero", num_trees=1)
  sampled = tabular.to_batch([tabular.sample_online_tree(mdp, rng, **rule)
                              for _ in range(config.num_sampled_trees)], mdp,
                             capacity=batch.trees.parent.shape[1])
  monte_carlo = tabular.bpo_tree_gradients(sampled, mdp).mean(axis=0)
  exact_error = float(np.abs(exact - truth).max())
  mc_error = float(np.abs(monte_carlo - truth).max())
  print(f"\nTrue policy gradient (max |.|) {np.abs(truth).max():.4f}; {len(batch.probability)} "
        f"possible trees. Expected BPO gradient, exact: max error {exact_error:.2e}; mean of "
        f"{config.num_sampled_trees} sampled trees: max error {mc_error:.3f}.")

  rows = tabular.variance_table(mdp, **rule, max_groups=config.max_enumerated_groups)
  print("\nTotal gradient variance, exact (BPO/RLOO < 1: BPO lower):")
  print(tabular.format_variance_table(rows))
  summary = dict(exact_gradient_max_error=exact_error, sampled_gradient_max_error=mc_error,
                 num_trees_enumerated=len(batch.probability), variance_table=rows)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  print(f"\nWrote {os.path.join(workdir, 'summary.json')}")
  return summary
