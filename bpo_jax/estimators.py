"""Advantage estimators over one RolloutTree: BPO, RLOO, GRPO, GiGPO, and diagnostics.

Every function is pure, takes ONE tree (arrays of length N), is not jitted at definition (callers
jit) and batches with `jax.vmap`. Invalid nodes (padding, failed branches) affect nothing and get
advantage 0 and weight 0.

BPO (docs/DESIGN.md §3). Siblings of node i are the valid nodes with the same parent (i
included), n_i their number. Children of i are the valid nodes whose parent is i.

* Node value   Q̂(i) = r_i + γ · mean_{c ∈ children(i)} Q̂(c)      (a leaf: Q̂(i) = r_i).
  A truncated or unfinished leaf also has value r_i: there is no bootstrap.
* Baseline     b_i = mean_{j ∈ siblings(i), j ≠ i} Q̂(j)     if n_i ≥ 2 (leave-one-out),
               b_i = (b_p − r_p) / γ                         if n_i = 1 and p = parent(i) ≥ 0,
               b_i = trunk_baseline                          if n_i = 1 and parent(i) = −1.
  The inherited form makes a chain below a fork carry the fork's advantage: A_i = A_p / γ.
* Path weight  w_i = Π_{j ∈ {i} ∪ ancestors(i)} 1 / n_j, the probability that a path chosen
  uniformly at each fork passes through i.
* Advantage    A_i = Q̂(i) − b_i.

Σ_i w_i ∇log π(a_i|s_i) A_i is the average over the tree's paths of the single-path REINFORCE
estimate, hence unbiased when forks are decided online (branching.py).

The group estimators work on a star tree (K episodes at the root state, no other fork), with G_j
the return of episode j:
* RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
  Learning from Human Feedback in LLMs"): A_j = G_j − mean_{k ≠ j} G_k; BPO on a star tree gives
  the same at γ = 1.
* GRPO (Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
  Language Models"): A_j = (G_j − mean G) / std G, biased by the division.
* GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"): GRPO's
  episode advantage plus a step-level one over the steps taken at the same state.

Code. Nodes are stored parents first (parent(i) < i), so each quantity is one pass over the node
slots: values children first, baselines and weights parents first. `bpo_advantages` runs both
passes in one fused kernel (`_forest_bpo`) that, under `jax.vmap`, treats a batch of trees as one
forest, each of its 2N steps updating every tree at once; `bpo_advantages_reference` computes the
same numbers as the formulas above read, in O(N²), for reading and for the tests. `node_values`,
`path_weights` and `sibling_baselines` give one quantity each, on two single-pass kernels. The
kernels have no reverse-mode derivative (advantages are targets, not differentiated); their
XLA CPU tuning is explained once, in the performance notes of `_forest_bpo`.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
from jax import lax
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
  to d} γ / n_j. It is computed by one reverse pass over the nodes (`_forest_subtree_sums`):
  T(i) = r_i + Σ_{c ∈ children(i)} (γ / n_c) · T(c), every child finished before its parent. The
  relative factors γ / n_c never underflow the way absolute path weights of deep trees would.

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
  return a, c


def bpo_advantages(tree: RolloutTree, *, gamma: float = 1.0,
                   trunk_baseline: Array | float = 0.0) -> BPOOutput:
  """BPO per-node advantages A_i = Q̂(i) − b_i and path weights w_i (module docstring).

  The policy-gradient estimate of the tree is Σ_i w_i · A_i · ∇log π(a_i | s_i). The numbers are
  those of `bpo_advantages_reference`, computed by the fused kernel `_forest_bpo` in O(N).

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
  return BPOOutput(*_bpo_kernel(
      jnp.asarray(tree.parent, jnp.int32), jnp.asarray(tree.reward, jnp.float32),
      jnp.asarray(tree.valid, bool), jnp.asarray(trunk_baseline, jnp.float32),
      jnp.asarray(gamma, jnp.float32)))


def bpo_advantages_reference(tree: RolloutTree, *, gamma: float = 1.0,
                             trunk_baseline: Array | float = 0.0) -> BPOOutput:
  """`bpo_advantages` as the formulas of the module docstring read, one node at a time.

  The same numbers up to float32 rounding (a test holds the two together on random trees) in
  O(N²) work and memory: for reading and for checking the fused kernel, not for training.
  """
  n = _check_tree(tree)
  _check_gamma(gamma)
  f32 = jnp.float32
  valid = jnp.asarray(tree.valid, bool)
  parent = jnp.asarray(tree.parent, jnp.int32)
  reward = jnp.where(valid, jnp.asarray(tree.reward, f32), 0.0)
  trunk = jnp.asarray(trunk_baseline, f32)
  # is_child[p, i]: node i is a valid child of node p; row N is the root state.
  parent_row = jnp.where(parent < 0, n, parent)
  is_child = valid[None, :] & (parent_row[None, :] == jnp.arange(n + 1)[:, None])
  num_children = jnp.sum(is_child, axis=1)
  num_siblings = jnp.where(valid, num_children[parent_row], 0)

  # Q̂(i) = r_i + γ · mean_{c ∈ children(i)} Q̂(c) (0 for a leaf), children first.
  def value(k, values):
    i = n - 1 - k
    mean = jnp.sum(jnp.where(is_child[i], values, 0.0)) / jnp.maximum(num_children[i], 1)
    return values.at[i].set(jnp.where(valid[i], reward[i] + gamma * mean, 0.0))

  values = lax.fori_loop(0, n, value, jnp.zeros((n,), f32))
  sibling_sum = jnp.sum(jnp.where(is_child, values[None, :], 0.0), axis=1)[parent_row]
  leave_one_out = (sibling_sum - values) / jnp.maximum(num_siblings - 1, 1)

  # b_i: leave-one-out among siblings, else inherited from the parent (the trunk baseline at the
  # root state); w_i = w_parent(i) / n_i. Parents first.
  def baseline_and_weight(i, carry):
    baselines, weights = carry
    p, at_root = jnp.maximum(parent[i], 0), parent[i] < 0
    inherited = jnp.where(at_root, trunk, (baselines[p] - reward[p]) / gamma)
    b = jnp.where(num_siblings[i] >= 2, leave_one_out[i], inherited)
    w = jnp.where(at_root, 1.0, weights[p]) / jnp.maximum(num_siblings[i], 1)
    return (baselines.at[i].set(jnp.where(valid[i], b, 0.0)),
            weights.at[i].set(jnp.where(valid[i], w, 0.0)))

  zeros = jnp.zeros((n,), f32)
  baselines, weights = lax.fori_loop(0, n, baseline_and_weight, (zeros, zeros))
  return BPOOutput(values - baselines, weights, values, baselines)


@jax.custom_batching.custom_vmap
def _bpo_kernel(parent: Array, reward: Array, valid: Array, trunk_baseline: Array,
                gamma: Array) -> tuple[Array, Array, Array, Array]:
  """[..., N] trees (and [...] trunk baselines and discounts) as one forest of trees."""
  lead, n = parent.shape[:-1], parent.shape[-1]
  flat = [x.reshape(-1, n) for x in (parent, reward, valid)]
  out = _forest_bpo(*flat, trunk_baseline.reshape(-1), gamma.reshape(-1))
  return tuple(x.reshape(lead + (n,)) for x in out)


@_bpo_kernel.def_vmap
def _bpo_kernel_batched(axis_size, in_batched, *args):
  args = [x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
          for x, batched in zip(args, in_batched)]
  return _bpo_kernel(*args), (True, True, True, True)


def _forest_bpo(parent: Array, reward: Array, valid: Array, trunk_baseline: Array,
                gamma: Array) -> tuple[Array, Array, Array, Array]:
  """BPO on a forest of W trees stored tree by tree: parent/reward/valid [W, N],
  trunk_baseline/gamma [W]. Returns (advantages, weights, values, baselines), each [W, N] and 0
  at invalid nodes: the numbers of `bpo_advantages_reference` (up to rounding) in O(N · W) work
  and 2N steps.

  The inputs are transposed once to node-major rows [N, W], so that step i of a pass reads node i
  of every tree as one contiguous row; the outputs are transposed back once. Row indices into the
  pass buffers are slot · W + column, with slot the parent, N for the root state and N + 1 for an
  invalid node.

  Reverse pass (i = N − 1, …, 0) on a buffer of N + 2 rows holding, for each node, the sum and
  the count of its valid children's values as ONE complex number sum + i·count: node i reads its
  row, forms Q̂(i) = r_i + γ · sum / count and scatter-adds Q̂(i) + i into its parent's row.

  Forward pass (i = 0, …, N − 1). With p = parent(i), s_p and n_p the sum and count of p's
  children's values (n_p is also i's sibling count), the baseline is
    b_i = A_p − β_p · Q̂(i),   β_p = 1 / (n_p − 1) if n_p ≥ 2 else 0,
    A_p = s_p / (n_p − 1)                  if n_p ≥ 2 (leave-one-out),
    A_p = (b_p − r_p) / γ                  if n_p = 1 (inherited),
    A_root = s_N / (n_N − 1) or the trunk baseline,
  and the weight w_i = w_p / n_p. Each node i, once b_i and w_i are known, writes A_i + i·w_i/n_i
  into its row of a complex buffer its children gather from, so a step gathers A_p, w_p / n_p and
  β_p and writes rows of its own: a pure gather-and-write recurrence.

  Example (one tree, γ = 1, trunk 0): parent [[-1, 0, 0]], reward [[0, 1, 3]]: the reverse pass
  gives Q̂ = [2, 1, 3] and row 0 = 4 + 2i; forward: A_root = 0, so b_0 = 0, w_0 = 1; node 0
  hands its children A_0 = 4 / 1, β_0 = 1, w_0 / 2, so b_1 = 4 − 1 = 3, b_2 = 1,
  w = [1, 0.5, 0.5].

  Performance notes (XLA CPU; for this kernel and the single-pass ones, `_forest_subtree_sums`
  and `_forest_affine_down`). They shape the code, not its numbers. Each step is a few one-row
  fusions that update their buffer in place; what keeps them so:
  * A bare transpose is copied by a tiled kernel, one with elementwise work fused into it (the
    parents' row indices, say) by a plain loop, about 7x slower: hence plain transposes, and the
    row indices computed inside each step. The single-pass kernels transpose behind an
    optimisation barrier and take their buffers flat, or XLA folds the transpose into every
    consumer or gives an operand a column-major layout, and each row read strides the array.
  * Reading the buffer a step updates in place (the next row read before the scatter, a gather
    from the buffer being written) makes XLA copy the whole buffer at every step, or keep the
    read out of the in-place fusion as a gather of its own (below): hence the next row is read
    after the scatter, what the children gather is kept apart from the baselines and weights,
    and `_forest_affine_down` keeps two copies of x.
  * A scatter costs about the same per element whatever the element's width: hence the
    (sum, count) pair as one complex number, half the elements of two floats.
  * XLA CPU splits a large gather across threads at every step, which costs more than the step;
    a gathered value used twice becomes a second gather: hence the real and the imaginary part
    gathered separately, each used once. A loop body of at most 8 thunks runs inline, a longer
    one through the thread pool at a cost above the step's: the bodies here compile to 8 and 5
    thunks, and unrolling the loops is slower for that reason.
  """
  width = parent.shape[0]
  rows = _NodeRows(parent.T, valid.T, reward.astype(jnp.float32).T,
                   jnp.arange(width, dtype=jnp.int32))
  children, values = _bpo_reverse_pass(rows, gamma)
  baselines, weights = _bpo_forward_pass(rows, children, values, trunk_baseline, gamma)
  return (values - baselines).T, weights.T, values.T, baselines.T


class _NodeRows(NamedTuple):
  """A forest node-major: row i ([W]) holds node i of every tree; columns = arange(W)."""
  parent: Array
  valid: Array
  reward: Array
  columns: Array

  def parent_of(self, i: Array) -> tuple[Array, Array]:
    """The flat index (slot · W + column) of node i's parent row, and node i's validity."""
    n, width = self.parent.shape
    p, ok = _row_at(self.parent, i), _row_at(self.valid, i)
    return jnp.where(ok, jnp.where(p < 0, n, p), n + 1) * width + self.columns, ok


def _row_at(x: Array, i: Array) -> Array:
  return lax.dynamic_index_in_dim(x, i, 0, keepdims=False)


def _bpo_reverse_pass(rows: _NodeRows, gamma: Array) -> tuple[Array, Array]:
  """Node values, children first: (the complex sum + i·count buffer, flat [(N + 2) · W]; the
  values [N, W]). See `_forest_bpo`."""
  n, width = rows.parent.shape
  f32 = jnp.float32

  def reverse_step(k, carry):
    children, values, own = carry  # own: node i's row of children
    i = n - 1 - k
    at, ok = rows.parent_of(i)
    value = jnp.where(ok, _row_at(rows.reward, i) + gamma * own.real / jnp.maximum(own.imag, 1.0),
                      0.0)
    children = children.at[at].add(lax.complex(value, ok.astype(f32)), unique_indices=True)
    values = lax.dynamic_update_index_in_dim(values, value, i, 0)
    # The next row, read after the scatter (performance notes of `_forest_bpo`).
    own = lax.dynamic_slice_in_dim(children, jnp.maximum(i - 1, 0) * width, width)
    return children, values, own

  children = jnp.zeros(((n + 2) * width,), jnp.complex64)
  children, values, _ = lax.fori_loop(
      0, n, reverse_step, (children, jnp.zeros((n, width), f32), children[:width]))
  return children, values


def _bpo_forward_pass(rows: _NodeRows, children: Array, values: Array, trunk_baseline: Array,
                      gamma: Array) -> tuple[Array, Array]:
  """Baselines and weights [N, W], parents first. See `_forest_bpo`."""
  n, width = rows.parent.shape
  inv_gamma = 1.0 / gamma
  counts = children.imag
  beta = jnp.where(counts >= 2, 1.0 / jnp.maximum(counts - 1.0, 1.0), 0.0)
  root = children[n * width:(n + 1) * width]
  root_a = jnp.where(root.imag >= 2, root.real / jnp.maximum(root.imag - 1.0, 1.0),
                     trunk_baseline)
  for_children = jnp.zeros(((n + 2) * width,), jnp.complex64)
  for_children = for_children.at[n * width:(n + 1) * width].set(
      lax.complex(root_a, 1.0 / jnp.maximum(root.imag, 1.0)))

  def forward_step(i, carry):
    for_children, baselines, weights = carry
    at, ok = rows.parent_of(i)
    own = lax.dynamic_slice_in_dim(children, i * width, width)
    value, total, count = _row_at(values, i), own.real, own.imag
    a_p = for_children.real.at[at].get(mode="clip")
    w_p = for_children.imag.at[at].get(mode="clip")
    beta_p = beta.at[at].get(mode="clip")
    baselines = lax.dynamic_update_index_in_dim(
        baselines, jnp.where(ok, a_p - beta_p * value, 0.0), i, 0)
    weights = lax.dynamic_update_index_in_dim(weights, jnp.where(ok, w_p, 0.0), i, 0)
    b, w = _row_at(baselines, i), _row_at(weights, i)
    a = jnp.where(count >= 2, total / jnp.maximum(count - 1.0, 1.0),
                  jnp.where(count == 1, (b - _row_at(rows.reward, i)) * inv_gamma, 0.0))
    for_children = lax.dynamic_update_slice_in_dim(
        for_children, lax.complex(a, w / jnp.maximum(count, 1.0)), i * width, 0)
    return for_children, baselines, weights

  zeros = jnp.zeros((n, width), jnp.float32)
  _, baselines, weights = lax.fori_loop(0, n, forward_step, (for_children, zeros, zeros))
  return baselines, weights


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
  The returns are taken relative to one of them first (`_group_deviations`), so equal returns
  give exactly 0.

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
  """GRPO: every step of episode j gets (G_j − mean G) / (std G + eps), or G_j − mean G.

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
  """GiGPO: an episode-level group advantage plus a step-level group advantage.

  A_i = A^E(episode of i) + ω · A^S_i, where A^E is `grpo_advantages` over the episodes at the
  root state (returns discounted by `gamma`), and A^S_i = (R_i − mean_g R) / (std_g R + eps)
  over the step group g of valid nodes with the same `state_id` (an anchor state reached by
  several episodes), R_i the return from step i discounted by `step_gamma` (`gamma` if None).
  Steps with state_id −1 or alone in their group get A^S = 0, so do groups of equal returns.
  `normalize_std=False` drops both divisions; `ddof` and `eps` are GRPO's, in both.

  The GiGPO paper's settings are ω = 1, step_gamma = 0.95, std normalisation on (its reference
  code, in verl, takes the unbiased std, ddof = 1, eps = 1e-6); the config's defaults (ω = 1,
  step_gamma = 1, ddof = 0) keep the earlier behaviour (docs/DESIGN.md §3).

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


def _solve_affine_down(tree: RolloutTree, a: Array, c: Array, x_root: Array | float) -> Array:
  """Solves x_i = a_i · x_{parent(i)} + c_i (x_{−1} = x_root) in one forward pass over the nodes.

  `a` and `c` may carry leading axes ([..., N]: several recurrences over one tree at once, with
  x_root broadcast against them). Requires parent(i) < i or −1 (topological order).
  """
  jump = jnp.where(tree.valid, tree.parent, -1).astype(jnp.int32)
  a, c = jnp.broadcast_arrays(a.astype(jnp.float32), c.astype(jnp.float32))
  # The kernel reads 0 above the roots: fold x_root into the roots' constant term.
  at_root = jump < 0
  c = jnp.where(at_root, c + a * jnp.asarray(x_root, jnp.float32), c)
  a = jnp.where(at_root, 0.0, a)
  return _affine_kernel(jump, a, c)


def _node_major(*xs: Array) -> tuple[Array, ...]:
  """[..., N] arrays → [N, W]: every leading index becomes one column (one tree of a forest).

  The transposed copies are made once, flat, behind an optimisation barrier (performance notes of
  `_forest_bpo`).
  """
  n = xs[0].shape[-1]
  flat = lax.optimization_barrier(tuple(x.reshape(-1, n).T.reshape(-1) for x in xs))
  return tuple(x.reshape(n, -1) for x in flat)


def _forest_columns(slot: Array) -> Array:
  """Flat indices slot · W + column into a node-major buffer of W columns, int32[N, W]."""
  width = slot.shape[1]
  return slot * width + jnp.arange(width, dtype=jnp.int32)[None, :]


def _rows(x: Array) -> Array:
  """[N, W] → flat [N · W], read row by row with `_row` (performance notes of `_forest_bpo`)."""
  return x.reshape(-1)


def _row(flat: Array, i: Array, width: int) -> Array:
  """Row i ([W]) of a flat node-major array."""
  return lax.dynamic_slice_in_dim(flat, i * width, width)


def _forest_subtree_sums(jump: Array, rel: Array, total: Array) -> Array:
  """One reverse pass over a node-major forest [N, W] (each column a tree, jump −1 at roots):
  T(i) = total_i + Σ_{c ∈ children(i)} rel_c · T(c).

  Children come after their parent, so visiting nodes N − 1, …, 0 finishes every child before
  its parent: step i reads the sum its children pushed into row i, then pushes rel_i · T(i)
  into its parent's row (roots push into a spare row N). Each step is a contiguous row read, a
  W-element scatter-add and a row write: O(N · W) work in N steps.
  """
  n, width = jump.shape
  target = _rows(_forest_columns(jnp.where(jump >= 0, jump, n)))
  rel, total = _rows(rel), _rows(total)

  def visit(k, carry):
    pushed, totals, children_sum = carry
    i = n - 1 - k
    t_i = _row(total, i, width) + children_sum
    pushed = pushed.at[_row(target, i, width)].add(_row(rel, i, width) * t_i,
                                                   unique_indices=True)
    totals = lax.dynamic_update_slice_in_dim(totals, t_i, i * width, 0)
    # The next row, read after the scatter (performance notes of `_forest_bpo`).
    children_sum = lax.dynamic_slice_in_dim(pushed, jnp.maximum(i - 1, 0) * width, width)
    return pushed, totals, children_sum

  pushed = jnp.zeros(((n + 1) * width,), jnp.float32)
  init = (pushed, jnp.zeros((n * width,), jnp.float32), pushed[(n - 1) * width:n * width])
  _, totals, _ = lax.fori_loop(0, n, visit, init)
  return totals.reshape(n, width)


def _forest_affine_down(jump: Array, a: Array, c: Array) -> Array:
  """One forward pass over a node-major forest [N, W]: x_i = a_i · x_{jump(i)} + c_i, with
  x = 0 above the roots (jump −1).

  Parents come before their children, so visiting nodes 0, …, N − 1 finds every parent's x
  final: each step gathers W parent values (roots read a zero row N) and writes row i. O(N · W)
  work in N steps.
  """
  n, width = jump.shape
  source = _rows(_forest_columns(jnp.where(jump >= 0, jump, n)))
  a, c = _rows(a), _rows(c)

  # Two copies of x: each step gathers from one, writes row i into the other and copies the row
  # across (performance notes of `_forest_bpo`).
  def visit(i, buffers):
    x_read, x_write = buffers
    x_parent = jnp.take(x_read, _row(source, i, width), mode="clip")
    x_i = _row(a, i, width) * x_parent + _row(c, i, width)
    x_write = lax.dynamic_update_slice_in_dim(x_write, x_i, i * width, 0)
    x_read = lax.dynamic_update_slice_in_dim(
        x_read, lax.dynamic_slice_in_dim(x_write, i * width, width), i * width, 0)
    return x_read, x_write

  zeros = jnp.zeros(((n + 1) * width,), jnp.float32)
  _, x = lax.fori_loop(0, n, visit, (zeros, jnp.zeros_like(zeros)))
  return x[:n * width].reshape(n, width)


def _as_forest(kernel, jump: Array, x: Array, y: Array) -> Array:
  """Runs a forest kernel on [..., N] arrays (jump broadcast against them), node-major inside."""
  jump, x, y = jnp.broadcast_arrays(jump, x, y)
  shape = x.shape
  out = kernel(*_node_major(jump, x, y))
  return out.T.reshape(shape)


def _batch_rule(kernel):
  """custom_vmap rule: the vmapped axis becomes more trees of the same forest."""
  def rule(axis_size, in_batched, jump, x, y):
    jump, x, y = (v if batched else jnp.broadcast_to(v, (axis_size,) + v.shape)
                  for v, batched in zip((jump, x, y), in_batched))
    # jump is [B, ..., N] with possibly fewer middle axes than x and y: align them.
    jump = jump.reshape(jump.shape[:1] + (1,) * (x.ndim - jump.ndim) + jump.shape[1:])
    return kernel(jump, x, y), True
  return rule


# Under vmap a batch of trees is one forest of B columns: each of the N steps of a pass then
# works on B nodes at once (and nested vmaps add columns). No reverse-mode autodiff: advantages
# and weights are targets, not differentiated.
@jax.custom_batching.custom_vmap
def _affine_kernel(jump: Array, a: Array, c: Array) -> Array:
  return _as_forest(_forest_affine_down, jump, a, c)


_affine_kernel.def_vmap(_batch_rule(_affine_kernel))


@jax.custom_batching.custom_vmap
def _subtree_kernel(jump: Array, rel: Array, total: Array) -> Array:
  return _as_forest(_forest_subtree_sums, jump, rel, total)


_subtree_kernel.def_vmap(_batch_rule(_subtree_kernel))
