"""Total gradient variance of BPO against RLOO (docs/DESIGN.md §3), by exact enumeration.

Not a theorem: the answer depends on the tree shape and on the trunk baseline, so this prints the
table (reported, not asserted) for small tabular MDPs: BPO under the online fork rule with a
zero trunk baseline and with a leave-one-out-across-trees trunk baseline, against RLOO at equal
leaves and at equal env steps. The reference is RLOO; the ratio is Var(BPO) / Var(RLOO)
(below 1: BPO has lower variance).

A second table takes MDPs whose root is uncertain and trees of 4 leaves that fork at every
state, with K' = 2, 3 or 4 siblings at the root (`rollout.root_k`) and 2 below, against RLOO
with 2-5 episodes (as many as can be enumerated); its last column is variance × env steps (the
variance of an average over a fixed env-step budget; lower is better).

  python benchmarks/variance_table.py [--json]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top
from bpo_jax.testing import tabular

SETTINGS = (
    dict(seed=0, num_actions=2, horizon=3, threshold=0.55, max_forks=2),
    dict(seed=1, num_actions=2, horizon=3, threshold=0.55, max_forks=1),
    dict(seed=0, num_actions=3, horizon=3, threshold=0.9, max_forks=1),
)

# Uncertain roots (logit scale 0.7 everywhere: root entropy 0.66-0.69 nats).
ROOT_SETTINGS = (
    dict(seed=0, num_actions=2, horizon=3),
    dict(seed=1, num_actions=2, horizon=4),
    dict(seed=2, num_actions=2, horizon=3),
)


def main():
  args = common.parser(__doc__.splitlines()[0]).parse_args()
  figures, lines = {"settings": []}, []
  for s in SETTINGS:
    root = (2.5,) + (-2.5,) * (s["num_actions"] - 1)
    mdp = tabular.make_mdp(s["seed"], num_actions=s["num_actions"], horizon=s["horizon"],
                           root_logits=root, logit_scale=0.7)
    rows = tabular.variance_table(mdp, threshold=s["threshold"], fork_k=2,
                                  max_forks=s["max_forks"])
    lines.append(f"\nMDP seed {s['seed']}, {s['num_actions']} actions, depth {s['horizon']}, "
                 f"fork 2 ways when entropy > {s['threshold']}, at most {s['max_forks']} forks")
    lines.append(tabular.format_variance_table(rows))
    figures["settings"].append(dict(s, rows=rows))
  figures["root_siblings"] = []
  for s in ROOT_SETTINGS:
    mdp = tabular.make_mdp(s["seed"], num_actions=s["num_actions"], horizon=s["horizon"],
                           logit_scale=0.7)
    rows = tabular.root_siblings_table(mdp)
    lines.append(f"\nMDP seed {s['seed']}, {s['num_actions']} actions, depth {s['horizon']}, "
                 f"root entropy {float(mdp.entropy()[0]):.2f} nats; 4-leaf trees forking "
                 f"everywhere")
    lines.append(tabular.format_variance_table(rows, last="per_step", header="Var x steps"))
    figures["root_siblings"].append(dict(s, rows=rows))
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
