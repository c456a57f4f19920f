"""Advantage estimators over one RolloutTree: BPO, RLOO, GRPO, GiGPO, and diagnostics.

Every function is pure, takes ONE tree (arrays of length N), is not jitted at definition (callers
jit) and batches with `jax.vmap`. Invalid nodes (padding, failed branches) affect nothing and get
advantage 0 and weight 0.

Notation (DESIGN.md §3). Siblings of node i are the valid nodes with the same parent (i included),
n_i their number. Children of i are the valid nodes whose parent is i.

* Node value   Q̂(i) = r_i + γ · mean_{c ∈ children(i)} Q̂(c)      (a leaf: Q̂(i) = r_i).
  A truncated or unfinished leaf also has value r_i: there is no bootstrap.
* Baseline     b_i = mean_{j ∈ siblings(i), j ≠ i} Q̂(j)            if n_i ≥ 2 (leave-one-out),
               b_i = (b_p − r_p) / γ                                if n_i = 1 and p = parent(i) ≥ 0,
               b_i = trunk_baseline                                 if n_i = 1 and parent(i) = −1.
  The inherited form makes a chain below a fork carry the fork's advantage: A_i = A_p / γ.
* Path weight  w_i = Π_{j ∈ {i} ∪ ancestors(i)} 1 / n_j, the probability that a path chosen
  uniformly at each fork passes through i.
* Advantage    A_i = Q̂(i) − b_i.

Σ_i w_i ∇log π(a_i|s_i) A_i is the average over the tree's paths of the single-path REINFORCE
estimate, hence unbiased when forks are decided online (branching.py).

Parent walks are vectorised with ⌈log2 N⌉ pointer-jumping passes each: subtree sums (node values)
by doubling segment sums, and every forward quantity (weights, inherited baselines, the root of
each node) as an affine recurrence x_i = a_i x_{parent(i)} + c_i. Work is O(N log N), with no
sequential loop over nodes. Under `jax.vmap` the two kernels treat the batch as one flat forest
(`jax.custom_batching.custom_vmap`), which is several times faster than batched gathers and
scatters; the kernels have no reverse-mode derivative (advantages are targets, not
differentiated).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from bpo_jax.tree import RolloutTree

Array = chex.Array


class BPOOutput(NamedTuple):
  """Per-node results of `bpo_advantages` (all float32[N], 0 at invalid nodes)."""
  advantages: Array
  weights: Array
  values: Array
  baselines: Array


def _check_tree(tree: RolloutTree) -> int:
  chex.assert_rank(tree.parent, 1)
  n = tree.parent.shape[0]
  chex.assert_shape([tree.reward, tree.terminal, tree.truncated, tree.valid, tree.entropy,
                     tree.state_id, tree.depth], (n,))
  return n


def _parent_slot(tree: RolloutTree) -> Array:
  """Segment index of each node's parent: the parent itself, or N for the root state.

  Invalid nodes go to slot N + 1 so they never count anywhere.
  """
  n = tree.parent.shape[0]
  slot = jnp.where(tree.parent < 0, n, tree.parent)
  return jnp.where(tree.valid, slot, n + 1).astype(jnp.int32)


def children_counts(tree: RolloutTree) -> Array:
  """int32[N + 1]: valid children of each node; entry N counts the steps at the root state.

  Example: parent = [-1, 0, 0] gives [2, 0, 0, 1].
  """
  n = _check_tree(tree)
  counts = jax.ops.segment_sum(tree.valid.astype(jnp.int32), _parent_slot(tree),
                               num_segments=n + 2)
  return counts[:n + 1]


def sibling_counts(tree: RolloutTree) -> Array:
  """int32[N]: number of valid siblings of each node, itself included (0 if invalid)."""
  n = _check_tree(tree)
  counts = jnp.concatenate([children_counts(tree), jnp.zeros((1,), jnp.int32)])
  return jnp.where(tree.valid, counts[_parent_slot(tree)], 0)


def _forest_affine_down(jump: Array, a: Array, c: Array) -> Array:
  """Pointer jumping over a forest given as flat arrays: jump[M] (−1 at roots), a/c [..., M].

  Returns (A, C) stacked as [2, ..., M] with x_i = A_i · x_root + C_i.
  """
  def jump_once(carry):
    mult, add, jump = carry
    has_parent = jump >= 0
    safe = jnp.maximum(jump, 0)
    add = jnp.where(has_parent, mult * add[..., safe] + add, add)
    mult = jnp.where(has_parent, mult * mult[..., safe], mult)
    jump = jnp.where(has_parent, jump[safe], -1)
    return mult, add, jump

  # A loop, not a Python unroll: it keeps XLA from fusing the passes into one ever-deeper gather.
  # It stops once every node has reached its root: ⌈log2(depth + 1)⌉ passes, at most ⌈log2 M⌉.
  mult, add, _ = jax.lax.while_loop(lambda carry: jnp.any(carry[2] >= 0), jump_once,
                                    (a, c, jump))
  return jnp.stack([mult, add])


def _forest_subtree_sums(jump: Array, rel: Array, total: Array) -> Array:
  """Doubling over a forest of flat arrays [M]: T(i) = Σ_{d ∈ subtree(i)} ρ(i, d) total_d, with
  ρ(parent(j), j) = rel_j (see `node_values`)."""
  m = jump.shape[0]

  def double_once(carry):
    total, rel, jump = carry
    has_parent = jump >= 0
    safe = jnp.maximum(jump, 0)
    total = total + jax.ops.segment_sum(jnp.where(has_parent, rel * total, 0.0),
                                        jnp.where(has_parent, jump, m), num_segments=m + 1)[:m]
    rel = jnp.where(has_parent, rel * rel[safe], rel)
    jump = jnp.where(has_parent, jump[safe], -1)
    return total, rel, jump

  total, _, _ = jax.lax.while_loop(lambda carry: jnp.any(carry[2] >= 0), double_once,
                                   (total, rel, jump))
  return total


def _flatten_forest(jump: Array) -> Array:
  """[B, N] per-tree parent pointers → [B·N] pointers into one flat forest."""
  b, n = jump.shape
  return jnp.where(jump >= 0, jump + (jnp.arange(b, dtype=jump.dtype) * n)[:, None],
                   -1).reshape(-1)


# Under vmap a batch of trees is one forest: flat gathers and scatters over B·N nodes run several
# times faster than batched ones (and one loop serves the batch). No reverse-mode autodiff:
# advantages and weights are targets, not differentiated.
@jax.custom_batching.custom_vmap
def _affine_kernel(jump: Array, a: Array, c: Array) -> Array:
  return _forest_affine_down(jump, a, c)


@_affine_kernel.def_vmap
def _affine_kernel_batched(axis_size, in_batched, jump, a, c):
  jump, a, c = (x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
                for x, batched in zip((jump, a, c), in_batched))
  b, n = jump.shape
  lead = a.shape[1:-1]
  move = lambda x: jnp.moveaxis(x, 0, -2).reshape(lead + (b * n,))
  out = _affine_kernel(_flatten_forest(jump), move(a), move(c))  # [2, ..., B·N]
  out = out.reshape((2,) + lead + (b, n))
  return jnp.moveaxis(out, -2, 0), True


@jax.custom_batching.custom_vmap
def _subtree_kernel(jump: Array, rel: Array, total: Array) -> Array:
  return _forest_subtree_sums(jump, rel, total)


@_subtree_kernel.def_vmap
def _subtree_kernel_batched(axis_size, in_batched, jump, rel, total):
  jump, rel, total = (x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
                      for x, batched in zip((jump, rel, total), in_batched))
  b, n = jump.shape
  out = _subtree_kernel(_flatten_forest(jump), rel.reshape(-1), total.reshape(-1))
  return out.reshape(b, n), True


def _solve_affine_down(tree: RolloutTree, a: Array, c: Array, x_root: Array | float) -> Array:
  """Solves x_i = a_i · x_{parent(i)} + c_i (x_{−1} = x_root) by pointer jumping.

  `a` and `c` may carry leading axes ([..., N]: several recurrences over one tree at once, with
  x_root broadcast against them).

  After pass k every node knows x_i = A_i · x_{J_i} + C_i with J_i its 2^k-th ancestor (or −1),
  so ⌈log2 N⌉ passes reach the root for every node. Requires parent(i) < i or −1.
  """
  jump = jnp.where(tree.valid, tree.parent, -1).astype(jnp.int32)
  a, c = jnp.broadcast_arrays(a.astype(jnp.float32), c.astype(jnp.float32))
  mult, add = _affine_kernel(jump, a, c)
  return mult * x_root + add


def node_values(tree: RolloutTree, gamma: float = 1.0) -> Array:
  """float32[N]: Q̂(i) = r_i + γ · mean_{c ∈ children(i)} Q̂(c); leaves (terminal, truncated or
  unfinished) take r_i; invalid nodes 0.

  Q̂(i) is the mean discounted return of i's subtree under a uniform choice at each fork: an
  unbiased estimate of Q(s_i, a_i) when forks are decided online.

  Unrolled, Q̂(i) = Σ_{d ∈ subtree(i)} ρ(i, d) r_d with ρ(i, d) = Π_{j on the path below i down
  to d} γ / n_j. It is computed by doubling: T_k(i) sums the descendants less than 2^k steps
  below i, and T_{k+1}(i) = T_k(i) + Σ_{j exactly 2^k below i} ρ(i, j) T_k(j), one segment sum
  per pass, ⌈log2 N⌉ passes. The relative factors ρ never underflow the way absolute path
  weights of deep trees would.

  Example: parent = [-1, 0, 0], reward = [1, 2, 4], γ = 0.5 → Q̂ = [1 + 0.5·3, 2, 4] = [2.5, 2, 4].
  """
  _check_tree(tree)
  n_sib = sibling_counts(tree)
  jump = jnp.where(tree.valid, tree.parent, -1).astype(jnp.int32)
  rel = jnp.where(tree.valid, gamma / jnp.maximum(n_sib, 1).astype(jnp.float32), 0.0)
  total = jnp.where(tree.valid, tree.reward, 0.0).astype(jnp.float32)
  return _subtree_kernel(jump, rel.astype(jnp.float32), total)


def path_weights(tree: RolloutTree) -> Array:
  """float32[N]: w_i = Π over i and its ancestors of 1 / (number of siblings); 0 if invalid.

  The weights of the leaves sum to 1; so do the weights of any set of nodes that cuts every path.
  Example: parent = [-1, 0, 0, 1, 1] → w = [1, 1/2, 1/2, 1/4, 1/4].
  """
  _check_tree(tree)
  a, c = _weight_recurrence(tree)
  return _solve_affine_down(tree, a, c, 1.0)


def _weight_recurrence(tree: RolloutTree) -> tuple[Array, Array]:
  """w_i = (1 / n_i) · w_parent(i): the (a, c) of the affine recurrence."""
  n_sib = sibling_counts(tree)
  inv = jnp.where(tree.valid, 1.0 / jnp.maximum(n_sib, 1).astype(jnp.float32), 0.0)
  return inv, jnp.zeros_like(inv)


def sibling_baselines(tree: RolloutTree, values: Array, gamma: float = 1.0,
                      trunk_baseline: Array | float = 0.0) -> Array:
  """float32[N]: leave-one-out sibling baselines, inherited along chains (module docstring).

  Args:
    tree: one tree.
    values: float32[N], `node_values(tree, gamma)`.
    gamma: the discount, in (0, 1] (inheritance divides by it).
    trunk_baseline: baseline for a lone step at the root state (and, inherited, for the trunk
      below it): 0, or `leave_one_out_trunk_baselines` over other trees of the same task. It must
      not depend on this tree's actions.

  Example: parent = [-1, 0, 0], reward = [0, 1, 3], γ = 1, trunk 0.5 → b = [0.5, 3, 1].
  """
  a, c = _baseline_recurrence(tree, values, gamma, trunk_baseline)
  return _solve_affine_down(tree, a, c, 0.0)


def _baseline_recurrence(tree: RolloutTree, values: Array, gamma: float,
                         trunk_baseline: Array | float) -> tuple[Array, Array]:
  """The (a, c) of b_i = a_i · b_parent(i) + c_i (module docstring)."""
  n = _check_tree(tree)
  chex.assert_shape(values, (n,))
  if isinstance(gamma, (int, float)) and not 0.0 < gamma <= 1.0:
    raise ValueError(f"gamma must be in (0, 1] for inherited baselines, got {gamma}")
  slot = _parent_slot(tree)
  n_sib = sibling_counts(tree)
  valid_values = jnp.where(tree.valid, values, 0.0)
  sibling_sum = jax.ops.segment_sum(valid_values, slot, num_segments=n + 2)[slot]
  loo = (sibling_sum - valid_values) / jnp.maximum(n_sib - 1, 1).astype(jnp.float32)
  parent_reward = jnp.where(tree.parent >= 0,
                            jnp.asarray(tree.reward)[jnp.maximum(tree.parent, 0)], 0.0)
  is_fork = n_sib >= 2
  is_trunk_start = (n_sib == 1) & (tree.parent < 0)
  a = jnp.where(is_fork | is_trunk_start, 0.0, 1.0 / gamma)
  c = jnp.where(is_fork, loo, jnp.where(is_trunk_start, trunk_baseline, -parent_reward / gamma))
  a = jnp.where(tree.valid, a, 0.0).astype(jnp.float32)
  c = jnp.where(tree.valid, c, 0.0).astype(jnp.float32)
  return a, c


def bpo_advantages(tree: RolloutTree, *, gamma: float = 1.0,
                   trunk_baseline: Array | float = 0.0) -> BPOOutput:
  """BPO per-node advantages A_i = Q̂(i) − b_i and path weights w_i (module docstring).

  The policy-gradient estimate of the tree is Σ_i w_i · A_i · ∇log π(a_i | s_i).

  Example (γ = 1, zero trunk): a backbone step 0 (reward 0) at the root, then a fork of two
  terminal steps with rewards 1 and 3: parent = [-1, 0, 0], reward = [0, 1, 3] →
  Q̂ = [2, 1, 3], b = [0, 3, 1], A = [2, −2, 2], w = [1, 0.5, 0.5].

  Args:
    tree: one tree (vmap for a batch).
    gamma: discount in (0, 1].
    trunk_baseline: scalar baseline for the trunk (see `sibling_baselines`).
  Returns:
    BPOOutput(advantages, weights, values, baselines), each float32[N].
  """
  _check_tree(tree)
  values = node_values(tree, gamma)
  # Baselines and weights are both affine recurrences down the tree: solve them in one pass.
  base_a, base_c = _baseline_recurrence(tree, values, gamma, trunk_baseline)
  weight_a, weight_c = _weight_recurrence(tree)
  solved = _solve_affine_down(tree, jnp.stack([base_a, weight_a]), jnp.stack([base_c, weight_c]),
                              jnp.array([[0.0], [1.0]], jnp.float32))
  baselines, weights = solved[0], solved[1]
  advantages = jnp.where(tree.valid, values - baselines, 0.0)
  return BPOOutput(advantages, weights, values, jnp.where(tree.valid, baselines, 0.0))


def root_value(tree: RolloutTree, gamma: float = 1.0) -> Array:
  """Scalar: mean Q̂ of the valid steps at the root state (the tree's estimate of V(s_0))."""
  n = _check_tree(tree)
  values = node_values(tree, gamma)
  at_root = tree.valid & (tree.parent < 0)
  return jnp.sum(jnp.where(at_root, values, 0.0)) / jnp.maximum(jnp.sum(at_root), 1)


def leave_one_out_trunk_baselines(root_values: Array) -> Array:
  """float32[M]: for each of M trees of one task, the mean root value of the other M − 1 trees.

  Example: [1, 2, 6] → [4, 3.5, 1.5].
  """
  chex.assert_rank(root_values, 1)
  m = root_values.shape[0]
  if m < 2:
    raise ValueError(f"a leave-one-out trunk baseline needs at least 2 trees, got {m}")
  return (jnp.sum(root_values) - root_values) / (m - 1)


def _broadcast_from_root_children(tree: RolloutTree, per_node: Array) -> Array:
  """Each valid node takes the value `per_node` has at its ancestor at the root state."""
  at_root = tree.parent < 0
  a = jnp.where(at_root, 0.0, 1.0).astype(jnp.float32)
  c = jnp.where(at_root, per_node, 0.0).astype(jnp.float32)
  return jnp.where(tree.valid, _solve_affine_down(tree, a, c, 0.0), 0.0)


def _episode_returns(tree: RolloutTree, gamma: float):
  values = node_values(tree, gamma)
  at_root = tree.valid & (tree.parent < 0)
  count = jnp.sum(at_root)
  return values, at_root, count


def rloo_advantages(tree: RolloutTree, *, gamma: float = 1.0) -> Array:
  """RLOO: every step of episode j gets G_j − mean_{k ≠ j} G_k.

  The episodes are the steps at the root state (a star tree of K independent trajectories);
  G_j is the root step's value Q̂ (its discounted return for a chain). Needs K ≥ 2 episodes.

  Example: episode returns [1, 2, 6] → advantages [−3, −1.5, 4.5] on every step of each episode.
  """
  _check_tree(tree)
  values, at_root, count = _episode_returns(tree, gamma)
  total = jnp.sum(jnp.where(at_root, values, 0.0))
  loo = (total - values) / jnp.maximum(count - 1, 1)
  return _broadcast_from_root_children(tree, jnp.where(at_root, values - loo, 0.0))


def grpo_advantages(tree: RolloutTree, *, gamma: float = 1.0, normalize_std: bool = True,
                    eps: float = 1e-6) -> Array:
  """GRPO: every step of episode j gets (G_j − mean G) / (std G + eps), or G_j − mean G.

  std is the population standard deviation over the K episodes (ddof = 0). Dividing by it makes
  the estimator biased (DESIGN.md §3); `normalize_std=False` is the Dr. GRPO variant.
  Relation to RLOO: G_j − mean G = (K − 1)/K · (G_j − mean_{k≠j} G_k).

  Example: returns [1, 2, 6]: mean 3, std √(14/3) → advantages ≈ [−0.926, −0.463, 1.389].
  """
  _check_tree(tree)
  values, at_root, count = _episode_returns(tree, gamma)
  count_f = jnp.maximum(count, 1).astype(jnp.float32)
  mean = jnp.sum(jnp.where(at_root, values, 0.0)) / count_f
  centred = jnp.where(at_root, values - mean, 0.0)
  adv = centred
  if normalize_std:
    std = jnp.sqrt(jnp.sum(centred**2) / count_f)
    adv = centred / (std + eps)
  return _broadcast_from_root_children(tree, adv)


def _group_stats(keys: Array, member: Array, x: Array):
  """Per-node mean, population std and size of x over the members sharing the node's key."""
  n = keys.shape[0]
  # Non-members get distinct keys past every member so they form groups of their own.
  big = jnp.iinfo(jnp.int32).max
  order = jnp.argsort(jnp.where(member, keys, big), stable=True)
  sorted_keys = jnp.where(member, keys, big)[order]
  sorted_member = member[order]
  new_group = jnp.concatenate([jnp.ones((1,), bool), sorted_keys[1:] != sorted_keys[:-1]])
  new_group = new_group | ~sorted_member
  group_sorted = jnp.cumsum(new_group) - 1
  group = jnp.zeros((n,), jnp.int32).at[order].set(group_sorted.astype(jnp.int32))
  m = member.astype(jnp.float32)
  size = jax.ops.segment_sum(m, group, num_segments=n)
  mean = jax.ops.segment_sum(x * m, group, num_segments=n) / jnp.maximum(size, 1.0)
  var = jax.ops.segment_sum(((x - mean[group]) ** 2) * m, group, num_segments=n)
  var = var / jnp.maximum(size, 1.0)
  return mean[group], jnp.sqrt(var)[group], size[group]


def gigpo_advantages(tree: RolloutTree, *, gamma: float = 1.0, step_weight: float = 1.0,
                     normalize_std: bool = True, eps: float = 1e-6) -> Array:
  """GiGPO: an episode-level group advantage plus a step-level group advantage.

  A_i = A^E(episode of i) + ω · A^S_i, where A^E is `grpo_advantages` over the episodes at the
  root state, and A^S_i = (Q̂(i) − mean_g Q̂) / (std_g Q̂ + eps) over the step group g of valid
  nodes with the same `state_id` (an anchor state reached by several episodes). Steps with
  state_id −1 or alone in their group get A^S = 0. `normalize_std=False` drops both divisions.

  Example: two episodes of two steps, both first steps at state 7 with returns Q̂ = 1 and 3,
  episode returns 1 and 3, ω = 1, no std: A^E = [−1, −1, 1, 1] and A^S = [−1, 0, 1, 0].
  """
  _check_tree(tree)
  episode = grpo_advantages(tree, gamma=gamma, normalize_std=normalize_std, eps=eps)
  values = node_values(tree, gamma)
  member = tree.valid & (tree.state_id >= 0)
  mean, std, size = _group_stats(tree.state_id, member, values)
  step = values - mean
  if normalize_std:
    step = step / (std + eps)
  step = jnp.where(member & (size >= 2), step, 0.0)
  return jnp.where(tree.valid, episode + step_weight * step, 0.0)


def leaf_mask(tree: RolloutTree) -> Array:
  """bool[N]: valid nodes without valid children."""
  n = _check_tree(tree)
  return tree.valid & (children_counts(tree)[:n] == 0)


def effective_num_samples(tree: RolloutTree) -> Array:
  """Scalar: 1 / Σ_leaves w_ℓ², the effective number of root-to-leaf paths.

  It is the number of leaves for a star tree (equal weights) and smaller when forks are uneven.
  Example: parent = [-1, 0, 0, 1, 1] (leaves 2, 3, 4 with weights 1/2, 1/4, 1/4) → 1/(3/8) = 8/3.
  """
  w = jnp.where(leaf_mask(tree), path_weights(tree), 0.0)
  return 1.0 / jnp.maximum(jnp.sum(w**2), 1e-30)


def prefix_explained_variance(tree: RolloutTree, gamma: float = 1.0) -> Array:
  """Scalar in [0, 1]: the share of the path-return variance explained by each path's last fork.

  For a leaf ℓ let G_ℓ = Σ_{j on its path} γ^{depth_j} r_j (the return from the root), and f the
  deepest node on the path with siblings; m_ℓ = (return of the path before f) + γ^{depth_f} ·
  mean of Q̂ over f's siblings estimates E[G | s_f]. With the leaves weighted by w,
  the result is Var_w(m) / Var_w(G) (0 when Var_w(G) = 0). Sibling advantages remove this share
  of the variance that independent-trajectory baselines keep (law of total variance).
  Example: parent = [-1, 0, 0, 1, 1], reward = [0, 0, 1, 2, 4]: path returns 1, 2, 4 with
  weights 1/2, 1/4, 1/4 (variance 1.5); last-fork means 2, 3, 3 (variance 0.5) → 1/3.
  """
  n = _check_tree(tree)
  values = node_values(tree, gamma)
  discount = jnp.asarray(gamma, jnp.float32) ** tree.depth.astype(jnp.float32)
  reward = jnp.where(tree.valid, tree.reward, 0.0)
  # Return from the root up to and including each node.
  prefix = _solve_affine_down(tree, jnp.ones((n,), jnp.float32), discount * reward, 0.0)
  slot = _parent_slot(tree)
  n_sib = sibling_counts(tree)
  sib_mean = jax.ops.segment_sum(jnp.where(tree.valid, values, 0.0), slot,
                                 num_segments=n + 2)[slot] / jnp.maximum(n_sib, 1)
  before = prefix - discount * reward
  anchor_here = (n_sib >= 2) | (tree.parent < 0)
  a = jnp.where(anchor_here, 0.0, 1.0).astype(jnp.float32)
  c = jnp.where(anchor_here, before + discount * sib_mean, 0.0).astype(jnp.float32)
  anchored = _solve_affine_down(tree, a, c, 0.0)
  w = jnp.where(leaf_mask(tree), path_weights(tree), 0.0)
  mean = jnp.sum(w * prefix)
  var_total = jnp.sum(w * (prefix - mean) ** 2)
  var_explained = jnp.sum(w * (anchored - mean) ** 2)
  return jnp.where(var_total > 1e-12, var_explained / jnp.maximum(var_total, 1e-12), 0.0)
