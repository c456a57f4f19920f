"""The k3 KL estimator: a NumPy reference, its expectation, and a gradient that pulls toward the
reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import losses
from bpo_jax.testing.tolerance import assert_close


def test_k3_equals_numpy_and_is_zero_where_masked():
  rng = np.random.default_rng(0)
  logp = -rng.exponential(size=(3, 7)).astype(np.float32)
  ref_logp = -rng.exponential(size=(3, 7)).astype(np.float32)
  mask = (rng.random((3, 7)) < 0.7).astype(np.float32)
  ref_logp[0, 0], mask[0, 0] = np.nan, 0.0  # a masked NaN does not leak
  got = losses.k3_kl(jnp.asarray(logp), jnp.asarray(ref_logp), jnp.asarray(mask))
  delta = ref_logp.astype(np.float64) - logp
  want = np.where(mask > 0, np.exp(delta) - delta - 1.0, 0.0)
  # exp, two subtractions: three float32 roundings at the size of exp(δ).
  assert_close(got, want, steps=3, magnitude=float(np.nanmax(np.exp(delta))))
  assert np.all(np.asarray(got) >= 0) and np.isfinite(np.asarray(got)).all()
  # By hand (the docstring's example): logp −1, ref −2 gives e⁻¹ + 1 − 1.
  one = losses.k3_kl(jnp.asarray([-1.0]), jnp.asarray([-2.0]), jnp.asarray([1.0]))
  assert_close(one, [np.exp(-1.0)], steps=3)
  np.testing.assert_array_equal(losses.k3_kl(jnp.zeros(4), jnp.zeros(4), jnp.ones(4)), 0.0)


def test_k3_mean_over_policy_samples_is_the_kl():
  """Tokens drawn from π: the mean of k3 is KL(π ‖ π_ref), computed exactly from the tables."""
  p = np.asarray([0.5, 0.3, 0.15, 0.05])
  q = np.asarray([0.25, 0.25, 0.25, 0.25])
  exact = float(np.sum(p * np.log(p / q)))
  draws = np.random.default_rng(1).choice(4, size=200_000, p=p)
  logp, ref = np.log(p)[draws], np.log(q)[draws]
  k3 = np.asarray(losses.k3_kl(jnp.asarray(logp, jnp.float32), jnp.asarray(ref, jnp.float32),
                               jnp.ones(draws.shape)))
  standard_error = k3.std() / np.sqrt(draws.size)
  assert abs(k3.mean() - exact) < 5 * standard_error, (k3.mean(), exact, standard_error)


def test_k3_gradient_pulls_logp_toward_the_reference():
  logp = jnp.asarray([-0.5, -3.0, -1.0, -2.0])
  ref_logp = jnp.asarray([-1.5, -1.0, -1.0, -0.2])
  mask = jnp.asarray([1.0, 1.0, 1.0, 0.0])
  loss = lambda lp: jnp.sum(losses.k3_kl(lp, ref_logp, mask))
  grad = jax.grad(loss)(logp)
  # ∂k3/∂logp = 1 − exp(ref − logp): positive above the reference, negative below, 0 at it and
  # where masked; the reference itself gets none.
  want = np.where(np.asarray(mask) > 0, 1.0 - np.exp(ref_logp - logp), 0.0)
  assert_close(grad, want, steps=3, magnitude=float(np.exp(np.max(ref_logp - logp))))
  assert grad[0] > 0 and grad[1] < 0 and grad[2] == 0 and grad[3] == 0
  assert float(jnp.abs(jax.grad(
      lambda r: jnp.sum(losses.k3_kl(logp, r, mask)))(ref_logp)).max()) == 0.0
  # Descent steps bring every counted token's logp to its reference, the k3 sum to 0.
  for _ in range(200):
    logp = logp - 0.1 * jax.grad(loss)(logp)
  # Near the reference each step shrinks the gap by a factor 0.9: after 200 steps (0.9²⁰⁰ ≈ 7e-10)
  # only the rounding of the last steps is left, a few ulps of |logp| ≤ 3.
  counted = np.asarray(mask) > 0
  assert_close(np.asarray(logp)[counted], np.asarray(ref_logp)[counted], steps=8, magnitude=3.0)
  # k3 there is exp(δ) − δ − 1 at δ ≈ 0: three roundings at magnitude 1 per counted token.
  assert abs(float(loss(logp))) <= 3 * 3 * np.finfo(np.float32).eps


def test_policy_loss_kl_term_is_k3():
  rng = np.random.default_rng(2)
  shape = (2, 5)
  logp, old, ref = (jnp.asarray(-rng.exponential(size=shape), jnp.float32) for _ in range(3))
  mask = jnp.asarray(rng.random(shape) < 0.8, jnp.float32)
  ones, zeros = jnp.ones(shape), jnp.zeros(shape)
  without, _ = losses.policy_loss(logp, old, zeros, ones, mask, normalization="token")
  with_kl, metrics = losses.policy_loss(logp, old, zeros, ones, mask, ref_logprobs=ref,
                                        kl_coef=0.5, normalization="token")
  mean_k3 = jnp.sum(losses.k3_kl(logp, ref, mask)) / jnp.sum(mask)
  assert_close(metrics["ref_kl"], mean_k3, steps=4)
  assert_close(with_kl - without, 0.5 * mean_k3, steps=4)


def test_k3_checks_shapes():
  with pytest.raises(AssertionError):
    losses.k3_kl(jnp.zeros(3), jnp.zeros(4), jnp.ones(3))
