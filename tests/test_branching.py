"""Fork rules, running thresholds and budget accounting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import branching as B
from bpo_jax.testing.tolerance import assert_close
from bpo_jax.tree import from_parents


def test_online_fork_decision():
  np.testing.assert_array_equal(
      B.online_fork_decision(np.array([0.1, 0.9, 0.9]), 0.5, np.array([0, 0, 1]), 1),
      [False, True, False])
  assert bool(B.online_fork_decision(jnp.float32(0.6), 0.5, 0, 2))
  with pytest.raises(ValueError, match="max_forks"):
    B.online_fork_decision(0.6, 0.5, 0, -1)


def test_random_fork_decision_rate_and_budget():
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  draws = jax.vmap(lambda k: B.random_fork_decision(k, 0.25, 0, 1))(keys)
  assert abs(float(draws.mean()) - 0.25) < 0.03  # ≈ 4.4 standard errors.
  assert not bool(B.random_fork_decision(keys[0], 1.0, 3, 3))
  with pytest.raises(ValueError, match="fork_prob"):
    B.random_fork_decision(keys[0], 1.5, 0, 1)


def test_top_k_fork_steps():
  np.testing.assert_array_equal(
      B.top_k_fork_steps(jnp.array([0.2, 0.9, 0.5]), jnp.array([True, True, True]), 2), [1, 2])
  np.testing.assert_array_equal(
      B.top_k_fork_steps(jnp.array([0.2, 0.9, 0.5]), jnp.array([True, False, False]), 2),
      [0, -1])
  with pytest.raises(ValueError, match="k must be"):
    B.top_k_fork_steps(jnp.zeros(3), jnp.ones(3, bool), 4)


def test_quantile_threshold_uses_earlier_batches():
  # The quantile interpolates between two sorted entries, the mix is two products and a sum:
  # ≤ 4 roundings at magnitude ≤ 10 (exact here: integers, 0.75 and 0.25).
  state = B.init_quantile_threshold(1.0)
  state = B.update_quantile_threshold(state, jnp.arange(5.0), jnp.ones(5, bool), quantile=0.5)
  assert_close(state.threshold, 2.0, steps=4, magnitude=4)
  state = B.update_quantile_threshold(state, jnp.array([10.0, 0.0]), jnp.array([True, False]),
                                      quantile=0.5, decay=0.75)
  assert_close(state.threshold, 0.75 * 2 + 0.25 * 10, steps=4, magnitude=10)
  same = B.update_quantile_threshold(state, jnp.ones(3), jnp.zeros(3, bool), quantile=0.5)
  np.testing.assert_array_equal(same.threshold, state.threshold)  # Kept as it was, no arithmetic.
  with pytest.raises(ValueError, match="quantile"):
    B.update_quantile_threshold(state, jnp.ones(3), jnp.ones(3, bool), quantile=2.0)


def test_budget_accounting():
  budget = B.ForkBudget(max_forks=1, max_env_steps=2)
  assert budget.can_fork() and budget.can_step()
  budget.record_fork()
  budget.record_step()
  budget.record_step()
  assert not budget.can_fork() and not budget.can_step()
  with pytest.raises(ValueError, match="fork budget exhausted"):
    budget.record_fork()
  with pytest.raises(ValueError, match="env-step budget exhausted"):
    budget.record_step()
  with pytest.raises(ValueError, match="max_forks"):
    B.ForkBudget(max_forks=-1)
  tree = from_parents([-1, 0, 0, 1], [0.0] * 4, valid=[True, True, True, True], capacity=6)
  assert int(B.tree_env_steps(tree)) == 4
  assert int(B.tree_num_leaves(tree)) == 2
  assert B.matched_group_size(14, 3) == 5
  assert B.matched_group_size(1) == 2
