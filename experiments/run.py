"""Main entry point: `python experiments/run.py --config=experiments/configs/X.py --workdir=DIR`.

A config with `demo = "estimators"` runs the estimator demo on a tabular MDP (quickstart.py);
any other config is handed to the training library's `train(config, workdir)`.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for outputs.")
flags.mark_flags_as_required(["config", "workdir"])


def estimator_demo(config, workdir: str) -> dict:
  """Grows BPO trees on a tabular MDP and prints advantages, gradients and the variance table."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np

  from bpo_jax import estimators
  from bpo_jax.testing import tabular

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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config, workdir = _CONFIG.value, _WORKDIR.value
  if config.get("demo") == "estimators":
    estimator_demo(config, workdir)
    return
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  if not hasattr(loop, "train"):
    raise NotImplementedError("bpo_jax.training.loop.train(config, workdir) does not exist yet")
  loop.train(config, workdir)


if __name__ == "__main__":
  app.run(main)
