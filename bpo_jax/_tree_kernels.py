"""The loops behind estimators.py: BPO fused into two passes, and two one-pass tree recurrences.

Private. `estimators.py` states each quantity as a formula (docs/DESIGN.md §3) and solves it
here; `estimators.bpo_advantages_reference` composes the readable pieces and a test holds it
equal to `fused_bpo` on random trees (tests/test_estimators.py).

* `sum_up(tree, rel, total)`: T(i) = total_i + Σ_{c ∈ children(i)} rel_c · T(c), children first.
* `solve_down(tree, a, c, x_root)`: x_i = a_i · x_{parent(i)} + c_i, parents first.
* `fused_bpo(parent, reward, valid, trunk_baseline, gamma)`: BPO's values, then its baselines and
  weights, in one reverse and one forward pass (`_forest_bpo`).

Nodes are stored parents first (parent(i) < i), so every quantity is one pass over the node
slots. Under `jax.vmap` a batch of trees is one forest: the arrays are laid out node-major
([N, W], row i holding node i of every tree) and each of a pass's N steps updates every tree at
once (`jax.custom_batching.custom_vmap`; nested vmaps add columns). There is no reverse-mode
derivative: advantages and weights are targets, not differentiated.

Why the loops are written as they are (XLA CPU; the code's shape, not its numbers, follows).
Each step must stay a few one-row fusions that update their buffer in place:
* A bare transpose is copied by a tiled kernel, one with elementwise work fused into it by a
  plain loop, much slower: so transposes stay bare, row indices are computed inside each step,
  and the one-pass kernels transpose behind an optimisation barrier into flat buffers (else XLA
  folds the transpose into every consumer, or lays an operand out column-major, and each row
  read strides the array).
* Reading the buffer a step updates in place (a row read before the scatter, a gather from the
  buffer being written) makes XLA copy the whole buffer every step: so the next row is read
  after the scatter, what children gather is kept apart from the baselines and weights, and
  `_forest_affine_down` keeps two copies of x.
* A scatter costs about the same per element whatever the element's width: so a (sum, count)
  pair travels as one complex number.
* XLA CPU splits a large gather across threads at every step, and a gathered value used twice
  becomes a second gather: so the real and imaginary parts are gathered separately, each used
  once. A loop body of at most 8 thunks runs inline, a longer one through the thread pool: the
  bodies here are 8 and 5 thunks, and unrolling them is slower.
benchmarks/estimators.py times `fused_bpo` against a plain-Python reference.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
from jax import lax
import jax.numpy as jnp

from bpo_jax.tree import RolloutTree

Array = chex.Array


def sum_up(tree: RolloutTree, rel: Array, total: Array) -> Array:
  """T(i) = total_i + Σ_{c ∈ children(i)} rel_c · T(c) over the valid nodes, children first.

  `rel` and `total` are float32[N] (0 at invalid nodes, which count nowhere).
  """
  jump = jnp.where(tree.valid, tree.parent, -1).astype(jnp.int32)
  return _subtree_kernel(jump, rel, total)


def solve_down(tree: RolloutTree, a: Array, c: Array, x_root: Array | float) -> Array:
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


@jax.custom_batching.custom_vmap
def fused_bpo(parent: Array, reward: Array, valid: Array, trunk_baseline: Array,
              gamma: Array) -> tuple[Array, Array, Array, Array]:
  """BPO's (advantages, weights, values, baselines) of [..., N] trees (int32 parent, float32
  reward, bool valid; [...] float32 trunk baselines and discounts) as one forest of trees."""
  lead, n = parent.shape[:-1], parent.shape[-1]
  flat = [x.reshape(-1, n) for x in (parent, reward, valid)]
  out = _forest_bpo(*flat, trunk_baseline.reshape(-1), gamma.reshape(-1))
  return tuple(x.reshape(lead + (n,)) for x in out)


@fused_bpo.def_vmap
def _fused_bpo_batched(axis_size, in_batched, *args):
  args = [x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
          for x, batched in zip(args, in_batched)]
  return fused_bpo(*args), (True, True, True, True)


def _forest_bpo(parent: Array, reward: Array, valid: Array, trunk_baseline: Array,
                gamma: Array) -> tuple[Array, Array, Array, Array]:
  """BPO on a forest of W trees stored tree by tree: parent/reward/valid [W, N],
  trunk_baseline/gamma [W]. Returns (advantages, weights, values, baselines), each [W, N] and 0
  at invalid nodes, in O(N · W) work and 2N steps.

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
    # The next row, read after the scatter (module docstring).
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


def _node_major(*xs: Array) -> tuple[Array, ...]:
  """[..., N] arrays → [N, W]: every leading index becomes one column (one tree of a forest).

  The transposed copies are made once, flat, behind an optimisation barrier (module docstring).
  """
  n = xs[0].shape[-1]
  flat = lax.optimization_barrier(tuple(x.reshape(-1, n).T.reshape(-1) for x in xs))
  return tuple(x.reshape(n, -1) for x in flat)


def _forest_columns(slot: Array) -> Array:
  """Flat indices slot · W + column into a node-major buffer of W columns, int32[N, W]."""
  width = slot.shape[1]
  return slot * width + jnp.arange(width, dtype=jnp.int32)[None, :]


def _rows(x: Array) -> Array:
  """[N, W] → flat [N · W], read row by row with `_row` (module docstring)."""
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
    # The next row, read after the scatter (module docstring).
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
  # across (module docstring).
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


@jax.custom_batching.custom_vmap
def _affine_kernel(jump: Array, a: Array, c: Array) -> Array:
  return _as_forest(_forest_affine_down, jump, a, c)


_affine_kernel.def_vmap(_batch_rule(_affine_kernel))


@jax.custom_batching.custom_vmap
def _subtree_kernel(jump: Array, rel: Array, total: Array) -> Array:
  return _as_forest(_forest_subtree_sums, jump, rel, total)


_subtree_kernel.def_vmap(_batch_rule(_subtree_kernel))
