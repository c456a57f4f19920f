"""The entropy at a state, the quantity the fork rule reads (`RolloutConfig.entropy_measure`).

Both measures are functions of the state alone: the entropy of the sampled action would make
the fork decision depend on the action and bias the estimator (docs/DESIGN.md §3).
"""

from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import sampling
from bpo_jax.models.decoder import logprobs_and_entropy_from_logits


def first_token_entropy(next_logits: jax.Array, temperature: float) -> jax.Array:
  """[B] entropy of each row's next-token distribution `softmax(logits / T)` (T = 0: the
  untempered distribution): the quantity the fork rule reads at a state, before any action
  token there is sampled. One compiled program for every temperature (it is data)."""
  return _first_token_entropy(next_logits, np.float32(temperature or 1.0))


@jax.jit
def _first_token_entropy(next_logits: jax.Array, temperature: jax.Array) -> jax.Array:
  targets = jnp.zeros(next_logits.shape[:1], jnp.int32)
  return logprobs_and_entropy_from_logits(next_logits, targets, temperature)[1]


def greedy_action_entropy(sampler: sampling.Sampler, params, decode_state: sampling.DecodeState,
                          keys: jax.Array, active: np.ndarray,
                          sampling_params: sampling.SamplingParams,
                          temperature: float) -> tuple[np.ndarray, np.ndarray]:
  """Per row: the token entropies summed along the greedy action, and its length in tokens.

  Decodes greedily on a copy of the decode state, reporting the token entropies of
  `softmax(logits / T)` along the argmax path (T = 0: the untempered distribution); the copy is
  dropped (so the last probed token is never run through the model).
  """
  probe = dataclasses.replace(sampling_params, greedy=True, top_k=0, top_p=1.0,
                              temperature=temperature or 1.0)
  _, out = sampler.generate(params, decode_state, keys, probe, active, keep_state=False)
  num_tokens = np.asarray(out.num_tokens)
  return np.asarray(jnp.sum(jnp.where(out.mask, out.entropies, 0.0), axis=1)), num_tokens
