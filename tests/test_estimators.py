"""Estimators against hand-computed trees, the readable reference, a float64 dict-walking
reference, and invariances.

Tolerances count float32 roundings at the magnitude compared (bpo_jax.testing.tolerance); most
hand-computed trees have dyadic rewards, so their sums are exact and only divisions round.
"""

import functools
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import estimators as E
from bpo_jax import fork_variance as FV
from bpo_jax.testing.random_trees import bpo_roundings, random_bpo_tree, random_tree, reference_bpo
from bpo_jax.testing.tolerance import assert_close, ulp_tol
from bpo_jax.tree import TreeBuilder, empty_tree, from_parents, pad_tree, stack_trees


def _np(x):
  return np.asarray(x, np.float64)


# Jitted once per configuration: eager calls would compile each pass's loop every time.
bpo_advantages = jax.jit(E.bpo_advantages, static_argnames=("gamma",))
rloo_advantages = jax.jit(E.rloo_advantages, static_argnames=("gamma",))
grpo_advantages = jax.jit(E.grpo_advantages,
                          static_argnames=("gamma", "normalize_std", "ddof", "eps"))
gigpo_advantages = jax.jit(E.gigpo_advantages,
                           static_argnames=("gamma", "normalize_std", "ddof", "eps", "step_weight",
                                            "step_gamma"))


def test_hand_computed_fork_below_trunk():
  # Trunk step 0 (reward 0), then a fork of two terminal steps with rewards 1 and 3.
  out = bpo_advantages(from_parents([-1, 0, 0], [0.0, 1.0, 3.0]))
  # At most 5 roundings per output at magnitude ≤ 4 (exact here: integers and halves).
  for x, expected in zip(out, ([2, -2, 2], [1, 0.5, 0.5], [2, 1, 3], [0, 3, 1])):
    assert_close(x, expected, steps=5, magnitude=4)


def test_hand_computed_discount_inheritance_and_trunk():
  # 0 (r=1) -> 1 (r=2) -> fork {2 (r=4), 3 (r=0) -> 4 (r=8)}; γ = 0.5; trunk baseline 3.
  tree = from_parents([-1, 0, 1, 1, 3], [1.0, 2.0, 4.0, 0.0, 8.0])
  out = bpo_advantages(tree, gamma=0.5, trunk_baseline=3.0)
  q3 = 0 + 0.5 * 8  # 4
  q1 = 2 + 0.5 * (4 + q3) / 2  # 4
  q0 = 1 + 0.5 * q1  # 3
  b0 = 3.0
  b1 = (b0 - 1.0) / 0.5  # 4
  b2, b3 = q3, 4.0
  b4 = (b3 - 0.0) / 0.5  # 8
  # The roundings bpo_roundings counts down this tree, at magnitude ≤ 8 (the values, baselines
  # and rewards); every number here is dyadic and γ = 1/2, so all are in fact exact.
  steps = bpo_roundings(tree, 0.5)
  assert_close(out.values, [q0, q1, 4, q3, 8], steps=steps, magnitude=8)
  assert_close(out.baselines, [b0, b1, b2, b3, b4], steps=steps, magnitude=8)
  assert_close(out.advantages, [0, 0, 0, 0, 0], steps=steps, magnitude=8)
  assert_close(out.weights, [1, 1, 0.5, 0.5, 0.5], steps=3, magnitude=1)  # ≤ 3 divisions.
  # A chain carries its fork's advantage divided by γ per step: change the leaf reward.
  tree.reward[4] = 10.0
  out = bpo_advantages(tree, gamma=0.5, trunk_baseline=3.0)
  a3 = (0 + 0.5 * 10) - 4.0
  assert_close(out.advantages[3:], [a3, a3 / 0.5], steps=bpo_roundings(tree, 0.5), magnitude=10)


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
  # The rewards are dyadic, so the returns and their sums are exact; a leave-one-out mean then
  # rounds once (the division) and the advantage once more, at magnitude ≤ 8 (the sum); BPO's
  # kernel as often as bpo_roundings counts.
  rloo = _np(rloo_advantages(tree))
  assert_close(rloo, np.repeat(loo, 2), steps=2, magnitude=8, dtype=np.float32)
  bpo = bpo_advantages(tree)
  steps = bpo_roundings(tree)
  assert_close(bpo.advantages, rloo, steps=steps, magnitude=8)
  assert_close(bpo.weights, np.full(2 * k, 1 / k), steps=1, magnitude=1)
  std = returns.std()
  grpo = (returns - returns.mean()) / (std + 1e-6)
  # GRPO: the centred returns and their variance are exact; eps to float32, the square root,
  # + eps and the division round 4 times, each relative to the result, at most max |A|.
  assert_close(grpo_advantages(tree), np.repeat(grpo, 2), steps=4)
  assert_close(grpo_advantages(tree, normalize_std=False),
               np.repeat(returns - returns.mean(), 2), steps=1)
  # BPO on a star tree, rescaled by (K − 1)/K and divided by the std, is exactly GRPO: BPO's
  # roundings, scaled with its advantages.
  scale = (k - 1) / k / (std + 1e-6)
  assert_close(_np(bpo.advantages) * scale, np.repeat(grpo, 2), steps=steps, magnitude=8 * scale,
               dtype=np.float32)


def test_gigpo_hand_computed():
  # Integer rewards: means, deviations and the stds (√1) are exact; at most 8 roundings (two
  # group statistics, the divisions, ω, the sum) at magnitude ≤ 2 bound the rest.
  tree = from_parents([-1, 0, -1, 2], [0.0, 1.0, 2.0, 1.0], state_id=[7, -1, 7, -1])
  assert_close(gigpo_advantages(tree, normalize_std=False), [-2, -1, 2, 1], steps=8)
  # With std: episode returns 1, 3 → ±1; step group at state 7 → ±1; ω = 0.5.
  assert_close(gigpo_advantages(tree, step_weight=0.5, eps=0.0), [-1.5, -1, 1.5, 1], steps=8)
  # A lone state id (group of one) adds nothing.
  lone = from_parents([-1, 0, -1, 2], [0.0, 1.0, 2.0, 1.0], state_id=[7, 5, 8, -1])
  assert_close(gigpo_advantages(lone, normalize_std=False), [-1, -1, 1, 1], steps=8)


def _episodes_tree(episodes):
  """A star tree of chains: `episodes` lists (reward, state_id) steps per episode."""
  parents, rewards, state_ids = [], [], []
  for steps in episodes:
    for t, (reward, state_id) in enumerate(steps):
      parents.append(-1 if t == 0 else len(parents) - 1)
      rewards.append(reward)
      state_ids.append(state_id)
  return from_parents(parents, rewards, state_id=state_ids)


def _returns_np(rewards, gamma):
  """Discounted return from each step of one chain, in float64."""
  out, g = [], 0.0
  for r in reversed(rewards):
    g = r + gamma * g
    out.append(g)
  return out[::-1]


def _normalised_np(x, ddof, eps, normalize):
  x = np.asarray(x, np.float64)
  centred = x - x.mean()
  return centred / (x.std(ddof=ddof) + eps) if normalize else centred


def _gigpo_np(episodes, *, gamma=1.0, step_gamma=1.0, step_weight=1.0, ddof=0, eps=1e-6,
              normalize=True):
  """GiGPO's formula (module docstring of estimators) over chains, node by node, in float64."""
  returns = [_returns_np([r for r, _ in steps], gamma)[0] for steps in episodes]
  episode = _normalised_np(returns, ddof, eps, normalize)
  nodes = [(j, r, s) for j, steps in enumerate(episodes)
           for r, s in zip(_returns_np([r for r, _ in steps], step_gamma), [s for _, s in steps])]
  step = np.zeros(len(nodes))
  for state in {s for _, _, s in nodes if s >= 0}:
    members = [i for i, (_, _, s) in enumerate(nodes) if s == state]
    if len(members) >= 2:
      step[members] = _normalised_np([nodes[i][1] for i in members], ddof, eps, normalize)
  return np.array([episode[j] for j, _, _ in nodes]) + step_weight * step


@pytest.mark.slow
@pytest.mark.parametrize("g", [0.9, 0.0, 1.0])
def test_equal_returns_give_exactly_zero_advantages(g):
  # float32 rounds the mean of three 0.9s off 0.9 by 6e-8, which a std normalisation with
  # eps = 1e-6 once made +0.056 (GRPO) and +0.11 (GiGPO): now every advantage is exactly 0.
  equal = _episodes_tree([[(0.0, 7), (g, 5)]] * 3)
  for ddof, eps in ((0, 1e-6), (1, 1e-4), (1, 0.0)):
    np.testing.assert_array_equal(grpo_advantages(equal, ddof=ddof, eps=eps), 0.0)
    np.testing.assert_array_equal(gigpo_advantages(equal, ddof=ddof, eps=eps), 0.0)
    np.testing.assert_array_equal(gigpo_advantages(equal, ddof=ddof, eps=eps, step_gamma=0.95),
                                  0.0)
  np.testing.assert_array_equal(rloo_advantages(equal), 0.0)
  # The step-level part alone: the episodes differ (first rewards 0, 0.5, 1.5), but their
  # second steps, all at state 5, return g each: there GiGPO adds exactly nothing to GRPO
  # (and at the first steps, whose returns differ, it does add).
  mixed = _episodes_tree([[(0.0, 7), (g, 5)], [(0.5, 7), (g, 5)], [(1.5, 7), (g, 5)]])
  for ddof, eps in ((0, 1e-6), (1, 1e-4)):
    gigpo = _np(gigpo_advantages(mixed, ddof=ddof, eps=eps))
    grpo = _np(grpo_advantages(mixed, ddof=ddof, eps=eps))
    np.testing.assert_array_equal(gigpo[1::2], grpo[1::2])
    assert np.all(gigpo[::2] != grpo[::2])


def test_grpo_std_ddof_and_eps_against_numpy():
  # Dyadic returns 1, 2, 6, -1: the centred returns (−1, 0, 4, −3) and Σ² = 26 are exact; the
  # variance's division, the square root, eps to float32, + eps and the division round 5 times,
  # each relative to the result.
  tree = _episodes_tree([[(1.0, -1)], [(2.0, -1)], [(6.0, -1)], [(-1.0, -1)]])
  returns = np.array([1.0, 2.0, 6.0, -1.0])
  for ddof, eps in ((0, 1e-6), (1, 1e-6), (1, 1e-4), (0, 0.5)):  # (1, 1e-4): TRL's
    expected = (returns - 2.0) / (returns.std(ddof=ddof) + eps)
    assert_close(grpo_advantages(tree, ddof=ddof, eps=eps), expected, steps=5)
  # ddof 1 against 0 on the same returns: the std grows by √(4/3).
  assert abs(float(np.std(returns, ddof=1) / np.std(returns)) - np.sqrt(4 / 3)) < 1e-12


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(step_weight=0.5, step_gamma=0.95),
    dict(ddof=1, eps=1e-4, step_gamma=0.95),
    dict(ddof=1, eps=1e-6, step_weight=2.0, step_gamma=0.5, normalize=False),
])
def test_gigpo_switches_against_numpy(kwargs):
  # Three episodes of two steps: first steps at state 7, second steps at states 5, 5 and 9 (a
  # group of two and a lone state). Rewards ≤ 3, returns ≤ 4, group stds ≥ 0.8: each return
  # rounds ≤ 3 times (γ to float32, product, sum), the group statistics ≤ 6 more, the division,
  # ω · A^S and the sum 3: 12 roundings at the returns' scale over the std (≤ 4 / 0.8 = 5).
  episodes = [[(0.0, 7), (1.0, 5)], [(1.0, 7), (3.0, 5)], [(2.0, 7), (2.0, 9)]]
  tree = _episodes_tree(episodes)
  expected = _gigpo_np(episodes, **kwargs)
  options = dict(kwargs)
  options["normalize_std"] = options.pop("normalize", True)
  assert_close(gigpo_advantages(tree, **options), expected, steps=12,
               magnitude=5 * max(1.0, options.get("step_weight", 1.0)))
  # The reference's own numbers, by hand for the default case: returns 1, 4, 4 (mean 3, std √2);
  # state 7: returns 1, 4, 4 again; state 5: returns 1, 3 (std 1); state 9 alone.
  if not kwargs:
    a = np.array([-2, 1, 1]) / (np.sqrt(2) + 1e-6)
    np.testing.assert_allclose(expected, [2 * a[0], a[0] - 1 / (1 + 1e-6),
                                          2 * a[1], a[1] + 1 / (1 + 1e-6), 2 * a[2], a[2]],
                               rtol=1e-12)


@pytest.mark.slow
def test_diagnostics_hand_computed():
  # Dyadic weights and rewards: the sums are exact, the last division rounds once (2 steps
  # allow for the reciprocal of a reciprocal).
  tree = from_parents([-1, 0, 0, 1, 1], [0.0, 0.0, 1.0, 2.0, 4.0])
  assert_close(jax.jit(E.path_weights)(tree), [1, 0.5, 0.5, 0.25, 0.25], steps=2)
  assert_close(jax.jit(E.effective_num_samples)(tree), 8 / 3, steps=2)
  # Path returns 1, 2, 4 (weights .5, .25, .25): var 1.5; last-fork means 2, 3, 3: var 0.5.
  assert_close(jax.jit(E.prefix_explained_variance)(tree), 1 / 3, steps=2)
  # Mean 2, mean square 5.5; the first fork's siblings (nodes 1, 2) have X = 3, 1 and S = 10,
  # 1 (centred on the mean: X = 1, −1 and S = 2, 1), so within = 5.5 − 3 = 2.5.
  moments = jax.jit(FV.fork_moments)(tree)
  assert_close(moments.mean, 2.0, steps=2)
  assert_close(moments.mean_square, 5.5, steps=2)
  assert_close(moments.within, 2.5, steps=4, magnitude=5.5)
  assert float(moments.reach) == 1.0
  # Level 2: nodes 3 and 4 (W = 1/2), returns 2 and 4, sample variance 2 → within 1; the path
  # through node 2 has no second fork. No level 3.
  level = lambda k: jax.jit(functools.partial(FV.fork_moments, level=k))(tree)
  assert_close(level(2).within, 1.0, steps=4, magnitude=5.5)
  assert float(level(2).reach) == 0.5  # dyadic: exact
  assert float(level(3).within) == float(level(3).reach) == 0.0
  for bad in (0, 1.5):
    with pytest.raises(ValueError, match=f"level = {bad}: must be a Python int >= 1"):
      FV.fork_moments(tree, level=bad)
  # A group of K episodes forks at the root: within is their unbiased sample variance, so a
  # group reads Var(G | s_0) = Var(G), nothing explained.
  group = from_parents([-1, -1, -1, 0, 1, 2], [0.0, 0.0, 0.0, 1.0, 2.0, 6.0])
  assert_close(jax.jit(FV.fork_moments)(group).within, np.var([1.0, 2.0, 6.0], ddof=1),
               steps=4, magnitude=41 / 3)
  # No fork: the return is known at the end (within 0).
  assert float(jax.jit(FV.fork_moments)(from_parents([-1, 0], [1.0, 2.0])).within) == 0.0
  np.testing.assert_array_equal(jax.jit(E.children_counts)(tree), [2, 2, 0, 0, 0, 1])
  assert_close(E.leave_one_out_trunk_baselines(jnp.array([1.0, 2.0, 6.0])), [4, 3.5, 1.5],
               steps=2)  # An exact sum and difference, one division.
  with pytest.raises(ValueError, match="at least 2 trees"):
    E.leave_one_out_trunk_baselines(jnp.array([1.0]))
  with pytest.raises(ValueError, match="gamma must be in"):
    E.bpo_advantages(tree, gamma=0.0)


def _assert_bpo_close(out, expected, tree, gamma):
  """Two BPO results on one tree agree within the float32 roundings of BPO on it."""
  steps = bpo_roundings(tree, gamma)
  magnitude = max(np.abs(np.asarray(x)).max() for x in (expected[2], expected[3], tree.reward))
  for name in ("advantages", "values", "baselines"):
    assert_close(getattr(out, name), getattr(expected, name), steps=steps, magnitude=magnitude,
                 dtype=np.float32, err_msg=name)
  # A weight is a product of as many divisions as the node is deep: relative rounding.
  depth = int(np.max(np.where(tree.valid, tree.depth, 0))) + 1
  np.testing.assert_allclose(out.weights, expected.weights, atol=0,
                             rtol=ulp_tol(np.float32, 1.0, depth))


def _random_trees(rng, capacity):
  return ([random_tree(rng, capacity - 8, capacity, fail_prob=0.05) for _ in range(4)]
          + [random_tree(rng, capacity - 16, capacity, root_children=3) for _ in range(2)]
          + [random_bpo_tree(rng, capacity, max_depth=10) for _ in range(2)])


@pytest.mark.parametrize("gamma,trunk", [(1.0, 0.0), (0.9, 0.7)])
def test_kernel_matches_readable_reference(gamma, trunk):
  # Forks, chains, failed branches, several steps at the root state, and 8 small and 8 larger
  # trees: the fused kernel and the formulas as written give the same numbers.
  rng = np.random.default_rng(10)
  for capacity in (48, 256):
    trees = _random_trees(rng, capacity)
    batch = stack_trees(trees)
    kernel, reference = (
        jax.jit(jax.vmap(lambda t, f=f: f(t, gamma=gamma, trunk_baseline=trunk)))(batch)
        for f in (E.bpo_advantages, E.bpo_advantages_reference))
    for b, tree in enumerate(trees):
      _assert_bpo_close(E.BPOOutput(*(x[b] for x in kernel)),
                        E.BPOOutput(*(x[b] for x in reference)), tree, gamma)


@pytest.mark.parametrize("gamma,trunk", [(1.0, 0.0), (0.9, 0.7)])
def test_matches_dict_walking_reference(gamma, trunk):
  rng = np.random.default_rng(1)
  trees = _random_trees(rng, 48)
  batch = stack_trees(trees)
  for estimator in (E.bpo_advantages, E.bpo_advantages_reference):
    out = jax.jit(jax.vmap(lambda t: estimator(t, gamma=gamma, trunk_baseline=trunk)))(batch)
    for b, tree in enumerate(trees):
      _assert_bpo_close(E.BPOOutput(*(x[b] for x in out)),
                        E.BPOOutput(*reference_bpo(tree, gamma, trunk)), tree, gamma)


def _all(tree):
  return (E.bpo_advantages(tree, gamma=0.95, trunk_baseline=0.2), E.rloo_advantages(tree),
          E.grpo_advantages(tree), E.gigpo_advantages(tree),
          E.effective_num_samples(tree), E.prefix_explained_variance(tree, 0.95))


_all_jit = jax.jit(_all)


def _all_tolerances(tree, out):
  """Per leaf of `_all(tree)`, the absolute tolerance between two compilations of it.

  They run the same float32 operations but for the order of some sums, so each leaf is within
  its roundings of the exact value on both sides: BPO's (`bpo_roundings`, + 4 for the group
  statistics) at the tree's magnitude M; for GRPO and GiGPO, which divide by a std σ, the same
  times (1 + max |A|) / σ for the smallest σ (for GiGPO: twice, episode and step terms); for the
  effective sample size 1 / Σ w² (positive terms) 2 · depth + leaves + 2 roundings relative;
  for the explained share Var(m) / Var(G) over path returns G, an error ≤ steps · M in G and m
  moves each weighted variance by 2 · max |G − mean G| · steps · M, + leaves + 3 roundings of it.
  """
  valid, parent = np.asarray(tree.valid), np.asarray(tree.parent)
  bpo = out[0]
  returns = reference_bpo(tree)[2]  # Q̂ at γ = 1, RLOO's, GRPO's and GiGPO's.
  magnitude = max(np.abs(np.asarray(x)).max() for x in (bpo.values, bpo.baselines, tree.reward,
                                                        returns))
  steps = bpo_roundings(tree, 0.95) + 4
  plain = ulp_tol(np.float32, magnitude, steps)
  groups = [returns[valid & (parent < 0)]]
  groups += [returns[valid & (tree.state_id == s)] for s in np.unique(tree.state_id[valid])
             if s >= 0]
  # No group of two: the centred values are exactly 0 and nothing is divided.
  sigma = min((g.std() for g in groups if g.size >= 2), default=np.inf)
  grpo, gigpo = (plain * max(1.0, (1 + np.abs(np.asarray(a)).max()) / sigma) for a in out[2:4])
  # Path returns G (γ = 0.95, from the root) of the leaves, and their weights.
  path_return = np.zeros(tree.capacity)
  for i in np.flatnonzero(valid):
    above = path_return[parent[i]] if parent[i] >= 0 else 0.0
    path_return[i] = above + 0.95 ** tree.depth[i] * tree.reward[i]
  leaves = valid & ~np.isin(np.arange(tree.capacity), parent[valid])
  w = np.asarray(bpo.weights, np.float64)[leaves]
  g = path_return[leaves]
  var_g = w @ (g - w @ g) ** 2
  share = ulp_tol(np.float32, 1.0,
                  2 * np.abs(g - w @ g).max() * magnitude * steps / var_g + leaves.sum() + 3)
  ess = ulp_tol(np.float32, float(out[4]), 2 * tree.depth[valid].max() + leaves.sum() + 2)
  # Leaves: BPO's advantages, weights, values, baselines; RLOO; GRPO; GiGPO; the two scalars.
  return [plain] * 5 + [grpo, 2 * gigpo, ess, share]


@pytest.mark.slow
def test_jit_vmap_loop_and_padding_agree():
  rng = np.random.default_rng(2)
  trees = [random_tree(rng, 20, 24, root_children=2, num_states=4, fail_prob=0.05)
           for _ in range(3)]
  batched = jax.jit(jax.vmap(_all))(stack_trees(trees))
  padded = jax.jit(jax.vmap(_all))(stack_trees([pad_tree(t, 40) for t in trees]))
  eager = _all(trees[0])  # No jit, op by op: slow, so once.
  for e, j, tol in zip(*map(jax.tree_util.tree_leaves, (eager, _all_jit(trees[0]))),
                       _all_tolerances(trees[0], eager)):
    np.testing.assert_allclose(j, e, rtol=0, atol=tol)
  for b, tree in enumerate(trees):
    looped = _all_jit(tree)
    tolerances = _all_tolerances(tree, looped)
    for e, v, p, tol in zip(*map(jax.tree_util.tree_leaves, (looped, batched, padded)),
                            tolerances):
      v, p = np.asarray(v)[b], np.asarray(p)[b]
      np.testing.assert_allclose(v, e, rtol=0, atol=tol)
      np.testing.assert_allclose(p[..., :24] if p.ndim else p, e, rtol=0, atol=tol)
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
  clean_tree = build(False)
  full, clean = _all_jit(build(True)), _all_jit(clean_tree)
  keep = [0, 1, 4]
  for f, c, tol in zip(jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(clean),
                       _all_tolerances(clean_tree, clean)):
    f, c = np.asarray(f), np.asarray(c)
    if f.ndim:
      np.testing.assert_allclose(f[keep], c[:3], rtol=0, atol=tol)
      np.testing.assert_array_equal(f[[2, 3]], 0.0)
    else:
      np.testing.assert_allclose(f, c, rtol=0, atol=tol)


@pytest.mark.slow
def test_estimators_import_no_heavy_packages():
  code = ("import sys, bpo_jax.estimators, bpo_jax.tree, bpo_jax.branching, bpo_jax.losses, "
          "bpo_jax; bad = [m for m in ('flax', 'transformers', 'orbax', 'torch', 'gymnasium', "
          "'textworld', 'jericho', 'alfworld', 'swebench', 'optax') if m in sys.modules]; "
          "print(bad); sys.exit(1 if bad else 0)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_loads_its_names_and_modules_on_first_use():
  # A fresh interpreter: `import bpo_jax` loads no JAX; each re-exported name is the defining
  # module's object, and the core's modules are attributes of the package (`bpo_jax.tree`).
  code = textwrap.dedent("""
      import sys
      import bpo_jax
      from bpo_jax import text
      assert "jax" not in sys.modules
      import importlib
      for name in bpo_jax.__all__:
        module = importlib.import_module(bpo_jax._EXPORTS[name])
        assert getattr(bpo_jax, name) is getattr(module, name), name
      assert bpo_jax.estimators.bpo_advantages is bpo_jax.bpo_advantages
      assert bpo_jax.tree.RolloutTree is bpo_jax.RolloutTree
      assert text.episodes.ExpertEpisode is text.ExpertEpisode
      assert set(bpo_jax.__all__) <= set(dir(bpo_jax))
      try:
        bpo_jax.no_such_name
      except AttributeError as e:
        print(e)
      """)
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == "module 'bpo_jax' has no attribute 'no_such_name'"


def test_nested_vmap_and_unbatched_tree():
  # The batched kernels treat a batch as one forest: a [2, 3] batch and a batched trunk baseline
  # over one (unbatched) tree must match tree-by-tree results.
  rng = np.random.default_rng(3)
  trees = [random_tree(rng, 20, 24, root_children=2, fail_prob=0.1) for _ in range(6)]
  grid = jax.tree_util.tree_map(lambda x: x.reshape((2, 3) + x.shape[1:]), stack_trees(trees))
  single = jax.jit(lambda t, trunk: E.bpo_advantages(t, gamma=0.9, trunk_baseline=trunk))
  nested = jax.jit(jax.vmap(jax.vmap(lambda t: E.bpo_advantages(t, gamma=0.9))))(grid)
  for k, tree in enumerate(trees):
    _assert_bpo_close(E.BPOOutput(*(np.asarray(x).reshape(6, -1)[k] for x in nested)),
                      single(tree, 0.0), tree, 0.9)
  trunks = jnp.array([0.0, 1.0, -2.0])
  over_trunks = jax.jit(jax.vmap(lambda b: E.bpo_advantages(trees[0], gamma=0.9,
                                                            trunk_baseline=b)))(trunks)
  for k in range(3):
    _assert_bpo_close(E.BPOOutput(*(x[k] for x in over_trunks)), single(trees[0], trunks[k]),
                      trees[0], 0.9)


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
  # Integers below 2²⁴ and γ = 1: every float32 operation here is exact.
  np.testing.assert_array_equal(out.values, np.arange(n, 0, -1))
  np.testing.assert_array_equal(out.baselines, -np.arange(n))
  np.testing.assert_array_equal(out.advantages, np.full(n, n))
  np.testing.assert_array_equal(out.weights, np.ones(n))


def test_wide_star_is_leave_one_out():
  # A trunk step, then 1000 terminal siblings below it (and, as a second tree, 1000 steps at the
  # root state): leave-one-out baselines and weights 1/K against NumPy in float64. The rewards are
  # eighths in [−4, 4], so every sum of them is exact in float32 and only the divisions round.
  k = 1000
  rewards = np.random.default_rng(4).integers(-32, 33, size=k) / 8
  below_trunk = from_parents([-1] + [0] * k, [0.5] + list(rewards))
  at_root = from_parents([-1] * k, list(rewards))
  out = jax.jit(jax.vmap(lambda t: E.bpo_advantages(t, gamma=0.9, trunk_baseline=0.25)))(
      stack_trees([below_trunk, pad_tree(at_root, k + 1)]))
  loo = (rewards.sum() - rewards) / (k - 1)
  for b, first in ((0, 1), (1, 0)):
    # b = sum / (K − 1) − Q̂ / (K − 1): 4 roundings (two divisions, a product, a difference) at
    # magnitude ≤ 4; the advantage one more at ≤ 8; the weight 1 / K one.
    assert_close(out.baselines[b, first:first + k], loo, steps=4, magnitude=4)
    assert_close(out.advantages[b, first:first + k], rewards - loo, steps=5, magnitude=8)
    assert_close(out.weights[b, first:first + k], np.full(k, 1 / k), steps=1, magnitude=1 / k)
  # The trunk step: Q̂ = 0.5 + 0.9 · mean(r), baseline the trunk's 0.25, weight 1: 0.9 to
  # float32, the mean's division, the product and the sum round, at magnitude ≤ 1; the
  # advantage once more.
  assert_close(out.values[0, 0], 0.5 + 0.9 * rewards.mean(), steps=4, magnitude=1)
  assert_close(out.advantages[0, 0], 0.25 + 0.9 * rewards.mean(), steps=5, magnitude=1)
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
    _assert_bpo_close(E.BPOOutput(*(x[b] for x in out)),
                      E.BPOOutput(*reference_bpo(tree, 0.97, -0.3)), tree, 0.97)
