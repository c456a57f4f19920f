"""Estimators against hand-computed trees, a dict-walking reference, and invariances."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import estimators as E
from bpo_jax.testing.random_trees import random_bpo_tree, random_tree, reference_bpo
from bpo_jax.tree import TreeBuilder, empty_tree, from_parents, pad_tree, stack_trees


def _np(x):
  return np.asarray(x, np.float64)


# Jitted once per configuration: eager calls would compile each pass's loop every time.
bpo_advantages = jax.jit(E.bpo_advantages, static_argnames=("gamma",))
rloo_advantages = jax.jit(E.rloo_advantages, static_argnames=("gamma",))
grpo_advantages = jax.jit(E.grpo_advantages, static_argnames=("gamma", "normalize_std", "eps"))
gigpo_advantages = jax.jit(E.gigpo_advantages,
                           static_argnames=("gamma", "normalize_std", "eps", "step_weight"))


def test_hand_computed_fork_below_trunk():
  # Trunk step 0 (reward 0), then a fork of two terminal steps with rewards 1 and 3.
  out = bpo_advantages(from_parents([-1, 0, 0], [0.0, 1.0, 3.0]))
  np.testing.assert_allclose(out.values, [2, 1, 3])
  np.testing.assert_allclose(out.baselines, [0, 3, 1])
  np.testing.assert_allclose(out.advantages, [2, -2, 2])
  np.testing.assert_allclose(out.weights, [1, 0.5, 0.5])


def test_hand_computed_discount_inheritance_and_trunk():
  # 0 (r=1) -> 1 (r=2) -> fork {2 (r=4), 3 (r=0) -> 4 (r=8)}; γ = 0.5; trunk baseline 3.
  tree = from_parents([-1, 0, 1, 1, 3], [1.0, 2.0, 4.0, 0.0, 8.0])
  out = bpo_advantages(tree, gamma=0.5, trunk_baseline=3.0)
  q3 = 0 + 0.5 * 8  # 4
  q1 = 2 + 0.5 * (4 + q3) / 2  # 4
  q0 = 1 + 0.5 * q1  # 3
  np.testing.assert_allclose(out.values, [q0, q1, 4, q3, 8])
  b0 = 3.0
  b1 = (b0 - 1.0) / 0.5  # 4
  b2, b3 = q3, 4.0
  b4 = (b3 - 0.0) / 0.5  # 8
  np.testing.assert_allclose(out.baselines, [b0, b1, b2, b3, b4])
  np.testing.assert_allclose(out.advantages, [0, 0, 0, 0, 0], atol=1e-6)
  np.testing.assert_allclose(out.weights, [1, 1, 0.5, 0.5, 0.5])
  # A chain carries its fork's advantage divided by γ per step: change the leaf reward.
  tree.reward[4] = 10.0
  out = bpo_advantages(tree, gamma=0.5, trunk_baseline=3.0)
  a3 = (0 + 0.5 * 10) - 4.0
  np.testing.assert_allclose(out.advantages[3:], [a3, a3 / 0.5], rtol=1e-6)


def test_star_tree_is_rloo_and_grpo():
  returns = np.array([1.0, 2.0, 6.0, -1.0])
  k = len(returns)
  # Each episode: two steps; the return is split over the two rewards.
  parents, rewards = [], []
  for j, g in enumerate(returns):
    parents += [-1, 2 * j]
    rewards += [0.25 * g, 0.75 * g]
  tree = from_parents(parents, rewards)
  loo = returns - (returns.sum() - returns) / (k - 1)
  rloo = _np(rloo_advantages(tree))
  np.testing.assert_allclose(rloo, np.repeat(loo, 2), rtol=1e-6, atol=1e-6)
  bpo = bpo_advantages(tree)
  np.testing.assert_allclose(_np(bpo.advantages), rloo, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(_np(bpo.weights), np.full(2 * k, 1 / k))
  std = returns.std()
  grpo = (returns - returns.mean()) / (std + 1e-6)
  np.testing.assert_allclose(_np(grpo_advantages(tree)), np.repeat(grpo, 2), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(_np(grpo_advantages(tree, normalize_std=False)),
                             np.repeat(returns - returns.mean(), 2), rtol=1e-6, atol=1e-6)
  # BPO on a star tree, rescaled by (K − 1)/K and divided by the std, is exactly GRPO.
  np.testing.assert_allclose(_np(bpo.advantages) * (k - 1) / k / (std + 1e-6),
                             np.repeat(grpo, 2), rtol=1e-5, atol=1e-6)


def test_gigpo_hand_computed():
  tree = from_parents([-1, 0, -1, 2], [0.0, 1.0, 2.0, 1.0], state_id=[7, -1, 7, -1])
  np.testing.assert_allclose(gigpo_advantages(tree, normalize_std=False), [-2, -1, 2, 1])
  # With std: episode returns 1, 3 → ±1; step group at state 7 → ±1; ω = 0.5.
  np.testing.assert_allclose(gigpo_advantages(tree, step_weight=0.5, eps=0.0),
                             [-1.5, -1, 1.5, 1], rtol=1e-6)
  # A lone state id (group of one) adds nothing.
  lone = from_parents([-1, 0, -1, 2], [0.0, 1.0, 2.0, 1.0], state_id=[7, 5, 8, -1])
  np.testing.assert_allclose(gigpo_advantages(lone, normalize_std=False), [-1, -1, 1, 1])


def test_diagnostics_hand_computed():
  tree = from_parents([-1, 0, 0, 1, 1], [0.0, 0.0, 1.0, 2.0, 4.0])
  np.testing.assert_allclose(jax.jit(E.path_weights)(tree), [1, 0.5, 0.5, 0.25, 0.25])
  np.testing.assert_allclose(jax.jit(E.effective_num_samples)(tree), 8 / 3, rtol=1e-6)
  # Path returns 1, 2, 4 (weights .5, .25, .25): var 1.5; last-fork means 2, 3, 3: var 0.5.
  np.testing.assert_allclose(jax.jit(E.prefix_explained_variance)(tree), 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(E.children_counts)(tree), [2, 2, 0, 0, 0, 1])
  np.testing.assert_allclose(E.leave_one_out_trunk_baselines(jnp.array([1.0, 2.0, 6.0])),
                             [4, 3.5, 1.5])
  with pytest.raises(ValueError, match="at least 2 trees"):
    E.leave_one_out_trunk_baselines(jnp.array([1.0]))
  with pytest.raises(ValueError, match="gamma must be in"):
    E.bpo_advantages(tree, gamma=0.0)


@pytest.mark.parametrize("gamma,trunk", [(1.0, 0.0), (0.9, 0.7)])
def test_matches_dict_walking_reference(gamma, trunk):
  rng = np.random.default_rng(1)
  trees = ([random_tree(rng, 40, 48, fail_prob=0.05) for _ in range(4)]
           + [random_tree(rng, 30, 48, root_children=3) for _ in range(2)]
           + [random_bpo_tree(rng, 48, max_depth=10) for _ in range(2)])
  batch = stack_trees(trees)
  out = jax.jit(jax.vmap(lambda t: E.bpo_advantages(t, gamma=gamma, trunk_baseline=trunk)))(
      batch)
  for b, tree in enumerate(trees):
    adv, w, q, base = reference_bpo(tree, gamma, trunk)
    np.testing.assert_allclose(out.values[b], q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.weights[b], w, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(out.baselines[b], base, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.advantages[b], adv, rtol=1e-4, atol=1e-4)


def _all(tree):
  return (E.bpo_advantages(tree, gamma=0.95, trunk_baseline=0.2), E.rloo_advantages(tree),
          E.grpo_advantages(tree), E.gigpo_advantages(tree),
          E.effective_num_samples(tree), E.prefix_explained_variance(tree, 0.95))


_all_jit = jax.jit(_all)


def test_jit_vmap_loop_and_padding_agree():
  rng = np.random.default_rng(2)
  trees = [random_tree(rng, 20, 24, root_children=2, num_states=4, fail_prob=0.05)
           for _ in range(3)]
  batched = jax.jit(jax.vmap(_all))(stack_trees(trees))
  padded = jax.jit(jax.vmap(_all))(stack_trees([pad_tree(t, 40) for t in trees]))
  eager = _all(trees[0])  # No jit, op by op: slow, so once.
  for e, j in zip(*map(jax.tree_util.tree_leaves, (eager, _all_jit(trees[0])))):
    np.testing.assert_allclose(j, e, rtol=1e-5, atol=1e-6)
  for b, tree in enumerate(trees):
    looped = _all_jit(tree)
    for e, v, p in zip(*map(jax.tree_util.tree_leaves, (looped, batched, padded))):
      v, p = np.asarray(v)[b], np.asarray(p)[b]
      np.testing.assert_allclose(v, e, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(p[..., :24] if p.ndim else p, e, rtol=1e-5, atol=1e-6)
      if p.ndim:
        np.testing.assert_array_equal(p[24:], 0.0)


def test_failed_branch_is_the_same_as_no_branch():
  def build(with_failed):
    b = TreeBuilder(8)
    r = b.add(-1)
    x = b.add(r)
    if with_failed:
      bad = b.add(r)
      b.add(bad)
    y = b.add(r)
    for i, rew in [(r, 0.5), (x, 1.0), (y, 3.0)]:
      b.set_outcome(i, rew, terminal=i != r)
    if with_failed:
      b.set_outcome(bad, 100.0)
      b.mark_failed(bad)
    return b.build()
  full, clean = _all_jit(build(True)), _all_jit(build(False))
  keep = [0, 1, 4]
  for f, c in zip(jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(clean)):
    f, c = np.asarray(f), np.asarray(c)
    if f.ndim:
      np.testing.assert_allclose(f[keep], c[:3], rtol=1e-6)
      np.testing.assert_array_equal(f[[2, 3]], 0.0)
    else:
      np.testing.assert_allclose(f, c, rtol=1e-6)


def test_estimators_import_no_heavy_packages():
  code = ("import sys, bpo_jax.estimators, bpo_jax.tree, bpo_jax.branching, bpo_jax.losses, "
          "bpo_jax; bad = [m for m in ('flax', 'transformers', 'orbax', 'torch', 'gymnasium', "
          "'textworld', 'jericho', 'alfworld', 'swebench', 'optax') if m in sys.modules]; "
          "print(bad); sys.exit(1 if bad else 0)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr


def test_nested_vmap_and_unbatched_tree():
  # The batched kernels treat a batch as one forest: a [2, 3] batch and a batched trunk baseline
  # over one (unbatched) tree must match tree-by-tree results.
  rng = np.random.default_rng(3)
  trees = [random_tree(rng, 20, 24, root_children=2, fail_prob=0.1) for _ in range(6)]
  grid = jax.tree_util.tree_map(lambda x: x.reshape((2, 3) + x.shape[1:]), stack_trees(trees))
  single = jax.jit(lambda t, trunk: E.bpo_advantages(t, gamma=0.9, trunk_baseline=trunk))
  nested = jax.jit(jax.vmap(jax.vmap(lambda t: E.bpo_advantages(t, gamma=0.9))))(grid)
  for k, tree in enumerate(trees):
    for x, y in zip(nested, single(tree, 0.0)):
      np.testing.assert_allclose(np.asarray(x).reshape(6, -1)[k], y, rtol=1e-5, atol=1e-6)
  trunks = jnp.array([0.0, 1.0, -2.0])
  over_trunks = jax.jit(jax.vmap(lambda b: E.bpo_advantages(trees[0], gamma=0.9,
                                                            trunk_baseline=b)))(trunks)
  for k in range(3):
    np.testing.assert_allclose(over_trunks.advantages[k],
                               single(trees[0], trunks[k]).advantages, rtol=1e-5, atol=1e-6)


def test_deep_chain_carries_the_trunk_advantage():
  # One path of 2048 steps, reward 1 each, γ = 1, zero trunk baseline: Q̂(i) = N − i and the
  # inherited baseline drops by the parent's reward per step, b_i = −i, so every A_i = N.
  n = 2048
  chain = empty_tree(n)  # Built directly: `validate` walks every path, slow for a deep chain.
  chain.parent[:] = np.arange(-1, n - 1)
  chain.reward[:] = 1.0
  chain.valid[:] = True
  chain.terminal[-1] = True
  chain.depth[:] = np.arange(n)
  out = bpo_advantages(chain)
  np.testing.assert_array_equal(out.values, np.arange(n, 0, -1))
  np.testing.assert_array_equal(out.baselines, -np.arange(n))
  np.testing.assert_array_equal(out.advantages, np.full(n, n))
  np.testing.assert_array_equal(out.weights, np.ones(n))


def test_wide_star_is_leave_one_out():
  # A trunk step, then 1000 terminal siblings below it (and, as a second tree, 1000 steps at the
  # root state): leave-one-out baselines and weights 1/K against NumPy in float64.
  k = 1000
  rewards = np.random.default_rng(4).normal(size=k)
  below_trunk = from_parents([-1] + [0] * k, [0.5] + list(rewards))
  at_root = from_parents([-1] * k, list(rewards))
  out = jax.jit(jax.vmap(lambda t: E.bpo_advantages(t, gamma=0.9, trunk_baseline=0.25)))(
      stack_trees([below_trunk, pad_tree(at_root, k + 1)]))
  loo = (rewards.sum() - rewards) / (k - 1)
  for b, first in ((0, 1), (1, 0)):
    np.testing.assert_allclose(out.baselines[b, first:first + k], loo, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.advantages[b, first:first + k], rewards - loo, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(out.weights[b, first:first + k], np.full(k, 1 / k), rtol=1e-6)
  # The trunk step: Q̂ = 0.5 + 0.9 · mean(r), baseline the trunk's 0.25, weight 1.
  np.testing.assert_allclose(out.values[0, 0], 0.5 + 0.9 * rewards.mean(), rtol=1e-5)
  np.testing.assert_allclose(out.advantages[0, 0], 0.25 + 0.9 * rewards.mean(), rtol=1e-5)
  np.testing.assert_array_equal(out.weights[0, 0], 1.0)
  np.testing.assert_array_equal(out.weights[1, k], 0.0)  # The padding slot.


def test_large_random_trees_match_dict_walking_reference():
  rng = np.random.default_rng(5)
  n = 2048
  trees = ([random_bpo_tree(rng, n) for _ in range(3)]
           + [random_tree(rng, n - 48, n, window=64, root_children=4, fail_prob=0.002)])
  out = jax.jit(jax.vmap(lambda t: E.bpo_advantages(t, gamma=0.97, trunk_baseline=-0.3)))(
      stack_trees(trees))
  for b, tree in enumerate(trees):
    adv, w, q, base = reference_bpo(tree, 0.97, -0.3)
    np.testing.assert_allclose(out.values[b], q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.weights[b], w, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(out.baselines[b], base, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.advantages[b], adv, rtol=1e-4, atol=1e-4)
