"""The token-level policy objective: per-node advantages and path weights on action tokens,
PPO-clip against the sampling policy's logprobs, an optional KL to a reference, and explicit
normalisation modes.

Per token t of node i (an action token), with ratio ρ_t = exp(log π(t) − log π_old(t)):

  ℓ_t = −w_i · min(ρ_t A_i, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_i) + β · w_i · KL_t,
  KL_t = exp(ref_t − logp_t) − (ref_t − logp_t) − 1     (the non-negative "k3" estimator).

Observation and prompt tokens carry no node (index −1) and are masked out.

Normalisation (`normalization=`):
  * "tree": Σ_t mask_t ℓ_t / C with C a constant that does not depend on the sampled tokens
    (default: the number of trees, i.e. rows when a row is a tree). With w the path weights this
    is (1/C) Σ_trees Σ_i w_i Σ_{t ∈ i} ..., whose gradient at ρ = 1 is exactly the BPO estimator
    Σ_i w_i A_i ∇log π(a_i|s_i) (log π of an action is the sum over its tokens): UNBIASED.
  * "token": Σ_t mask_t ℓ_t / Σ_t mask_t, the token mean of GRPO/DAPO. The divisor is random
    (it depends on the sampled lengths), so the gradient is biased.
  * "sequence": the mean over rows of each row's token mean (the original GRPO). Biased too.
"""

from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp

Array = chex.Array
Normalization = Literal["tree", "token", "sequence"]
NORMALIZATIONS = ("tree", "token", "sequence")


def broadcast_to_tokens(node_values: Array, token_node: Array) -> Array:
  """Per-token values from per-node values: token t gets node_values[token_node[t]], or 0 where
  token_node is −1 (prompt and observation tokens).

  Works on one tree ([N] and [T]) or a batch ([B, N] and [B, T]).
  Example: node_values [0.5, −1], token_node [−1, 0, 0, 1] → [0, 0.5, 0.5, −1].
  """
  chex.assert_rank(token_node, node_values.ndim)
  if node_values.ndim == 2:
    chex.assert_equal_shape_prefix([node_values, token_node], 1)
    return jax.vmap(broadcast_to_tokens)(node_values, token_node)
  safe = jnp.clip(token_node, 0, node_values.shape[0] - 1)
  return jnp.where(token_node >= 0, node_values[safe], 0.0)


def k3_kl(logp: Array, ref_logp: Array, mask: Array) -> Array:
  """Per-token k3 estimate of KL(π ‖ π_ref) (Schulman 2020, "Approximating KL divergence").

  With δ_t = ref_logp_t − logp_t for tokens drawn from π:

    k3_t = exp(δ_t) − δ_t − 1  ≥ 0,  zero exactly where the two logprobs agree.

  E_π[exp(δ)] = Σ π · π_ref / π = 1, so E_π[k3] = E_π[−δ] = KL(π ‖ π_ref): unbiased like −δ
  (k1), never negative, and of lower variance when the policies are close. The reference gets
  no gradient; ∂k3_t/∂logp_t = 1 − exp(δ_t) has the sign of logp_t − ref_logp_t, so a descent
  step on β · k3 moves each token's logp toward ref_logp. (As a loss its gradient is not the
  exact gradient of the KL, whose sampling distribution also moves; GRPO, Shao et al. 2024,
  uses it this way.)

  Args:
    logp: [...] log π of each token under the current policy.
    ref_logp: same shape, under the frozen reference policy.
    mask: same shape, nonzero on the tokens that count (action tokens).
  Returns:
    k3 per token, 0 where `mask` is 0 (NaNs there do not leak); the token mean is
    `sum(k3) / max(sum(mask), 1)`. Example: logp −1, ref_logp −2 gives e⁻¹ − (−1) − 1 = 0.368.
  """
  chex.assert_equal_shape([logp, ref_logp, mask])
  delta = jax.lax.stop_gradient(ref_logp) - logp
  return jnp.where(mask != 0, jnp.exp(delta) - delta - 1.0, 0.0)


def policy_loss(logprobs: Array, old_logprobs: Array, advantages: Array, weights: Array,
                mask: Array, *, ref_logprobs: Array | None = None, clip_eps: float = 0.2,
                clip_eps_high: float | None = None, kl_coef: float = 0.0,
                normalization: Normalization = "tree",
                normalizer: float | None = None) -> tuple[Array, dict[str, Array]]:
  """The clipped policy objective (module docstring) and its metrics.

  Args:
    logprobs: [T] or [B, T], log π of each token under the current policy.
    old_logprobs: same shape, under the sampling policy (no gradient flows through them).
    advantages: same shape, each token's node advantage (`broadcast_to_tokens`).
    weights: same shape, each token's node path weight (ones for RLOO/GRPO rows).
    mask: same shape, 1 on action tokens that train, 0 elsewhere.
    ref_logprobs: optional, under the reference policy for the KL term.
    clip_eps, clip_eps_high: the clip range [1 − clip_eps, 1 + clip_eps_high] (high defaults to
      clip_eps; DAPO's clip-higher sets it larger).
    kl_coef: β, the KL weight (needs ref_logprobs when > 0).
    normalization: "tree" (unbiased), "token" or "sequence" (see module docstring).
    normalizer: C for "tree"; defaults to the number of rows (1 for a single [T] row).
  Returns:
    (loss, metrics) with metrics: clip_fraction, approx_kl (old → new, k3), ref_kl (if given),
    num_tokens.
  """
  chex.assert_equal_shape([logprobs, old_logprobs, advantages, weights, mask])
  if ref_logprobs is not None:
    chex.assert_equal_shape([logprobs, ref_logprobs])
  if normalization not in NORMALIZATIONS:
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
  if kl_coef > 0 and ref_logprobs is None:
    raise ValueError("kl_coef > 0 needs ref_logprobs")
  if clip_eps < 0 or (clip_eps_high is not None and clip_eps_high < 0):
    raise ValueError(f"clip ranges must be >= 0, got {clip_eps}, {clip_eps_high}")
  high = clip_eps if clip_eps_high is None else clip_eps_high
  mask = mask.astype(logprobs.dtype)
  log_ratio = logprobs - jax.lax.stop_gradient(old_logprobs)
  ratio = jnp.exp(log_ratio)
  unclipped = ratio * advantages
  clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
  per_token = -weights * jnp.minimum(unclipped, clipped)
  metrics = {}
  if ref_logprobs is not None:
    kl = k3_kl(logprobs, ref_logprobs, mask)
    per_token = per_token + kl_coef * weights * kl
    metrics["ref_kl"] = jnp.sum(kl * mask) / jnp.maximum(jnp.sum(mask), 1.0)

  rows = 1 if logprobs.ndim == 1 else logprobs.shape[0]
  if normalization == "tree":
    c = float(rows if normalizer is None else normalizer)
    if c <= 0:
      raise ValueError(f"normalizer must be positive, got {normalizer}")
    loss = jnp.sum(per_token * mask) / c
  elif normalization == "token":
    loss = jnp.sum(per_token * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  else:
    row_sum = jnp.sum(per_token * mask, axis=-1)
    row_len = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
    loss = jnp.mean(row_sum / row_len)

  num_tokens = jnp.maximum(jnp.sum(mask), 1.0)
  was_clipped = (jnp.abs(unclipped - clipped) > 0) & (clipped < unclipped)
  metrics["clip_fraction"] = jnp.sum(was_clipped * mask) / num_tokens
  old_minus_new = jax.lax.stop_gradient(-log_ratio)
  metrics["approx_kl"] = jnp.sum((jnp.exp(old_minus_new) - old_minus_new - 1.0) * mask) / num_tokens
  metrics["num_tokens"] = jnp.sum(mask)
  return loss, metrics
