"""Advantage estimators over one RolloutTree: BPO, RLOO, GRPO, GiGPO, and tree diagnostics.

The maths is docs/DESIGN.md §3's. Every function is pure, takes ONE tree (arrays of length N),
is not jitted at definition (callers jit) and batches with `jax.vmap`. Invalid nodes (padding,
failed branches) affect nothing and get advantage 0 and weight 0.

BPO's pieces, with the siblings of node i the valid nodes with the same parent (i included), n_i
their number, and the children of i the valid nodes whose parent is i:

* `node_values`        Q̂(i) = r_i + γ · mean_{c ∈ children(i)} Q̂(c)   (a leaf: r_i, no bootstrap)
* `sibling_baselines`  b_i = mean_{j ∈ siblings(i), j ≠ i} Q̂(j)   if n_i ≥ 2 (leave-one-out),
                       b_i = (b_p − r_p) / γ                      if n_i = 1, p = parent(i) ≥ 0,
                       b_i = trunk_baseline                       if n_i = 1, parent(i) = −1;
                       the inherited form makes a chain below a fork carry its advantage.
* `path_weights`       w_i = Π_{j ∈ {i} ∪ ancestors(i)} 1 / n_j, the probability that a path
                       chosen uniformly at each fork passes through i.
* `bpo_advantages`     A_i = Q̂(i) − b_i, with w_i.

Σ_i w_i ∇log π(a_i|s_i) A_i is the average over the tree's paths of the single-path REINFORCE
estimate, hence unbiased when forks are decided online (branching.py).

The group estimators work on a star tree (K episodes at the root state, no other fork), with G_j
the return of episode j: `rloo_advantages` (Ahmadian et al. 2024), `grpo_advantages` (Shao et al.
2024) and `gigpo_advantages` (Feng et al. 2025); their docstrings give the formulas.

Nodes are stored parents first (parent(i) < i), so each quantity is one recurrence over the node
slots, solved in one pass by `_tree_kernels` (values children first, baselines and weights
parents first). `bpo_advantages` runs BPO's two passes fused (`_tree_kernels.fused_bpo`);
`bpo_advantages_reference` composes the three pieces above, and a test holds the two equal.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from bpo_jax import _tree_kernels as kernels
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


def _check_gamma(gamma) -> None:
  if isinstance(gamma, (int, float)) and not 0.0 < gamma <= 1.0:
    raise ValueError(f"gamma must be in (0, 1] for inherited baselines, got {gamma}")


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


def node_values(tree: RolloutTree, gamma: float = 1.0) -> Array:
  """float32[N]: Q̂(i) = r_i + γ · mean_{c ∈ children(i)} Q̂(c); leaves (terminal, truncated or
  unfinished) take r_i; invalid nodes 0.

  Q̂(i) is the mean discounted return of i's subtree under a uniform choice at each fork: an
  unbiased estimate of Q(s_i, a_i) when forks are decided online.

  Unrolled, Q̂(i) = Σ_{d ∈ subtree(i)} ρ(i, d) r_d with ρ(i, d) = Π_{j on the path below i down
  to d} γ / n_j. It is computed by one reverse pass over the nodes (`_tree_kernels.sum_up`):
  T(i) = r_i + Σ_{c ∈ children(i)} (γ / n_c) · T(c), every child finished before its parent. The
  relative factors γ / n_c never underflow the way absolute path weights of deep trees would.

  Example: parent = [-1, 0, 0], reward = [1, 2, 4], γ = 0.5 → Q̂ = [1 + 0.5·3, 2, 4] = [2.5, 2, 4].
  """
  _check_tree(tree)
  n_sib = sibling_counts(tree)
  rel = jnp.where(tree.valid, gamma / jnp.maximum(n_sib, 1).astype(jnp.float32), 0.0)
  total = jnp.where(tree.valid, tree.reward, 0.0).astype(jnp.float32)
  return kernels.sum_up(tree, rel.astype(jnp.float32), total)


def sibling_baselines(tree: RolloutTree, values: Array, gamma: float = 1.0,
                      trunk_baseline: Array | float = 0.0) -> Array:
  """float32[N]: leave-one-out sibling baselines, inherited along chains (module docstring).

  One recurrence b_i = a_i · b_parent(i) + c_i, parents first: a fork (n_i ≥ 2) sets
  (a, c) = (0, leave-one-out mean), a lone step below a node p sets (1/γ, −r_p/γ), a lone step at
  the root state (0, trunk_baseline).

  Args:
    tree: one tree.
    values: float32[N], `node_values(tree, gamma)`.
    gamma: the discount, in (0, 1] (inheritance divides by it).
    trunk_baseline: baseline for a lone step at the root state (and, inherited, for the trunk
      below it): 0, or `leave_one_out_trunk_baselines` over other trees of the same task. It must
      not depend on this tree's actions.

  Example: parent = [-1, 0, 0], reward = [0, 1, 3], γ = 1, trunk 0.5 → b = [0.5, 3, 1].
  """
  n = _check_tree(tree)
  chex.assert_shape(values, (n,))
  _check_gamma(gamma)
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
  return kernels.solve_down(tree, a, c, 0.0)


def path_weights(tree: RolloutTree) -> Array:
  """float32[N]: w_i = Π over i and its ancestors of 1 / (number of siblings); 0 if invalid.

  One recurrence w_i = w_parent(i) / n_i, parents first, from w = 1 above the root state. The
  weights of the leaves sum to 1; so do the weights of any set of nodes that cuts every path.
  Example: parent = [-1, 0, 0, 1, 1] → w = [1, 1/2, 1/2, 1/4, 1/4].
  """
  _check_tree(tree)
  n_sib = sibling_counts(tree)
  inv = jnp.where(tree.valid, 1.0 / jnp.maximum(n_sib, 1).astype(jnp.float32), 0.0)
  return kernels.solve_down(tree, inv, jnp.zeros_like(inv), 1.0)


def bpo_advantages(tree: RolloutTree, *, gamma: float = 1.0,
                   trunk_baseline: Array | float = 0.0) -> BPOOutput:
  """BPO: per-node advantages A_i = Q̂(i) − b_i and path weights w_i (docs/DESIGN.md §3).

  Q̂ are the `node_values`, b the `sibling_baselines` (leave-one-out over siblings, inherited
  along chains, the trunk baseline before the first fork), w the `path_weights`. The tree's
  policy-gradient estimate Σ_i w_i · A_i · ∇log π(a_i | s_i) is the mean over its paths of the
  single-path REINFORCE estimate (Williams 1992, "Simple Statistical Gradient-Following
  Algorithms for Connectionist Reinforcement Learning") with a leave-one-out baseline at each fork
  (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"), so it is unbiased when
  forks are decided online.

  Computed by the fused kernel `_tree_kernels.fused_bpo` in O(N); `bpo_advantages_reference`
  gives the same numbers up to float32 rounding from the three pieces.

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
  _check_gamma(gamma)
  return BPOOutput(*kernels.fused_bpo(
      jnp.asarray(tree.parent, jnp.int32), jnp.asarray(tree.reward, jnp.float32),
      jnp.asarray(tree.valid, bool), jnp.asarray(trunk_baseline, jnp.float32),
      jnp.asarray(gamma, jnp.float32)))


def bpo_advantages_reference(tree: RolloutTree, *, gamma: float = 1.0,
                             trunk_baseline: Array | float = 0.0) -> BPOOutput:
  """`bpo_advantages` composed from its pieces, each from its own recurrence: Q̂ =
  `node_values`, b = `sibling_baselines`, w = `path_weights`, A = Q̂ − b.

  The same numbers up to float32 rounding (a test holds the two together on random trees): for
  reading and for checking the fused kernel.
  """
  values = node_values(tree, gamma)
  baselines = sibling_baselines(tree, values, gamma, trunk_baseline)
  return BPOOutput(values - baselines, path_weights(tree), values, baselines)


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
  return jnp.where(tree.valid, kernels.solve_down(tree, a, c, 0.0), 0.0)


def _episode_returns(tree: RolloutTree, gamma: float):
  values = node_values(tree, gamma)
  at_root = tree.valid & (tree.parent < 0)
  count = jnp.sum(at_root)
  return values, at_root, count


def rloo_advantages(tree: RolloutTree, *, gamma: float = 1.0) -> Array:
  """RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
  Learning from Human Feedback in LLMs"): every step of episode j gets G_j − mean_{k ≠ j} G_k.

  The episodes are the steps at the root state (a star tree of K independent trajectories);
  G_j is the root step's value Q̂ (its discounted return for a chain). Needs K ≥ 2 episodes.
  The returns are taken relative to one of them first (as in `_group_deviations`), so equal
  returns give exactly 0.

  Example: episode returns [1, 2, 6] → advantages [−3, −1.5, 4.5] on every step of each episode.
  """
  _check_tree(tree)
  values, at_root, count = _episode_returns(tree, gamma)
  shifted = values - jnp.max(jnp.where(at_root, values, -jnp.inf))
  shifted = jnp.where(at_root, shifted, 0.0)
  loo = (jnp.sum(shifted) - shifted) / jnp.maximum(count - 1, 1)
  return _broadcast_from_root_children(tree, jnp.where(at_root, shifted - loo, 0.0))


def grpo_advantages(tree: RolloutTree, *, gamma: float = 1.0, normalize_std: bool = True,
                    ddof: int = 0, eps: float = 1e-6) -> Array:
  """GRPO (Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in
  Open Language Models"): every step of episode j gets (G_j − mean G) / (std G + eps), or
  G_j − mean G.

  std is the standard deviation over the K episodes with `ddof` degrees of freedom removed:
  √(Σ_j (G_j − mean G)² / (K − ddof)). The defaults (ddof = 0, the population std; eps = 1e-6)
  read the GRPO paper's std of the group; TRL's GRPOTrainer and verl take torch's unbiased std
  (ddof = 1), TRL with eps = 1e-4, verl with 1e-6 (config keys `rollout.group_std_ddof`,
  `rollout.group_std_eps`; docs/DESIGN.md §3). Dividing by the std makes the estimator biased;
  `normalize_std=False` is the Dr. GRPO variant. A group of equal returns gets exactly 0.
  Relation to RLOO: G_j − mean G = (K − 1)/K · (G_j − mean_{k≠j} G_k).

  Example: returns [1, 2, 6]: mean 3, std √(14/3) (ddof 0) → ≈ [−0.926, −0.463, 1.389];
  std √7 (ddof 1) → ≈ [−0.756, −0.378, 1.134].
  """
  _check_tree(tree)
  values, at_root, _ = _episode_returns(tree, gamma)
  centred, std, _ = _group_deviations(jnp.zeros_like(tree.state_id), at_root, values, ddof)
  adv = _normalised(centred, std, eps) if normalize_std else centred
  return _broadcast_from_root_children(tree, jnp.where(at_root, adv, 0.0))


def _normalised(centred: Array, std: Array, eps: float) -> Array:
  """centred / (std + eps), and 0 where std + eps = 0 (a group of equal values, eps = 0)."""
  scale = std + eps
  return jnp.where(scale > 0, centred / jnp.where(scale > 0, scale, 1.0), 0.0)


def _group_deviations(keys: Array, member: Array, x: Array, ddof: int = 0):
  """Per node: x − mean_g x over its group g (the members sharing its key), the group's std
  √(Σ_g (x − mean_g x)² / (|g| − ddof)) and its size |g|. Non-members form groups of their own.

  The deviations are taken from a member first, (x − x_g) − mean_g (x − x_g) with x_g the
  group's largest value: the same numbers algebraically, and exactly 0 in a group of equal
  values, where float32 would round mean_g x off x (three returns of 0.9: 6e-8, which a std
  normalisation with eps = 1e-6 turns into advantages of +0.056).
  """
  n = keys.shape[0]
  # Non-members get distinct keys past every member so they form groups of their own.
  big = jnp.iinfo(jnp.int32).max
  order = jnp.argsort(jnp.where(member, keys, big), stable=True)
  sorted_keys = jnp.where(member, keys, big)[order]
  new_group = jnp.concatenate([jnp.ones((1,), bool), sorted_keys[1:] != sorted_keys[:-1]])
  new_group = new_group | ~member[order]
  group_sorted = jnp.cumsum(new_group) - 1
  group = jnp.zeros((n,), jnp.int32).at[order].set(group_sorted.astype(jnp.int32))
  m = member.astype(jnp.float32)
  size = jax.ops.segment_sum(m, group, num_segments=n)
  shifted = x - jax.ops.segment_max(x, group, num_segments=n)[group]
  mean = jax.ops.segment_sum(shifted * m, group, num_segments=n) / jnp.maximum(size, 1.0)
  centred = (shifted - mean[group]) * m
  var = jax.ops.segment_sum(centred**2, group, num_segments=n)
  var = var / jnp.maximum(size - ddof, 1.0)
  return centred, jnp.sqrt(var)[group], size[group]


def gigpo_advantages(tree: RolloutTree, *, gamma: float = 1.0, step_weight: float = 1.0,
                     step_gamma: float | None = None, normalize_std: bool = True,
                     ddof: int = 0, eps: float = 1e-6) -> Array:
  """GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"): an
  episode-level group advantage plus a step-level group advantage.

  A_i = A^E(episode of i) + ω · A^S_i, where A^E is `grpo_advantages` over the episodes at the
  root state (returns discounted by `gamma`), and A^S_i = (R_i − mean_g R) / (std_g R + eps)
  over the step group g of valid nodes with the same `state_id` (an anchor state reached by
  several episodes), R_i the return from step i discounted by `step_gamma` (`gamma` if None).
  Steps with state_id −1 or alone in their group get A^S = 0, so do groups of equal returns.
  `normalize_std=False` drops both divisions; `ddof` and `eps` are GRPO's, in both.

  The GiGPO paper's settings are ω = 1, step_gamma = 0.95, std normalisation on (its reference
  code, in verl, takes the unbiased std, ddof = 1, eps = 1e-6); the config's defaults are ω = 1,
  step_gamma = 1 and ddof = 0 (docs/DESIGN.md §3).

  Example: two episodes of two steps, both first steps at state 7 with returns R = 1 and 3,
  episode returns 1 and 3, ω = 1, no std: A^E = [−1, −1, 1, 1] and A^S = [−1, 0, 1, 0].
  """
  _check_tree(tree)
  episode = grpo_advantages(tree, gamma=gamma, normalize_std=normalize_std, ddof=ddof, eps=eps)
  values = node_values(tree, gamma if step_gamma is None else step_gamma)
  member = tree.valid & (tree.state_id >= 0)
  step, std, size = _group_deviations(tree.state_id, member, values, ddof)
  if normalize_std:
    step = _normalised(step, std, eps)
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
  """Scalar ≥ 0: a tree's last-fork sibling means' spread about its mean return, as a share of
  its returns' spread; how much its returns differ by fork (`fork_variance.fork_moments` gives
  the unbiased share). For a leaf ℓ, G_ℓ = Σ_{j on its path} γ^{depth_j} r_j, f the deepest node on
  the path with siblings, m_ℓ = (return before f) + γ^{depth_f} · mean of Q̂ over f's siblings;
  with μ = Σ_ℓ w_ℓ G_ℓ, the result is Σ_ℓ w_ℓ (m_ℓ − μ)² / Σ_ℓ w_ℓ (G_ℓ − μ)² (0 if the latter is).

  Read as Var(E[G | s_f]) / Var(G) it is biased: m_ℓ averages the siblings' own randomness (on
  pure-noise trees of two fork levels, true share 0, it averages 0.31 at K = 2, 0.19 at K = 4);
  the denominator is one tree's spread, whose paths share a prefix; and paths stop at forks of
  different depths, so the sums are no law-of-total-variance decomposition.
  Example: parent = [-1, 0, 0, 1, 1], reward = [0, 0, 1, 2, 4]: path returns 1, 2, 4 with
  weights 1/2, 1/4, 1/4 (μ = 2, spread 1.5); last-fork means 2, 3, 3 (spread about μ 0.5)
  → 1/3.
  """
  n = _check_tree(tree)
  values = node_values(tree, gamma)
  discount = jnp.asarray(gamma, jnp.float32) ** tree.depth.astype(jnp.float32)
  reward = jnp.where(tree.valid, tree.reward, 0.0)
  # Return from the root up to and including each node.
  prefix = kernels.solve_down(tree, jnp.ones((n,), jnp.float32), discount * reward, 0.0)
  slot = _parent_slot(tree)
  n_sib = sibling_counts(tree)
  sib_mean = jax.ops.segment_sum(jnp.where(tree.valid, values, 0.0), slot,
                                 num_segments=n + 2)[slot] / jnp.maximum(n_sib, 1)
  before = prefix - discount * reward
  anchor_here = (n_sib >= 2) | (tree.parent < 0)
  a = jnp.where(anchor_here, 0.0, 1.0).astype(jnp.float32)
  c = jnp.where(anchor_here, before + discount * sib_mean, 0.0).astype(jnp.float32)
  anchored = kernels.solve_down(tree, a, c, 0.0)
  w = jnp.where(leaf_mask(tree), path_weights(tree), 0.0)
  mean = jnp.sum(w * prefix)
  var_total = jnp.sum(w * (prefix - mean) ** 2)
  var_explained = jnp.sum(w * (anchored - mean) ** 2)
  return jnp.where(var_total > 1e-12, var_explained / jnp.maximum(var_total, 1e-12), 0.0)
