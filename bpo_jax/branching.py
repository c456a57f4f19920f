"""When to fork: the online entropy rule with a budget, random forking, and after-the-fact top-k.

The BPO estimator is unbiased only if the decision to fork at state s_t depends on what is known
at s_t: the entropy there, the budget used so far, and statistics of earlier batches (a stopping-
time rule). `online_fork_decision` and `random_fork_decision` are such rules. `top_k_fork_steps`
picks the k highest-entropy steps after the backbone has finished; the backbone's own actions
then decide where forks go, which biases the estimator (tests/test_theorem.py measures the bias).
It is kept for comparison only.

Budget accounting (`ForkBudget`, `tree_env_steps`, `tree_num_leaves`, `matched_group_size`) lets
BPO and the independent-trajectory baselines run at matched compute: equal leaves (episodes
finished) or equal environment steps.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax.tree import RolloutTree

Array = chex.Array


def online_fork_decision(entropy: Array, threshold: Array | float, forks_used: Array | int,
                         max_forks: Array | int) -> Array:
  """Fork at s_t iff entropy(s_t) > threshold and forks_used < max_forks.

  Works on scalars or arrays (NumPy or jnp), elementwise.
  Example: entropy [0.1, 0.9], threshold 0.5, forks_used 0, max_forks 1 → [False, True].
  """
  if isinstance(max_forks, (int, np.integer)) and max_forks < 0:
    raise ValueError(f"max_forks must be >= 0, got {max_forks}")
  return (entropy > threshold) & (forks_used < max_forks)


def random_fork_decision(key: Array, fork_prob: float, forks_used: Array | int,
                         max_forks: Array | int) -> Array:
  """Fork with probability `fork_prob` while budget remains (independent of the future)."""
  if not 0.0 <= fork_prob <= 1.0:
    raise ValueError(f"fork_prob must be in [0, 1], got {fork_prob}")
  return jax.random.bernoulli(key, fork_prob) & (jnp.asarray(forks_used) < max_forks)


def top_k_fork_steps(entropy: Array, valid: Array, k: int) -> Array:
  """int32[k]: indices of the k highest-entropy valid steps of a finished backbone (ties: the
  earlier step). BIASED: the choice depends on the backbone's later states, hence on its actions.
  Fewer than k valid steps give −1 entries.

  Example: entropy [0.2, 0.9, 0.5], all valid, k = 2 → [1, 2].
  """
  chex.assert_rank([entropy, valid], 1)
  chex.assert_equal_shape([entropy, valid])
  if k < 1 or k > entropy.shape[0]:
    raise ValueError(f"k must be in [1, {entropy.shape[0]}], got {k}")
  masked = jnp.where(valid, entropy, -jnp.inf)
  _, idx = jax.lax.top_k(masked, k)
  return jnp.where(valid[idx], idx, -1).astype(jnp.int32)


class QuantileThreshold(NamedTuple):
  """Running entropy threshold from earlier batches: an EMA of each batch's entropy quantile."""
  threshold: Array
  num_updates: Array


def init_quantile_threshold(initial: float) -> QuantileThreshold:
  return QuantileThreshold(jnp.asarray(initial, jnp.float32), jnp.asarray(0, jnp.int32))


def update_quantile_threshold(state: QuantileThreshold, entropy: Array, mask: Array, *,
                              quantile: float, decay: float = 0.9) -> QuantileThreshold:
  """The threshold for the NEXT batch: decay · old + (1 − decay) · quantile of this batch's
  entropies (the first update takes the quantile as is). Using it only for later batches keeps
  the fork rule a stopping time within a batch.

  Example: entropies [0, 1, 2, 3, 4], quantile 0.5, first update → threshold 2.
  """
  if not 0.0 <= quantile <= 1.0:
    raise ValueError(f"quantile must be in [0, 1], got {quantile}")
  if not 0.0 <= decay < 1.0:
    raise ValueError(f"decay must be in [0, 1), got {decay}")
  chex.assert_equal_shape([entropy, mask])
  values = jnp.where(mask, entropy, jnp.nan).reshape(-1)
  batch_q = jnp.nanquantile(values, quantile)
  have = jnp.any(mask)
  mixed = jnp.where(state.num_updates > 0, decay * state.threshold + (1 - decay) * batch_q,
                    batch_q)
  return QuantileThreshold(jnp.where(have, mixed, state.threshold).astype(jnp.float32),
                           state.num_updates + have.astype(jnp.int32))


@dataclasses.dataclass
class ForkBudget:
  """Host-side counters for one tree: forks and environment steps used against their limits."""
  max_forks: int
  max_env_steps: int | None = None
  forks_used: int = 0
  env_steps_used: int = 0

  def __post_init__(self):
    if self.max_forks < 0:
      raise ValueError(f"max_forks must be >= 0, got {self.max_forks}")
    if self.max_env_steps is not None and self.max_env_steps <= 0:
      raise ValueError(f"max_env_steps must be positive, got {self.max_env_steps}")

  def can_fork(self) -> bool:
    return self.forks_used < self.max_forks

  def can_step(self) -> bool:
    return self.max_env_steps is None or self.env_steps_used < self.max_env_steps

  def record_fork(self) -> None:
    if not self.can_fork():
      raise ValueError(f"fork budget exhausted ({self.max_forks} forks)")
    self.forks_used += 1

  def record_step(self) -> None:
    if not self.can_step():
      raise ValueError(f"env-step budget exhausted ({self.max_env_steps} steps)")
    self.env_steps_used += 1


def tree_env_steps(tree: RolloutTree) -> Array:
  """Environment steps a tree cost: its valid nodes (each node is one sandbox step)."""
  return jnp.sum(tree.valid.astype(jnp.int32), axis=-1)


def tree_num_leaves(tree: RolloutTree) -> Array:
  """Finished paths of a tree: valid nodes without valid children."""
  from bpo_jax.estimators import leaf_mask  # Local: estimators imports nothing from here.
  return jnp.sum(leaf_mask(tree).astype(jnp.int32))


def matched_group_size(total: float, per_trajectory: float = 1.0) -> int:
  """Independent trajectories that cost the same as a BPO budget, rounded to the nearest ≥ 2.

  For equal leaves pass the BPO leaves (per_trajectory = 1); for equal env steps pass the BPO env
  steps and the mean episode length. Example: 14 env steps at 3 steps per episode → 5.
  """
  if per_trajectory <= 0:
    raise ValueError(f"per_trajectory must be positive, got {per_trajectory}")
  return max(2, int(round(total / per_trajectory)))
