"""How much of the return's variance the states of a tree's forks explain, without bias.

The estimator side of docs/DESIGN.md §3's variance measurement.

For a path drawn through a tree by its path weights (a uniform choice at each fork, so that the
path is a draw of the policy's episode, `estimators.bpo_advantages`), let τ_k be the state of
the k-th fork the path crosses (its k-th set of siblings), or its end when it crosses fewer.
τ_k is a stopping time when forks are decided online, and the law of total variance gives

    Var(G) = Var(E[G | s_τk]) + E[Var(G | s_τk)],

so the share of the return's variance that the level-k fork states explain is
1 − E[Var(G | s_τk)] / Var(G). `fork_moments` gives, per tree, unbiased estimates of E[G], E[G²]
and E[Var(G | s_τk)]; Var(G) then needs independent trees of one task
(`training.gradient_variance.fork_share`). A group of K episodes forks at the root: its level-1
share is 0 by construction, and so is that of a tree that forks at its first decision.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from bpo_jax import _tree_kernels as kernels
# The estimators' tree checks, shared with them.
# pylint: disable-next=protected-access
from bpo_jax.estimators import _check_tree, _parent_slot
from bpo_jax.estimators import leaf_mask, path_weights, sibling_counts
from bpo_jax.tree import RolloutTree

Array = chex.Array


class ReturnMoments(NamedTuple):
  """One tree's moments of the return G (`fork_moments`)."""
  mean: Array          # Σ_ℓ w_ℓ G_ℓ: unbiased for E[G]
  mean_square: Array   # Σ_ℓ w_ℓ G_ℓ²: unbiased for E[G²]
  within: Array        # unbiased for E[Var(G | s_τk)], s_τk a path's k-th fork state
  reach: Array         # Σ_g W_g: unbiased for the probability that a path has a k-th fork


def fork_moments(tree: RolloutTree, gamma: float = 1.0, level: int = 1) -> ReturnMoments:
  """Moments of the path return whose expectations over trees give the share of the return's
  variance that the level-`level` fork states explain (module docstring).

  G_ℓ = Σ_{j on ℓ's path} γ^{depth_j} r_j; w the path weights. A fork group g of level k is a
  set of K ≥ 2 siblings that are the k-th siblings on their paths; W_g = Σ_{i ∈ g} w_i the
  weight of the paths through it. At g, with X_i = Σ_{ℓ below i} (w_ℓ / w_i) G_ℓ and S_i =
  Σ_{ℓ below i} (w_ℓ / w_i) G_ℓ² (each sibling's subtree a draw given the fork's state s_g),

    within = Σ_g W_g · (mean_{i ∈ g} S_i − Σ_{i ≠ j ∈ g} X_i X_j / (K (K − 1))),

  the bracket unbiased for Var(G | s_g) since E[S_i | s_g] = E[G² | s_g] and E[X_i X_j | s_g] =
  E[G | s_g]² for i ≠ j under any online fork rule (a shared budget included); paths with fewer
  than k forks end known (Var 0). G is centred on the tree's mean (the bracket is invariant to a
  shift). `reach` = Σ_g W_g, the weight of the paths that have a level-k fork: the share reads as
  what the k-th fork states explain where it is near 1, and counts ended paths as resolved
  where it is not. `level` is a Python int ≥ 1 (static under jit).

  Example: parent = [-1, 0, 0, 1, 1], reward = [0, 0, 1, 2, 4]: path returns 1, 2, 4 with
  weights 1/2, 1/4, 1/4 → mean 2, mean_square 5.5. Level 1 is nodes 1 and 2 (W = 1) with X = 3,
  1 and S = 10, 1 → within = 5.5 − 3 = 2.5, reach 1; level 2 is nodes 3 and 4 (W = 1/2),
  whose returns 2 and 4 give the sample variance 2 → within = 1, reach 1/2.
  """
  if not isinstance(level, int) or level < 1:
    raise ValueError(f"level = {level!r}: must be a Python int >= 1 (fork levels count from 1)")
  n = _check_tree(tree)
  f32 = jnp.float32
  discount = jnp.asarray(gamma, f32) ** tree.depth.astype(f32)
  reward = jnp.where(tree.valid, tree.reward, 0.0)
  returns = kernels.solve_down(tree, jnp.ones((n,), f32), discount * reward, 0.0)
  weights = path_weights(tree)
  w = jnp.where(leaf_mask(tree), weights, 0.0)
  mean = jnp.sum(w * returns)
  mean_square = jnp.sum(w * returns ** 2)
  centred = returns - mean
  # Each node's fork level (the sibling sets on its path, its own included: small integers,
  # exact in float32), the members of level `level`, and each node's member ancestor (1 + its
  # index; 0 where the path has none).
  forked = tree.valid & (sibling_counts(tree) >= 2)
  count = kernels.solve_down(tree, jnp.ones((n,), f32), forked.astype(f32), 0.0)
  member = forked & (count == level)
  index = jnp.arange(1, n + 1, dtype=f32)
  anchor = kernels.solve_down(tree, jnp.where(member, 0.0, 1.0), jnp.where(member, index, 0.0),
                              0.0)
  below = jnp.where((w > 0) & (anchor > 0), anchor - 1, n).astype(jnp.int32)
  x = jax.ops.segment_sum(w * centred, below, num_segments=n + 1)[:n]
  sq = jax.ops.segment_sum(w * centred ** 2, below, num_segments=n + 1)[:n]
  w_i = jnp.where(member, weights, 1.0)
  x, sq = jnp.where(member, x / w_i, 0.0), jnp.where(member, sq / w_i, 0.0)
  # The groups: members sharing a parent slot.
  slot = jnp.where(member, _parent_slot(tree), n + 1)
  group = lambda v: jax.ops.segment_sum(v, slot, num_segments=n + 2)[:n + 1]
  k = group(member.astype(f32))
  pairs = (group(x) ** 2 - group(x ** 2)) / jnp.maximum(k * (k - 1.0), 1.0)
  bracket = jnp.where(k >= 2, group(sq) / jnp.maximum(k, 1.0) - pairs, 0.0)
  group_weight = group(jnp.where(member, weights, 0.0))
  within = jnp.sum(group_weight * bracket)
  return ReturnMoments(mean=mean, mean_square=mean_square, within=within,
                       reach=jnp.sum(jnp.where(k >= 2, group_weight, 0.0)))
