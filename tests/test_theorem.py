"""The claims of docs/DESIGN.md §3, as numbers against exact enumeration on small tabular MDPs.

Every tree the sampler can grow is enumerated with its probability, so expectations and variances
are exact sums; the only error is float32 arithmetic in the estimators, bounded per tree by
`bpo_roundings` at the tree's magnitude.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import estimators as E
from bpo_jax import fork_variance as FV
from bpo_jax.testing import tabular as T
from bpo_jax.testing.random_trees import bpo_roundings
from bpo_jax.testing.tolerance import assert_close, eps, ulp_tol


@functools.lru_cache(maxsize=None)
def _mdp(num_actions, horizon, seed=0):
  # A confident first step (entropy ≈ 0.04–0.08 nats) so the online rule forks deeper.
  root = (2.5,) + (-2.5,) * (num_actions - 1)
  return T.make_mdp(seed, num_actions=num_actions, horizon=horizon, root_logits=root,
                    logit_scale=0.7)


@functools.lru_cache(maxsize=None)
def _online(num_actions, horizon, threshold, max_forks, seed=0):
  mdp = _mdp(num_actions, horizon, seed)
  outcomes = T.enumerate_online_trees(mdp, threshold=threshold, fork_k=2, max_forks=max_forks)
  return mdp, T.to_batch(outcomes, mdp)


_children_counts = jax.jit(jax.vmap(E.children_counts))
_bpo = jax.jit(jax.vmap(E.bpo_advantages))
_rloo = jax.jit(jax.vmap(E.rloo_advantages))


def _trees(batch):
  return [jax.tree_util.tree_map(lambda x, b=b: x[b], batch.trees)
          for b in range(batch.probability.shape[0])]


def _roundings_and_magnitudes(batch):
  """Per enumerated tree: its float32 roundings (BPO's, + one per level for the rewards' own
  rounding to float32) and its magnitude (the largest |value|, |baseline| or |reward|)."""
  out = _bpo(jax.tree_util.tree_map(jnp.asarray, batch.trees))
  magnitude = np.max(np.abs(np.stack([out.values, out.baselines, batch.trees.reward])), (0, 2))
  levels = int(batch.trees.depth.max()) + 1
  steps = np.array([bpo_roundings(t) + levels for t in _trees(batch)])
  return steps, magnitude, levels


def _assert_matches_true_gradient(mean, mdp, batch, trunk_rounds=1):
  """The enumerated mean gradient Σ_t p_t g_t against the truth. A gradient entry of tree t is
  Σ_i w_i A_i (onehot − π)_i: score entries lie in [−1, 1] and the weights sum to at most 1 per
  level, so the entry is off by at most levels · (A's error), and the mean by the p-weighted sum
  of that. `trunk_rounds` = 2 when the trunk baseline is another tree's root value (its roundings
  and magnitude add to this tree's: a factor 2 on each)."""
  truth = T.true_gradient(mdp)
  assert np.abs(truth).max() > 0.1  # The comparison is not between two zeros.
  steps, magnitude, levels = _roundings_and_magnitudes(batch)
  atol = eps(np.float32) * levels * trunk_rounds**2 * (batch.probability @ (steps * magnitude))
  np.testing.assert_allclose(mean, truth, rtol=0, atol=atol)


def _assert_probabilities_sum_to_one(batch):
  # float64: each probability a product of ≤ capacity factors, then one sum over the trees.
  assert_close(batch.probability.sum(), 1.0, steps=len(batch.probability) + batch.trees.capacity)


@pytest.mark.parametrize("num_actions,horizon,threshold,max_forks", [
    (2, 3, 0.55, 2), (2, 4, 0.55, 2), (3, 3, 0.9, 2)])
def test_online_bpo_is_unbiased_zero_trunk(num_actions, horizon, threshold, max_forks):
  mdp, batch = _online(num_actions, horizon, threshold, max_forks)
  _assert_probabilities_sum_to_one(batch)
  # Forks happen, never at the confident root, and deeper down.
  counts = np.asarray(_children_counts(jax.tree_util.tree_map(jnp.asarray, batch.trees)))
  forked = counts[:, :-1] >= 2
  assert forked.any()
  np.testing.assert_array_equal(counts[:, -1], 1)
  assert set(np.asarray(batch.trees.depth)[forked].tolist()) >= {1}
  mean, _ = T.bpo_gradient_moments(batch, mdp, "zero", num_trees=1)
  _assert_matches_true_gradient(mean, mdp, batch)


def test_online_bpo_is_unbiased_loo_trunk():
  mdp, batch = _online(2, 3, 0.55, 2)
  mean, _ = T.bpo_gradient_moments(batch, mdp, "loo", num_trees=2)
  _assert_matches_true_gradient(mean, mdp, batch, trunk_rounds=2)


def test_online_bpo_is_unbiased_with_more_siblings_at_the_root():
  # rollout.root_k: K = 3 at the root state, K = 2 below; threshold 0 forks the confident root.
  mdp = _mdp(2, 3)
  batch = T.to_batch(T.enumerate_online_trees(mdp, threshold=0.0, fork_k=2, max_forks=2,
                                              root_k=3), mdp)
  _assert_probabilities_sum_to_one(batch)
  counts = np.asarray(_children_counts(jax.tree_util.tree_map(jnp.asarray, batch.trees)))
  np.testing.assert_array_equal(counts[:, -1], 3)  # the root's slot: three siblings
  assert set(counts[:, :-1][counts[:, :-1] >= 2].tolist()) == {2}
  mean, _ = T.bpo_gradient_moments(batch, mdp, "zero", num_trees=1)
  _assert_matches_true_gradient(mean, mdp, batch)


@pytest.mark.slow
def test_a_root_fork_of_all_the_leaves_is_rloo():
  # A 4-leaf tree with K' = 4 at the root and no fork left below is a group of 4 episodes with
  # the leave-one-out baseline: the same gradient distribution, so the same exact variance.
  # Error bound: an advantage takes s = H + N + 2 float32 roundings at the return's magnitude
  # H·max|r|, a gradient entry sums H of them (scores in [−1, 1], weights ≤ 1): |δg_j| ≤ e =
  # s·eps·H²·max|r|; then |δ(E‖g‖² − ‖E g‖²)| ≤ 2e√P(√E‖g‖² + ‖E g‖) + 2Pe² over P entries.
  mdp = T.make_mdp(0, num_actions=2, horizon=3, logit_scale=0.7)
  rows = {r["name"]: r for r in T.root_siblings_table(mdp, leaves=4, max_groups=8**4)}
  tree, group = rows["BPO K'=4 at the root, K=2 below"], rows["RLOO N=4"]
  # The tree's sizes are expectations: sums over its 8⁴ outcomes, in float64.
  assert_close(tree["leaves"], 4.0, steps=2 * 8**4, dtype=np.float64)
  assert_close(tree["env_steps"], group["env_steps"], steps=2 * 8**4, dtype=np.float64)
  horizon, num_params = mdp.horizon, mdp.logits.size
  e = (horizon + 4 + 2) * eps(np.float32) * horizon**2 * np.abs(mdp.rewards).max()
  mean_norm = np.linalg.norm(T.true_gradient(mdp))
  second = np.sqrt(group["variance"] + mean_norm**2)
  atol = 2 * e * np.sqrt(num_params) * (second + mean_norm) + 2 * num_params * e**2
  np.testing.assert_allclose(tree["variance"], group["variance"], rtol=0, atol=atol)
  # Fewer siblings at the root (more forks below) is another estimator, measurably apart.
  assert abs(rows["BPO K'=3 at the root, K=2 below"]["variance"] - group["variance"]) > 100 * atol


def test_wrong_weights_would_be_caught():
  # The same enumeration with every weight set to 1 (forks not averaged) is far from the truth,
  # so the unbiasedness tests above can fail.
  mdp, batch = _online(2, 3, 0.55, 2)
  out = _bpo(jax.tree_util.tree_map(jnp.asarray, batch.trees))
  g = T.tree_gradients(batch, mdp, np.asarray(out.advantages, np.float64))
  error = np.abs(np.tensordot(batch.probability, g, 1) - T.true_gradient(mdp)).max()
  assert error > 1e-2


@pytest.mark.parametrize("fork_depth,num_siblings", [(1, 2), (1, 3), (2, 2), (2, 3)])
def test_sibling_variance_reduction_is_prefix_explained_variance(fork_depth, num_siblings):
  mdp = _mdp(2, 3)
  k = num_siblings
  # LOO advantage over K independent episodes from the root (the first episode's).
  ind = T.to_batch(T.enumerate_independent(mdp, k), mdp)
  rloo = np.asarray(_rloo(jax.tree_util.tree_map(jnp.asarray, ind.trees)))
  a_ind = rloo[:, 0].astype(np.float64)
  var_ind = ind.probability @ a_ind**2 - (ind.probability @ a_ind)**2
  # LOO advantage over K siblings forked at depth t after a policy prefix (first sibling's).
  sib = T.to_batch(T.enumerate_sibling_fork(mdp, fork_depth, k), mdp)
  out = _bpo(jax.tree_util.tree_map(jnp.asarray, sib.trees))
  a_sib = np.asarray(out.advantages)[:, fork_depth].astype(np.float64)
  var_sib = sib.probability @ a_sib**2 - (sib.probability @ a_sib)**2
  # Var(E[G | s_t]) from backward induction: G's conditional mean is prefix rewards + V(s_t).
  values = T.state_values(mdp)
  cond = [(p, sum(r for _, _, r in steps) + values[T.state_after(mdp, steps)])
          for p, steps in T.prefixes(mdp, fork_depth)]
  p = np.array([c[0] for c in cond])
  m = np.array([c[1] for c in cond])
  var_cond = p @ m**2 - (p @ m)**2
  assert var_cond > 1e-3  # The prefix explains a nonzero share.
  # An advantage a off by δ moves p·a² − (p·a)² by at most 2 · max |a| · δ: with δ the tree's
  # roundings at its magnitude (RLOO's are at most BPO's on the same star tree: the same sums
  # and divisions, no inherited chain), each variance is within ulp_tol(max |a| · M, steps); the
  # float64 sums add nothing at that scale.
  def var_tol(batch, a):
    steps, magnitude, _ = _roundings_and_magnitudes(batch)
    return ulp_tol(np.float32, np.abs(a).max() * magnitude.max(), steps.max())
  tol_ind, tol_sib = var_tol(ind, a_ind), var_tol(sib, a_sib)
  np.testing.assert_allclose(var_ind - var_sib, k / (k - 1) * var_cond, rtol=0,
                             atol=tol_ind + tol_sib)
  # And the independent side is K/(K − 1) · Var(G) (from single-episode enumeration).
  single = T.enumerate_independent(mdp, 1)
  returns = np.array([sum(n[3] for n in o.nodes) for o in single])
  probs = np.array([o.probability for o in single])
  np.testing.assert_allclose(var_ind, k / (k - 1) * (probs @ returns**2 - (probs @ returns)**2),
                             rtol=0, atol=tol_ind)


@pytest.mark.parametrize("num_actions,horizon,threshold,max_forks", [
    (2, 3, 0.55, 2), (2, 4, 0.55, 1), (3, 3, 0.9, 2)])
def test_fork_moments_are_unbiased(num_actions, horizon, threshold, max_forks):
  """Over every tree of the online rule (forks sharing one budget, so sibling subtrees are not
  independent in shape) with its probability: E[mean] = E[G] and E[mean_square] = E[G²] (from
  single episodes), and at fork levels 1 and 2 E[within] = E[Var(G | s_τk)], each tree's exact
  Σ_g W_g Var(G | s_g) over its level-k fork groups g (0 for a tree without one)."""
  mdp, batch = _online(num_actions, horizon, threshold, max_forks)
  trees = jax.tree_util.tree_map(jnp.asarray, batch.trees)
  p = batch.probability
  single = T.enumerate_independent(mdp, 1)
  q = np.array([o.probability for o in single])
  g = np.array([sum(node[3] for node in o.nodes) for o in single])
  var_g = q @ g**2 - (q @ g) ** 2
  # float32 sums over a tree's ≤ N leaves of w·G and w·G² (≤ 2 + log2 N roundings at G² ≤
  # (horizon · max |r|)²), twice for the pair products, and the sum over groups; the float64
  # sums over trees add none.
  magnitude = (mdp.horizon * np.abs(mdp.rewards).max()) ** 2
  steps = 5 * (2 + int(np.ceil(np.log2(batch.trees.parent.shape[1]))))
  close = functools.partial(assert_close, steps=steps, magnitude=magnitude, dtype=np.float32)
  columns = [np.asarray(x) for x in (batch.trees.parent, batch.trees.depth, batch.trees.valid,
                                      jax.jit(jax.vmap(E.sibling_counts))(trees),
                                      jax.jit(jax.vmap(E.path_weights))(trees), batch.state)]
  variance_from = functools.lru_cache(maxsize=None)(
      lambda state, depth: T.return_variance_from(mdp, state, depth))
  shares = []
  for level in (1, 2):
    moments = jax.jit(jax.vmap(functools.partial(FV.fork_moments, level=level)))(trees)
    exact, reach = np.array([_exact_within(variance_from, *tree, level)
                             for tree in zip(*columns)]).T
    if level <= max_forks:  # groups of this level occur, some below the root, with variance
      assert exact.max() > 0.1
    else:
      assert exact.max() == 0.0
    close(p @ np.asarray(moments.mean, np.float64), q @ g)
    close(p @ np.asarray(moments.mean_square, np.float64), q @ g**2)
    close(p @ np.asarray(moments.within, np.float64), p @ exact)
    # The weight of the paths with a level-k fork: sums of ≤ N dyadic weights, exact.
    np.testing.assert_array_equal(np.asarray(moments.reach, np.float64), reach)
    # Var(E[G | s_τk]) / Var(G) ∈ [0, 1], growing with k (the later fork states know more);
    # the last-fork share of `prefix_explained_variance` has no such reading.
    shares.append(1.0 - (p @ exact) / var_g)
    assert 0.0 <= shares[-1] <= 1.0
  assert shares[1] >= shares[0]


def _exact_within(variance_from, parent, depth, valid, counts, weights, states,
                  level: int) -> tuple[float, float]:
  """(Σ_g W_g Var(G | s_g), Σ_g W_g) over one tree's fork groups of `level` (exact, float64):
  `variance_from(state, depth)` the variance of the return from there."""
  forks_on_path = np.zeros(len(parent), int)
  for i in range(len(parent)):  # parents first
    if valid[i]:
      above = forks_on_path[parent[i]] if parent[i] >= 0 else 0
      forks_on_path[i] = above + (counts[i] >= 2)
  groups = {}
  for i in np.flatnonzero(valid & (counts >= 2) & (forks_on_path == level)):
    groups.setdefault(int(parent[i]), []).append(int(i))
  within = sum(np.sum(weights[m], dtype=np.float64) * variance_from(int(states[m[0]]),
                                                                    int(depth[m[0]]))
               for m in groups.values())
  return within, sum(np.sum(weights[m], dtype=np.float64) for m in groups.values())


def test_top_k_after_the_fact_is_biased():
  mdp = _mdp(2, 3)
  outcomes = T.enumerate_topk_trees(mdp, k=1, fork_k=2)
  batch = T.to_batch(outcomes, mdp)
  _assert_probabilities_sum_to_one(batch)
  mean, _ = T.bpo_gradient_moments(batch, mdp, "zero", num_trees=1)
  bias = np.abs(mean - T.true_gradient(mdp)).max()
  assert bias > 0.05  # ≈ 0.31 for this MDP, against ≈ 1e-7 for the online rule.
