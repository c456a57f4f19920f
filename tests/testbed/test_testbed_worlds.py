"""The testbed's worlds: exact success and the prefix's share on a world computed by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax.testbed import worlds
from bpo_jax.testing.tolerance import assert_close

# H = 2, A = 2, tasks u = 1/4 and 3/4: with w = 3/4, P(G | a) is 1, 3/4, 1/4, 0 for (e, l) =
# (1, 1), (1, 0), (0, 1), (0, 0), so G = e in the first task and G = e · l in the second.
SMALL = worlds.ChainWorld(0.75, horizon=2, num_actions=2, num_tasks=2)


def test_share_by_hand():
  # First task: Var(G) = 1/4, all of it explained by e. Second: Var(G) = 1/4 · 3/4 = 3/16,
  # E[G | e] = e/2, Var = 1/16. Share (1/4 + 1/16) / (1/4 + 3/16) = 5/7.
  assert worlds.prefix_share(SMALL) == pytest.approx(5 / 7, abs=4 * np.finfo(float).eps)


@pytest.mark.parametrize("weight, share", [(0.0, 0.0), (1.0, 1.0)])
def test_share_at_the_ends(weight, share):
  world = worlds.ChainWorld(weight, horizon=4, num_actions=3, num_tasks=5)
  for depth in (1, 2, 3):
    assert worlds.prefix_share(world, depth=depth) == pytest.approx(share, abs=1e-12)


def test_share_under_a_policy_by_hand():
  # The first action right with probability 3/4 (logits log 3, 0), the last uniform. First task:
  # G = e, Var 3/16, all explained. Second: G = e · l, P = 3/8, Var 15/64; E[G | e] = e/2,
  # Var 1/4 · 3/16 = 3/64. Share (3/16 + 3/64) / (3/16 + 15/64) = 15/27.
  logits = np.zeros((SMALL.num_states, 2))
  logits[0] = [np.log(3.0), 0.0]
  assert worlds.prefix_share(SMALL, logits) == pytest.approx(15 / 27, abs=8 * np.finfo(float).eps)


def test_expected_success_by_hand():
  # Uniform: the first task succeeds with P(e) = 1/2, the second with P(e · l) = 1/4.
  j = worlds.expected_success(jnp.zeros((SMALL.num_states, 2)), SMALL)
  assert_close(j, 3 / 8, steps=8)


def test_steps_pay_at_the_end_only():
  world = worlds.ChainWorld(0.75, horizon=3, num_actions=2, num_tasks=2)
  state = worlds.reset(jnp.int32(1))  # u = 3/4: both the first and the last action right
  rewards = []
  for action in (0, 1, 0):
    state, reward, terminal = worlds.step(world, state, jnp.int32(action))
    rewards.append((float(reward), bool(terminal)))
  assert rewards == [(0.0, False), (0.0, False), (1.0, True)]
  state = worlds.reset(jnp.int32(1))
  for action in (0, 1, 1):
    state, reward, _ = worlds.step(world, state, jnp.int32(action))
  assert float(reward) == 0.0  # p = 3/4 is not above u = 3/4


def test_rows_and_keys():
  world = worlds.ChainWorld(0.5, horizon=3, num_actions=2, num_tasks=4)
  state = worlds.reset(jnp.int32(2))
  seen = []
  for action in (0, 1, 1):
    seen.append((int(worlds.policy_row(state)), int(worlds.state_key(world, state))))
    state, _, _ = worlds.step(world, state, jnp.int32(action))
  # Rows 0, then 1 + 2(t − 1) + e with e = 1; keys task · 5 + row.
  assert seen == [(0, 10), (2, 12), (4, 14)]


def test_bad_world_is_refused():
  with pytest.raises(ValueError, match="early_weight"):
    worlds.ChainWorld(1.5)
  with pytest.raises(ValueError, match="horizon"):
    worlds.ChainWorld(0.5, horizon=1)


def test_world_is_a_pytree_of_its_weight():
  leaves, treedef = jax.tree_util.tree_flatten(SMALL)
  assert leaves == [0.75]
  assert jax.tree_util.tree_unflatten(treedef, [0.25]).horizon == 2
