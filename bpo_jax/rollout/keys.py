"""Per-branch PRNG keys (docs/DESIGN.md §5).

Randomness is per branch, so a task's tree does not depend on the other tasks of the call (a
batch split across processes grows the same trees as one process). The task with global index
t has the key `fold_in(key, t)`; its backbone carries that key. The action a branch with key k
takes at depth d (the d-th state on its path) is drawn with `child_key(k, d, 0)` (token s of it
with `fold_in(·, s)`, see `sampling.generate`), and sibling j = 1..K-1 of a fork there carries
the key `child_key(k, d, j)`. Keys travel between host and device as raw uint32 words.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import numpy as np


def child_key(key: jax.Array, depth: int, child: int) -> jax.Array:
  """The key of the `child`-th action tried at the state at `depth` of a branch keyed `key`:
  `fold_in(fold_in(key, depth), child)` (child 0: the branch's own action)."""
  return jax.random.fold_in(jax.random.fold_in(key, depth), child)


@functools.partial(jax.jit, static_argnums=0)
def _fold_in_rows(impl, key_data: jax.Array, values: jax.Array) -> jax.Array:
  """Row n: the raw words of `fold_in(...fold_in(key_n, values[n, 0])..., values[n, -1])`."""
  keys = jax.random.wrap_key_data(key_data, impl=impl)
  for column in range(values.shape[1]):
    keys = jax.vmap(jax.random.fold_in)(keys, values[:, column])
  return jax.random.key_data(keys)


class BranchKeys:
  """The key derivation of one rollout call, batched for the device.

  Args:
    key: the call's PRNG key, typed or as raw uint32 words.
    batch_size: rows -> the padded batch size (bounded compiles of the fold-ins).
  """

  def __init__(self, key: jax.Array, batch_size: Callable[[int], int]):
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.wrap_key_data(key)
    if key.shape:
      raise ValueError(f"rollout takes one PRNG key, got keys of shape {key.shape}")
    self.impl = jax.random.key_impl(key)
    self._root = np.asarray(jax.random.key_data(key))
    self._batch_size = batch_size

  def task_keys(self, task_ids: Sequence[int]) -> np.ndarray:
    """Raw words of `fold_in(key, t)` per task index t."""
    return np.asarray(self._fold_in([self._root] * len(task_ids), [[t] for t in task_ids]))

  def child_key_data(self, parents: Sequence[np.ndarray], depths: Sequence[int],
                     children: Sequence[int]) -> np.ndarray:
    """Raw words of `child_key(parent, depth, child)` per row (host arrays)."""
    if not parents:
      return np.zeros((0, 0), np.uint32)
    return np.asarray(self._fold_in(parents, list(zip(depths, children))))

  def action_keys(self, branches: Sequence, batch: int) -> jax.Array:
    """Typed keys [batch] for `generate`: row `branch.row`'s is `child_key(branch.key,
    branch.depth, 0)` (rows without a branch get the key of zeros' child, and emit nothing)."""
    rows = [np.zeros_like(branches[0].key)] * batch
    depths = [0] * batch
    for branch in branches:
      rows[branch.row], depths[branch.row] = branch.key, branch.depth
    data = self._fold_in(rows, [(d, 0) for d in depths])
    return jax.random.wrap_key_data(data, impl=self.impl)

  def _fold_in(self, key_data: Sequence[np.ndarray], values: Sequence[Sequence[int]]):
    """`_fold_in_rows` with the rows padded to a batch size; returns the raw words of the first
    `len(key_data)` rows as a host array (cut on the host: a device slice would compile once
    per row count)."""
    n = len(key_data)
    padded = self._batch_size(n)
    data = np.zeros((padded,) + np.shape(key_data[0]), np.uint32)
    data[:n] = np.asarray(key_data, np.uint32)
    folds = np.zeros((padded, len(values[0])), np.int32)
    folds[:n] = np.asarray(values, np.int32)
    return np.asarray(_fold_in_rows(self.impl, data, folds))[:n]
