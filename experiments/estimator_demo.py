r"""The estimator demo: BPO trees on a tabular MDP, their advantages, gradients and variances.

    python experiments/estimator_demo.py --workdir=workdirs/estimator_demo
    python experiments/estimator_demo.py --workdir=workdirs/estimator_demo --config.mdp.horizon=4

It grows BPO trees with the online entropy fork rule, prints one tree's values, baselines,
advantages and path weights, the exact expected gradient (every tree enumerated) and a Monte
Carlo average against the true policy gradient, and the exact BPO-vs-RLOO gradient variance
table, in seconds on a CPU, no downloads; the figures go to `<workdir>/summary.json`. The
settings are `settings()`, each a `--config.a.b=v` override.
"""

import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np

from bpo_jax import estimators
from bpo_jax.testing import tabular
from experiments import cli


def settings() -> ml_collections.ConfigDict:
  """The MDP (a root with one likely action, depth 3), the fork rule and the sample sizes."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.mdp = ml_collections.ConfigDict(dict(num_actions=2, horizon=3, root_logit=2.5,
                                         logit_scale=0.7))
  c.branching = ml_collections.ConfigDict(dict(entropy_threshold=0.55, fork_k=2, max_forks=2))
  c.num_sampled_trees = 2000
  # RLOO groups with more outcomes than this are left out of the variance table (time).
  c.max_enumerated_groups = 40_000
  return c


_FLAGS = {}


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


def parse_flags(argv):
  """absl flag parsing that reports a bad override or flag in one line."""
  rest = cli.parse_flags_over(argv, settings())
  if not _FLAGS["workdir"].value:
    cli.fail("--workdir is required")
  return rest


def main(argv):
  cli.refuse_arguments(argv)
  run(_FLAGS["config"].value, _FLAGS["workdir"].value)


if __name__ == "__main__":
  cli.check_overrides(sys.argv, settings())
  _FLAGS["config"] = config_flags.DEFINE_config_dict("config", settings(), lock_config=True)
  _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "Where summary.json is written.")
  app.run(main, flags_parser=parse_flags)
