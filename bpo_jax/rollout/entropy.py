"""The entropy at a state, the quantity the fork rule reads (`RolloutConfig.entropy_measure`).

Both measures are functions of the state alone: the entropy of the sampled action would make
the fork decision depend on the action and bias the estimator (docs/DESIGN.md §3).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import sampling
from bpo_jax.models.decoder import logprobs_and_entropy_from_logits


@functools.partial(jax.jit, static_argnums=1)
def first_token_entropy(next_logits: jax.Array, temperature: float) -> jax.Array:
  """[B] entropy of each row's next-token distribution `softmax(logits / T)`: the quantity the
  fork rule reads at a state, before any action token there is sampled."""
  targets = jnp.zeros(next_logits.shape[:1], jnp.int32)
  return logprobs_and_entropy_from_logits(next_logits, targets, temperature)[1]


def greedy_action_entropy(sampler: sampling.Sampler, params, decode_state: sampling.DecodeState,
                          keys: jax.Array, active: np.ndarray,
                          sampling_params: sampling.SamplingParams,
                          temperature: float) -> tuple[np.ndarray, np.ndarray]:
  """Per row: the token entropies summed along the greedy action, and its length in tokens.

  Decodes on a copy of the decode state with top-k 1 at the sampling temperature, so the token
  entropies are those of `softmax(logits / T)` along the argmax path; the copy is dropped (so
  the last probed token is never run through the model).
  """
  probe = dataclasses.replace(sampling_params, top_k=1, top_p=1.0, temperature=temperature or 1.0)
  _, out = sampler.generate(params, decode_state, keys, probe, active, keep_state=False)
  num_tokens = np.asarray(out.num_tokens)
  return np.asarray(jnp.sum(jnp.where(out.mask, out.entropies, 0.0), axis=1)), num_tokens
