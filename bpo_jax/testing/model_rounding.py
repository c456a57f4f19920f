"""How many float roundings a decoder forward takes: the `steps` of `testing.tolerance`.

Two float computations of the same function that differ only in the order of their sums (a
cache against a full forward, another batch size, XLA against PyTorch, one processor against
another) agree to a number of rounding steps of the magnitude they work at. For a decoder
forward that count is `forward_roundings`: along the deepest path through the model, each
reduction of n terms adds ceil(log2 n) (the depth of a pairwise sum, which bounds a reordered
sum in units of its magnitude) and each layer a few elementwise functions (rsqrt, exp, cos/sin,
divisions) that libraries round differently by about an ulp each. The residual stream and
normalised activations keep intermediate magnitudes of the order of the logits, so the count is
taken at the magnitude of the values compared:

  assert_close(got, want, steps=forward_roundings(config, attended_slots=48))

For the tiny test models that is 126-152 roundings, ≈ 9e-5 at logits of size 6.
"""

import math

# Elementwise functions per layer whose last bit may differ between implementations: two
# RMSNorm rsqrts and scalings, RoPE's cos and sin, the softmax's exp and division, SiLU's exp
# and division.
ELEMENTWISE_PER_LAYER = 8


def sum_roundings(n: int) -> int:
  """Roundings a reordered sum of n terms may differ by, in units of its magnitude: ceil(log2 n)."""
  return max(1, math.ceil(math.log2(max(n, 2))))


def forward_roundings(config, attended_slots: int, *, layers=None, logprobs: bool = False) -> int:
  """Rounding steps along the deepest path of a decoder forward (see the module docstring).

  Args:
    config: a `ModelConfig` (its sizes are read).
    attended_slots: the number of keys one query's softmax sums over (the cache slots read, or
      the sequence length without a cache).
    layers: how many layers the compared values went through (default: all, plus the final
      norm and output projection); a cache's keys and values after layer l pass `l` layers.
    logprobs: the values are log-probabilities or entropies: adds the log-sum-exp over the
      vocabulary.
  """
  h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
  hd = config.num_heads * config.head_dim
  per_layer = (2 * sum_roundings(h)      # the two RMSNorm means
               + sum_roundings(h)        # q / k / v projections
               + sum_roundings(d)        # scores q · k
               + 2 * sum_roundings(attended_slots)   # softmax sum, probabilities @ values
               + sum_roundings(hd)       # o projection
               + sum_roundings(h)        # gate / up projections
               + sum_roundings(i)        # down projection
               + ELEMENTWISE_PER_LAYER)
  if layers is not None:
    return layers * per_layer
  count = config.num_layers * per_layer + 2 * sum_roundings(h)   # final norm, output projection
  if logprobs:
    count += sum_roundings(config.vocab_size) + 2
  return count
