"""The token-level objective: hand-computed values, the per-tree gradient is the BPO estimator,
normalisation modes, and clipping.

Tolerances count float32 roundings at the magnitude compared (bpo_jax.testing.tolerance). A loss
that is a difference of larger terms is compared at the magnitude of its terms.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import losses as L
from bpo_jax.testing.tolerance import assert_close


def test_broadcast_to_tokens():
  # A gather: no arithmetic, so exact.
  np.testing.assert_array_equal(
      L.broadcast_to_tokens(jnp.array([0.5, -1.0]), jnp.array([-1, 0, 0, 1])), [0, 0.5, 0.5, -1])
  batched = L.broadcast_to_tokens(jnp.array([[1.0, 2.0], [3.0, 4.0]]),
                                  jnp.array([[1, -1], [0, 0]]))
  np.testing.assert_array_equal(batched, [[2, 0], [3, 3]])


def test_per_tree_gradient_is_the_bpo_estimator():
  # One tree, three nodes; tokens of node i are action tokens, -1 are observations.
  token_node = jnp.array([-1, 0, 0, -1, 1, 2, 2, 2])
  adv_node = jnp.array([1.5, -2.0, 0.5])
  w_node = jnp.array([1.0, 0.5, 0.5])
  mask = (token_node >= 0).astype(jnp.float32)
  adv = L.broadcast_to_tokens(adv_node, token_node)
  w = L.broadcast_to_tokens(w_node, token_node)
  lp = jnp.log(jnp.array([0.3, 0.2, 0.6, 0.5, 0.4, 0.7, 0.9, 0.1]))

  def loss(lp):
    return L.policy_loss(lp, lp, adv, w, mask, normalization="tree", normalizer=2.0)[0]

  grad = jax.grad(loss)(lp)
  # d loss / d logp_t = −w_i A_i / C on action tokens, 0 elsewhere.
  expected = -np.asarray(w * adv) * np.asarray(mask) / 2.0
  # Dyadic advantages and weights: the products and the division by C = 2 are exact; allow the
  # ratio exp(0) and the product with it, 4 roundings at magnitude ≤ 1.
  assert_close(grad, expected, steps=4, magnitude=1)
  # Value at ratio 1: −Σ_i w_i A_i · (tokens of i) / C: 8 terms summed and divided, at the
  # magnitude of their sum of absolute values (3 + 1 + 0.75).
  assert_close(loss(lp), -(1.0 * 1.5 * 2 + 0.5 * -2.0 + 0.5 * 0.5 * 3) / 2.0, steps=12,
               magnitude=4.75)


def test_normalisation_modes():
  adv = jnp.array([[1.0, 1.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
  mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
  lp = jnp.zeros((2, 4))
  ones = jnp.ones((2, 4))
  per_tree, _ = L.policy_loss(lp, lp, adv, ones, mask, normalization="tree")
  per_token, _ = L.policy_loss(lp, lp, adv, ones, mask, normalization="token")
  per_seq, _ = L.policy_loss(lp, lp, adv, ones, mask, normalization="sequence")
  # Integer sums and a division: ≤ 6 roundings at magnitude ≤ 5 (exact here).
  for loss, expected in ((per_tree, -(3 + 2) / 2), (per_token, -(3 + 2) / 4),
                         (per_seq, -(1 + 2) / 2)):
    assert_close(loss, expected, steps=6, magnitude=5)
  with pytest.raises(ValueError, match="normalization must be one of"):
    L.policy_loss(lp, lp, adv, ones, mask, normalization="mean")


def test_clipping_and_metrics():
  old = jnp.log(jnp.array([0.5, 0.5, 0.5, 0.5]))
  new = jnp.log(jnp.array([0.8, 0.2, 0.8, 0.5]))  # ratios 1.6, 0.4, 1.6, 1.0
  adv = jnp.array([1.0, -1.0, -1.0, 1.0])
  mask = jnp.ones(4)
  loss, m = L.policy_loss(new, old, adv, jnp.ones(4), mask, clip_eps=0.2)
  # min(ρA, clip(ρ)A): 1.2, −0.8 (clip 0.8·−1 = −0.8 vs −0.4 → −0.8), −1.6, 1.0. Each ratio is
  # exp of a difference of two logs (4 roundings, relative to ρ ≤ 1.6), then the clip bounds,
  # the products and a sum of 4 terms: ≤ 12 roundings at the terms' magnitude 1.6 (the loss
  # itself, 0.2, is a difference of them).
  assert_close(loss, -(1.2 - 0.8 - 1.6 + 1.0) / 1, steps=12, magnitude=1.6)
  assert_close(m["clip_fraction"], 0.5, steps=2)  # A count over a count.
  r = np.array([1.6, 0.4, 1.6, 1.0])
  # k3 = 1/ρ − log(1/ρ) − 1: the ratio's 4 roundings, exp, a difference, −1, the mean: ≤ 12 at
  # magnitude 2.5 (1/ρ at ρ = 0.4).
  assert_close(m["approx_kl"], np.mean(1 / r - np.log(1 / r) - 1), steps=12, magnitude=2.5)
  # Clip-higher widens the upper side only.
  loss_high, _ = L.policy_loss(new, old, adv, jnp.ones(4), mask, clip_eps=0.2, clip_eps_high=1.0)
  assert_close(loss_high, -(1.6 - 0.8 - 1.6 + 1.0), steps=12, magnitude=1.6)


def test_kl_to_reference():
  lp = jnp.log(jnp.array([0.5, 0.25]))
  ref = jnp.log(jnp.array([0.25, 0.25]))
  zeros = jnp.zeros(2)
  loss, m = L.policy_loss(lp, lp, zeros, jnp.ones(2), jnp.ones(2), ref_logprobs=ref,
                          kl_coef=0.1)
  d = np.log(0.5)  # ref − logp on the first token; 0 on the second.
  kl = np.exp(d) - d - 1
  # The two logs and their difference, exp, two differences, the sum, the mean and 0.1: ≤ 10
  # roundings at the magnitude of the terms, 1 + |d|.
  assert_close(loss, 0.1 * kl, steps=10, magnitude=0.1 * (1 - d))
  assert_close(m["ref_kl"], kl / 2, steps=10, magnitude=1 - d)
  with pytest.raises(ValueError, match="needs ref_logprobs"):
    L.policy_loss(lp, lp, zeros, jnp.ones(2), jnp.ones(2), kl_coef=0.1)
