"""Random well-formed trees, a plain-Python BPO reference that walks dicts of children, and the
rounding bound of BPO's float32 outputs on a tree.

The reference is written the way agent-RL code on PyTorch stacks usually is (a dict of children,
recursion for values, a walk from the root for baselines and weights), in float64; tests compare
the jitted estimators to it and benchmarks/estimators.py times both. (The readable JAX version
beside the fused kernel is `bpo_jax.estimators.bpo_advantages_reference`.)
"""

from __future__ import annotations

import numpy as np

from bpo_jax.tree import RolloutTree, TreeBuilder


def random_tree(rng: np.random.Generator, num_nodes: int, capacity: int | None = None, *,
                window: int = 8, root_children: int = 1, fail_prob: float = 0.0,
                num_states: int = 0) -> RolloutTree:
  """A random tree of `num_nodes` nodes: each new node hangs under one of the `window` most
  recent nodes (so forks and chains mix), the first `root_children` at the root state.

  Leaves are terminal; rewards are standard normal; with `fail_prob` a node's subtree is marked
  failed; with `num_states` > 0 state ids are drawn from that many values (GiGPO groups).
  """
  capacity = num_nodes if capacity is None else capacity
  builder = TreeBuilder(capacity)
  parents = []
  for i in range(num_nodes):
    if i < root_children:
      p = -1
    else:
      p = int(rng.integers(max(0, i - window), i))
    sid = int(rng.integers(0, num_states)) if num_states else -1
    builder.add(p, entropy=float(rng.exponential()), state_id=sid)
    parents.append(p)
  has_child = np.zeros(num_nodes, bool)
  for p in parents:
    if p >= 0:
      has_child[p] = True
  for i in range(num_nodes):
    builder.set_outcome(i, float(rng.normal()), terminal=not has_child[i])
  if fail_prob > 0:
    for i in range(num_nodes):
      if rng.random() < fail_prob:
        builder.mark_failed(i)
  return builder.build()


def reference_bpo(tree: RolloutTree, gamma: float = 1.0, trunk_baseline: float = 0.0):
  """BPO advantages and weights by walking a dict of children (float64 Python, one tree)."""
  parent = tree.parent.tolist()
  reward = tree.reward.tolist()
  valid = tree.valid.tolist()
  n = len(parent)
  children: dict[int, list[int]] = {}
  for i in range(n):
    if valid[i]:
      children.setdefault(parent[i], []).append(i)
  values = [0.0] * n
  for i in reversed(range(n)):
    if not valid[i]:
      continue
    kids = children.get(i, [])
    values[i] = reward[i] + (gamma * sum(values[c] for c in kids) / len(kids) if kids else 0.0)
  advantages, weights, baselines = [0.0] * n, [0.0] * n, [0.0] * n
  stack = [(-1, 1.0, trunk_baseline)]
  while stack:
    node, weight, inherited = stack.pop()
    kids = children.get(node, [])
    total = sum(values[c] for c in kids)
    for c in kids:
      if len(kids) >= 2:
        b = (total - values[c]) / (len(kids) - 1)
      elif node == -1:
        b = inherited
      else:
        b = (inherited - reward[node]) / gamma
      baselines[c] = b
      weights[c] = weight / len(kids)
      advantages[c] = values[c] - b
      stack.append((c, weights[c], b))
  return np.array(advantages), np.array(weights), np.array(values), np.array(baselines)


def random_bpo_tree(rng: np.random.Generator, num_nodes: int, capacity: int | None = None, *,
                    max_depth: int = 32, continue_prob: float = 0.85) -> RolloutTree:
  """A tree shaped like a BPO rollout: branches of at most `max_depth` steps (episodes have a
  step limit) that continue the latest step with `continue_prob`, else fork from an earlier
  non-terminal step; the last step of each branch is terminal.
  """
  capacity = num_nodes if capacity is None else capacity
  builder = TreeBuilder(capacity)
  depth: list[int] = []
  open_nodes: list[int] = []
  last = -1
  for i in range(num_nodes):
    if i == 0:
      p = -1
    elif last >= 0 and depth[last] < max_depth - 1 and rng.random() < continue_prob:
      p = last
    else:
      p = open_nodes[int(rng.integers(len(open_nodes)))] if open_nodes else -1
    builder.add(p, entropy=float(rng.exponential()))
    depth.append(0 if p < 0 else depth[p] + 1)
    if depth[-1] < max_depth - 1:
      open_nodes.append(i)
    last = i
  has_child = np.zeros(num_nodes, bool)
  tree = builder.build()
  for p in tree.parent[:num_nodes]:
    if p >= 0:
      has_child[p] = True
  for i in range(num_nodes):
    builder.set_outcome(i, float(rng.normal()), terminal=not has_child[i])
  return builder.build()


def bpo_roundings(tree: RolloutTree, gamma: float = 1.0) -> float:
  """An upper bound on the float32 roundings in any one computation of BPO on `tree` (the fused
  kernel, a reference), at most at the tree's largest magnitude M among rewards, values and
  baselines: two computations agree within `tolerance.ulp_tol(float32, M, steps)`.

  A node's value Q̂(i) takes at most k_i + 3 roundings of its own (a sum of its k_i children, a
  division, γ to float32 and the product with it, a sum with r_i) on top of its worst child's. A
  leave-one-out baseline among n siblings takes n + 3 of its own on top of at most three times
  its siblings' worst value error (the sum over n − 1 of them divided by n − 1, its own
  subtracted; n = 2 is the worst); an inherited one takes 4 (a difference, γ, 1 / γ and the
  product) on top of its parent's, all divided by γ; the trunk baseline's is its own rounding to
  float32. An advantage adds one to its value's and baseline's.
  """
  parent, valid = np.asarray(tree.parent), np.asarray(tree.valid, bool)
  n = parent.shape[0]
  slot = np.where(parent < 0, n, parent)
  num_children = np.bincount(slot[valid], minlength=n + 1)
  values = np.zeros(n)  # roundings in Q̂(i)
  worst_child = np.zeros(n + 1)  # the largest among a node's children (entry n: the root state)
  for i in reversed(range(n)):
    if valid[i]:
      values[i] = num_children[i] + 3 + worst_child[i]
      worst_child[slot[i]] = max(worst_child[slot[i]], values[i])
  baselines = np.zeros(n)  # roundings in b_i
  for i in range(n):
    num_siblings = num_children[slot[i]]
    if valid[i] and num_siblings >= 2:
      baselines[i] = num_siblings + 3 + 3 * worst_child[slot[i]]
    elif valid[i]:
      baselines[i] = (baselines[parent[i]] + 4) / gamma if parent[i] >= 0 else 1.0
  return float(np.max(np.where(valid, values + baselines + 1, 0.0), initial=1.0))
