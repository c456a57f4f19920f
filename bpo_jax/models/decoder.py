"""Flax NNX decoder for the Llama 3.x / Qwen2.5 / Qwen3 family, with a functional KV cache.

Block: `x + Attn(RMSNorm(x))`, then `x + SwiGLU(RMSNorm(x))`; grouped-query attention with RoPE
(the "rotate half" layout of HF checkpoints), optional q/k/v biases (Qwen2), optional per-head
RMSNorm of queries and keys before RoPE (Qwen3), Llama 3 RoPE frequency scaling, tied or untied
output projection, optional low-rank adapters on every projection (`models.lora`).

Calling convention:

  logits, cache = model(tokens, positions=None, attention_mask=None, cache=None,
                        input_lengths=None)

* Without a cache: `tokens` [B, T] is a whole sequence (or a packed tree). `positions` [B, T]
  feeds RoPE (default `0..T-1`); `attention_mask` [B, T, T] (True = may attend) replaces the
  default causal mask, e.g. for ancestor attention on a packed tree. Right padding needs no mask:
  causal attention keeps real tokens from seeing the padding after them.
* With a cache: `tokens` [B, T] are appended to each row's cached tokens, right padded, with
  `input_lengths` [B] real tokens per row (default T). Row b's new tokens go to cache slots
  `cache.lengths[b] + t` and take those slot indices as positions unless `positions` is given;
  each new token attends to the row's earlier slots and to itself. Only `input_lengths[b]` of the
  written slots count: the rest are overwritten by later appends and never attended before.

A caller that knows more about its shapes than the model does (the sampler) may pass
`options=ForwardOptions(...)`, keyword only, to skip work the plain call would do; the numbers
stay those of the plain call (see `ForwardOptions`).

The cache is a pytree passed in and out: the dense `kv_cache.KVCache` (a fixed number of slots
per row, so shapes stay static; forking rows is a gather on the batch axis), or a
`paged.PagedKVCache` (pools of pages and a page table per row, forks sharing pages), which is
taken the same way and gives the same numbers up to the summation order of attention. With
`scan_layers` either cache rides in the carry of one `lax.scan` over the layers.
"""

import functools
import math
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bpo_jax.models import lora
from bpo_jax.models import paged
from bpo_jax.models.config import Llama3RopeScaling, ModelConfig
from bpo_jax.models.kv_cache import KVCache, StackedLayer, write_stacked


@flax.struct.dataclass
class ForwardOptions:
  """Work a forward pass may skip when the caller knows its shapes; the numbers do not change.

  Attributes:
    attend_length: (a static int, with a cache only) bounds the slots attention reads to
      `0..attend_length-1`, so a call costs what the rows hold rather than what the cache could
      hold. The caller keeps `cache.lengths[b] + T <= attend_length` for every row whose tokens
      count: a new token in a slot at or past the bound would not see itself. Keys and values
      are still written into the full cache; slots past the bound are masked out anyway (they
      hold no row's earlier tokens), so the numbers equal those of `attend_length =
      max_length`, the default (None).
    logits_at: [B, K] (with or without a cache) picks the time steps whose logits are wanted:
      `logits[b, k]` is then the logits at time `logits_at[b, k]`, [B, K, V]. The output
      projection is a quarter of a small model's work per token, and a continued prefill needs
      only each row's last token: its logits equal those of the full output at that step. With
      a cache, the last layer also works at those steps only: it computes and caches the keys
      and values of every new token, but its queries, attention and MLP only where logits are
      wanted (nothing after it reads the other steps), 1/L of an L-layer prefill saved.
    unembedding: [hidden, vocab] replaces the output projection's kernel (the transposed token
      embedding of a tied model, the `lm_head` of an untied one) by the one given: a caller
      that runs many steps with the same weights passes a tied embedding transposed once (see
      `sampling.Sampler.unembedding`). The logits are the same up to the matmul's summation
      order.
    layer_stack: (`scan_layers`) the layers' state stacked (`stacked_layer_state`)
      by a caller that runs many steps with the same weights (`sampling.generate`, once before
      its loop), in place of stacking it in every call. Unused when the last layer works at
      `logits_at` alone.
  """
  logits_at: Optional[jax.Array] = None
  unembedding: Optional[jax.Array] = None
  layer_stack: Optional[object] = None
  attend_length: Optional[int] = flax.struct.field(pytree_node=False, default=None)


def rope_inverse_frequencies(head_dim: int, theta: float,
                             scaling: Optional[Llama3RopeScaling] = None) -> np.ndarray:
  """RoPE inverse frequencies `f_i = θ^(-2i/d)`, with Llama 3 rescaling when given.

  Computed in float32 as the HF reference does. Example: `head_dim=4, theta=100` gives
  `[1.0, 0.1]`.
  """
  exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
  inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
  if scaling is None:
    return inv_freq
  old_context = np.float32(scaling.original_max_position_embeddings)
  low_freq_wavelength = old_context / np.float32(scaling.low_freq_factor)
  high_freq_wavelength = old_context / np.float32(scaling.high_freq_factor)
  wavelength = np.float32(2 * math.pi) / inv_freq
  # Long wavelengths (low frequencies) are stretched by `factor`; short ones are kept.
  scaled = np.where(wavelength > low_freq_wavelength, inv_freq / np.float32(scaling.factor),
                    inv_freq).astype(np.float32)
  smooth = ((old_context / wavelength - np.float32(scaling.low_freq_factor)) /
            np.float32(scaling.high_freq_factor - scaling.low_freq_factor)).astype(np.float32)
  blended = ((1 - smooth) * scaled / np.float32(scaling.factor) + smooth * scaled).astype(np.float32)
  is_medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
  return np.where(is_medium, blended, scaled).astype(np.float32)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, head_dim] of angles `position · f_i`, each frequency used twice."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, T, H, D] by the angles: `x·cos + rotate_half(x)·sin` (HF layout)."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos = cos[:, :, None, :].astype(x.dtype)
  sin = sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


def _at_steps(x: jax.Array, steps: jax.Array) -> jax.Array:
  """x [B, T, ...] at the time steps `steps` [B, K]: [B, K, ...]."""
  index = steps.astype(jnp.int32).reshape(steps.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


# Queries per block of `attend`: longer rows are attended a block of queries at a time.
QUERY_BLOCK = 512


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, dtype,
           query_block: int = QUERY_BLOCK, causal: bool = False) -> jax.Array:
  """Masked softmax attention, `softmax(q kᵀ / √D + mask) v` over each query's keys.

  q [B, Hkv, G, T, D] (G query heads per key-value head), k [B, Hkv, D, S], v [B, Hkv, S, D],
  mask [B, T, S] (True = may attend); returns [B, Hkv, G, T, D]. Scores and the softmax are
  float32, the rest `dtype`.

  Memory: the scores are B·H·T·S floats, quadratic in a packed row's length (a 8192-token row
  of four heads is 1 GiB). When T > `query_block`, the queries are taken in the fewest equal
  blocks of at most `query_block` (padded, if T does not divide, with queries that attend
  nowhere and are dropped), each block's attention recomputed in the backward pass
  (`jax.checkpoint`) rather than kept, so at most B·H·query_block·S scores live at once. Each
  query's softmax still runs over all its keys: the same arithmetic per query, only the
  matmuls' shapes differ.

  `causal` (a cache-free forward: S = T, key j is query j's own token): query j attends key k
  only if k <= j as well as `mask` says, so the block of queries [lo, hi) reads keys [0, hi)
  alone; over n blocks that is (n + 1) / 2n of the scores. A block in which every row's
  queries attend only themselves (a packed batch's padding, `packing.attention_mask`) is not
  computed (`lax.cond`): its output is each query's own value, which is what a softmax over
  one key gives exactly. So a micro-batch whose rows all end by token E costs the blocks up to
  E, whatever the row length it is padded to. The masked keys left out add exact zeros to
  every sum; only the order of the sums' terms differs from the dense attention's.
  """
  b, kv_heads, groups, t, d = q.shape

  def block(q_block, mask_block, k_block, v_block):
    tb = q_block.shape[3]
    flat = q_block.reshape(b, kv_heads, groups * tb, d)
    scores = jnp.einsum("bkqd,bkds->bkqs", flat, k_block).astype(jnp.float32)
    scores = scores / np.float32(math.sqrt(d))
    scores = scores.reshape(b, kv_heads, groups, tb, -1)
    scores = jnp.where(mask_block[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    probs = probs.reshape(b, kv_heads, groups * tb, -1)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, v_block)
    return out.reshape(b, kv_heads, groups, tb, d)

  if causal:
    return _causal_blocks(block, q, k, v, mask, dtype, query_block)
  if t <= query_block:
    return block(q, mask, k, v)
  n = -(-t // query_block)   # the fewest blocks of at most query_block queries ...
  size = -(-t // n)          # ... of equal size, so fewer than n queries are padding
  pad = n * size - t
  q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0)))
  mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)))
  q_blocks = jnp.moveaxis(q.reshape(b, kv_heads, groups, n, size, d), 3, 0)
  mask_blocks = jnp.moveaxis(mask.reshape(b, n, size, -1), 1, 0)
  out = jax.lax.map(lambda xs: jax.checkpoint(block)(*xs, k, v), (q_blocks, mask_blocks))
  out = jnp.moveaxis(out, 0, 3).reshape(b, kv_heads, groups, n * size, d)
  return out[:, :, :, :t]


def _causal_blocks(block, q, k, v, mask, dtype, query_block: int) -> jax.Array:
  """`attend`'s causal path: query blocks [lo, hi) of at most `query_block`, one after another
  (unrolled, each its own shape), each over keys [0, hi) and recomputed in the backward pass;
  a block where every query attends only itself gives its queries' own values (`attend`)."""
  b, kv_heads, groups, t, d = q.shape
  compute = block if t <= query_block else jax.checkpoint(block)  # one block: nothing to free
  outs = []
  for lo in range(0, t, query_block):
    hi = min(lo + query_block, t)
    own_key = jnp.arange(lo, hi)[:, None] == jnp.arange(hi)[None, :]
    mask_block = mask[:, lo:hi, :hi] & (jnp.arange(hi)[None, :] <= jnp.arange(lo, hi)[:, None])
    args = (q[:, :, :, lo:hi], mask_block, k[..., :hi], v[:, :, :hi])
    if lo == 0:
      outs.append(compute(*args))
      continue
    own = jnp.broadcast_to(v[:, :, None, lo:hi].astype(dtype), (b, kv_heads, groups, hi - lo, d))
    only_self = jnp.all(mask_block == own_key[None])
    outs.append(jax.lax.cond(only_self, lambda *_, own=own: own, compute, *args))
  return jnp.concatenate(outs, axis=3)


def attend_pages(q: jax.Array, layer: paged.PagedLayer, mask: jax.Array, dtype) -> jax.Array:
  """`attend` over a paged cache's layer (its new tokens already written): q
  [B, Hkv, G, T, D], mask [B, T, S'] over the S' slots of the pages `layer.table` lists.

  One-token steps go to the Pallas paged-attention op where `paged.uses_kernel` says so;
  everything else gathers the pages into a dense window and runs `attend` (the portable
  reference: the same arithmetic as the dense cache, over S' rather than the window's slots).
  """
  if paged.uses_kernel(layer, q.shape[3]):
    # A causal mask over slots: the query sees its own slot and every one before it.
    return paged.kernel_attend(q, layer, jnp.sum(mask[:, 0], axis=-1, dtype=jnp.int32))
  k, v = paged.gather_window(layer)
  return attend(q, k.astype(dtype), v.astype(dtype), mask, dtype)


def _normal(rngs: nnx.Rngs, shape, dtype, stddev=0.02):
  return nnx.Param(stddev * jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype))


class RMSNorm(nnx.Module):
  """`y = w ⊙ x / sqrt(mean(x²) + eps)`, the statistic taken in float32."""

  def __init__(self, dim: int, eps: float, *, dtype, param_dtype):
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.weight[...].astype(self.dtype) * normed.astype(self.dtype)


def _add_adapters(module: nnx.Module, config: ModelConfig, rngs: nnx.Rngs, shapes: dict):
  """`{name}_lora_a`, `{name}_lora_b` on `module` for each name: (kernel in dims, out dims)."""
  module.lora_scale = config.lora_scale
  module.lora_targets = tuple(shapes)
  for name in module.lora_targets:
    a, b = lora.init_adapter(rngs.params(), *shapes[name], config.lora_rank, config.params_dtype)
    setattr(module, f"{name}_lora_a", a)
    setattr(module, f"{name}_lora_b", b)


def _with_adapter(module: nnx.Module, name: str, x: jax.Array, y: jax.Array) -> jax.Array:
  """`y = x W` plus the adapter of projection `name`, if the module has one."""
  if name not in module.lora_targets:
    return y
  a, b = getattr(module, f"{name}_lora_a")[...], getattr(module, f"{name}_lora_b")[...]
  # The base projection is computed as in a model without adapters: without the barrier XLA may
  # fold x·W and the adapter's matmuls into one computation of other rounding, and B = 0 would
  # not give the base model's logits bit for bit.
  y = jax.lax.optimization_barrier(y)
  return y + lora.adapter_output(x, a, b, module.lora_scale, y.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention; kernels laid out per head so heads can be sharded."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    h, d = config.hidden_size, config.head_dim
    pd = config.params_dtype
    heads, kv_heads = config.num_heads, config.num_kv_heads
    self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, d
    self.dtype = config.compute_dtype
    self.q_kernel = _normal(rngs, (h, heads, d), pd)
    self.k_kernel = _normal(rngs, (h, kv_heads, d), pd)
    self.v_kernel = _normal(rngs, (h, kv_heads, d), pd)
    self.o_kernel = _normal(rngs, (heads, d, h), pd)
    self.qkv_bias = config.qkv_bias
    if config.qkv_bias:
      self.q_bias = _normal(rngs, (heads, d), pd)
      self.k_bias = _normal(rngs, (kv_heads, d), pd)
      self.v_bias = _normal(rngs, (kv_heads, d), pd)
    self.qk_norm = config.qk_norm
    if config.qk_norm:
      self.q_norm = RMSNorm(d, config.rms_norm_eps, dtype=self.dtype, param_dtype=pd)
      self.k_norm = RMSNorm(d, config.rms_norm_eps, dtype=self.dtype, param_dtype=pd)
    self.lora_targets = ()  # set by `Decoder` with `lora_rank > 0`

  @staticmethod
  def adapter_shapes(config: ModelConfig) -> dict:
    """(kernel input dims, output dims) of each projection, in the kernels' layouts."""
    h, d, heads, kv_heads = (config.hidden_size, config.head_dim, config.num_heads,
                             config.num_kv_heads)
    return {"q": ((h,), (heads, d)), "k": ((h,), (kv_heads, d)), "v": ((h,), (kv_heads, d)),
            "o": ((heads, d), (h,))}

  def __call__(self, x, cos, sin, mask, layer_cache=None, write_slots=None, query_at=None):
    """x [B,T,h]; layer_cache (keys [B,Hkv,D,S], values [B,Hkv,S,D], or a `paged.PagedLayer`);
    mask [B,T,S'] (True = may attend).

    With a cache, attention reads the first S' <= S slots (S' = the mask's last dimension):
    slots past every row's last new token are masked out and need not be read at all.

    `query_at` [B,K] (optional) keeps the queries of those time steps only: keys and values are
    still those of all T tokens (and all are cached), and the output is [B,K,h], what the full
    call gives at those steps.

    Returns the output [B,T,h] (or [B,K,h]) and the updated (keys, values), or None without a
    cache.
    """
    dt = self.dtype
    x = x.astype(dt)
    b = x.shape[0]
    x_q, k_cos, k_sin = x, cos, sin
    if query_at is not None:
      x_q, cos, sin, mask = (_at_steps(a, query_at) for a in (x, cos, sin, mask))
    t = x_q.shape[1]
    project = lambda inputs, kernel: jnp.einsum("btm,mhd->bthd", inputs, kernel[...].astype(dt))
    q = _with_adapter(self, "q", x_q, project(x_q, self.q_kernel))
    k = _with_adapter(self, "k", x, project(x, self.k_kernel))
    v = _with_adapter(self, "v", x, project(x, self.v_kernel))
    if self.qkv_bias:
      q = q + self.q_bias[...].astype(dt)
      k = k + self.k_bias[...].astype(dt)
      v = v + self.v_bias[...].astype(dt)
    if self.qk_norm:  # Qwen3: each head RMS-normalised over head_dim, before RoPE
      q, k = self.q_norm(q), self.k_norm(k)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, k_cos, k_sin)
    new_cache = None
    if isinstance(layer_cache, paged.PagedLayer):
      layer_cache = paged.write(layer_cache, k, v)
      new_cache = (layer_cache.keys, layer_cache.values)
    elif isinstance(layer_cache, StackedLayer):
      new_cache = write_stacked(layer_cache, k, v, write_slots)
      k, v = new_cache[0][layer_cache.index], new_cache[1][layer_cache.index]
    elif layer_cache is not None:
      cached_k, cached_v = layer_cache
      rows = jnp.arange(x.shape[0])[:, None]
      # `.at[rows, :, :, slots]` ([B, Hkv, D, S] keys) and `.at[rows, :, slots]` ([B, Hkv, S, D]
      # values) both take the new [B, T, Hkv, D] tokens. mode="drop": slots past the end are
      # discarded instead of clamped onto valid slots.
      k = cached_k.at[rows, :, :, write_slots].set(k.astype(cached_k.dtype), mode="drop")
      v = cached_v.at[rows, :, write_slots].set(v.astype(cached_v.dtype), mode="drop")
      new_cache = (k, v)
    if layer_cache is not None and not isinstance(layer_cache, paged.PagedLayer):
      attend_length = mask.shape[-1]
      if attend_length < v.shape[2]:
        # A static slice: the score and value matmuls then cost T·S' rather than T·S per row.
        k, v = k[..., :attend_length], v[:, :, :attend_length]
      k, v = k.astype(dt), v.astype(dt)
    elif layer_cache is None:
      k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
    # Heads-major layout so both attention matmuls are plain batched matmuls over (B, Hkv):
    # the cached keys [D, S] and values [S, D] are read in place, never transposed (it
    # dominates decoding).
    groups = self.num_heads // self.num_kv_heads
    q = q.reshape(b, t, self.num_kv_heads, groups, self.head_dim).transpose(0, 2, 3, 1, 4)
    if isinstance(layer_cache, paged.PagedLayer):
      out = attend_pages(q, layer_cache, mask, dt).transpose(0, 3, 1, 2, 4)
    else:
      causal = layer_cache is None and query_at is None  # key j is query j's own token
      out = attend(q, k, v, mask, dt, causal=causal).transpose(0, 3, 1, 2, 4)
    # [B, T, H·D] @ [H·D, h], heads major as in the HF layout: the kernel's reshape is free, where
    # an einsum over (h, d) has XLA copy the kernel into another layout on every call.
    heads_out = out.reshape(b, t, self.num_heads, self.head_dim)
    out = out.reshape(b, t, self.num_heads * self.head_dim)
    o_kernel = self.o_kernel[...].astype(dt)
    out = _with_adapter(self, "o", heads_out, out @ o_kernel.reshape(-1, o_kernel.shape[-1]))
    return out, new_cache


class MLP(nnx.Module):
  """SwiGLU: `down(silu(gate(x)) ⊙ up(x))`."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    h, i, pd = config.hidden_size, config.intermediate_size, config.params_dtype
    self.dtype = config.compute_dtype
    self.gate_kernel = _normal(rngs, (h, i), pd)
    self.up_kernel = _normal(rngs, (h, i), pd)
    self.down_kernel = _normal(rngs, (i, h), pd)
    self.lora_targets = ()  # set by `Decoder` with `lora_rank > 0`

  @staticmethod
  def adapter_shapes(config: ModelConfig) -> dict:
    h, i = config.hidden_size, config.intermediate_size
    return {"gate": ((h,), (i,)), "up": ((h,), (i,)), "down": ((i,), (h,))}

  def __call__(self, x):
    dt = self.dtype
    gate = _with_adapter(self, "gate", x, x @ self.gate_kernel[...].astype(dt))
    up = _with_adapter(self, "up", x, x @ self.up_kernel[...].astype(dt))
    hidden = jax.nn.silu(gate) * up
    return _with_adapter(self, "down", hidden, hidden @ self.down_kernel[...].astype(dt))


class DecoderLayer(nnx.Module):

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    kw = dict(dtype=config.compute_dtype, param_dtype=config.params_dtype)
    self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
    self.attn = Attention(config, rngs=rngs)
    self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
    self.mlp = MLP(config, rngs=rngs)

  def __call__(self, x, cos, sin, mask, layer_cache=None, write_slots=None, query_at=None):
    """x [B,T,h] → ([B,T,h], or [B,K,h] at the steps `query_at` [B,K]; the new cache)."""
    attn_out, new_cache = self.attn(self.input_norm(x), cos, sin, mask, layer_cache, write_slots,
                                    query_at)
    if query_at is not None:
      x = _at_steps(x, query_at)
    x = x + attn_out
    x = x + self.mlp(self.post_attn_norm(x))
    return x, new_cache


class Decoder(nnx.Module):
  """Decoder-only transformer; `model(tokens, ...) -> (logits float32 [B,T,V], cache)` (see the
  calling convention in the module docstring)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    pd = config.params_dtype
    self.embed = _normal(rngs, (config.vocab_size, config.hidden_size), pd)
    self.layers = nnx.List([DecoderLayer(config, rngs=rngs) for _ in range(config.num_layers)])
    self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps,
                              dtype=config.compute_dtype, param_dtype=pd)
    if not config.tie_word_embeddings:
      self.lm_head = _normal(rngs, (config.hidden_size, config.vocab_size), pd)
    if config.lora_rank:
      # Drawn after every base weight, so the base is the same with and without adapters.
      for layer in self.layers:
        _add_adapters(layer.attn, config, rngs, Attention.adapter_shapes(config))
        _add_adapters(layer.mlp, config, rngs, MLP.adapter_shapes(config))

  def _layers_without_cache(self, x, cos, sin, mask):
    """The layer stack of a cache-free forward, rematerialised and scanned as configured.

    With `scan_layers` the weights are stacked along a new leading axis inside the compiled
    program and one `lax.scan` step runs a layer, so XLA compiles one layer body instead of
    `num_layers` copies (the stacking costs one copy of the layers' weights per device).
    """
    remat = self.config.remat

    def run_layer(graphdef, layer_state, h):
      return nnx.merge(graphdef, layer_state)(h, cos, sin, mask)[0]

    if self.config.scan_layers:
      graphdef, stacked = _stack_layers(self.layers)
      body = lambda h, layer_state: (run_layer(graphdef, layer_state, h), None)
      if remat != "none":
        # prevent_cse=False: inside a scan the recomputation cannot be merged away anyway.
        body = jax.checkpoint(body, policy=_remat_policy(remat), prevent_cse=False)
      x, _ = jax.lax.scan(body, x, stacked)
      return x
    for layer in self.layers:
      if remat == "none":
        x, _ = layer(x, cos, sin, mask)
      else:
        graphdef, layer_state = nnx.split(layer)
        step = jax.checkpoint(functools.partial(run_layer, graphdef),
                              policy=_remat_policy(remat))
        x = step(layer_state, x)
    return x

  def _scanned_layers_with_cache(self, x, cos, sin, mask, cache, write_slots, input_lengths,
                                 last_query_at=None, layer_stack=None):
    """The layer stack of a cached forward as one `lax.scan` (`scan_layers`): (output, the
    cache with the new keys and values, in the layout it came in).

    The layers' weights are stacked as in `_layers_without_cache`. A dense cache's per-layer
    arrays are stacked too (`KVCache.to_stacked`, unless they are already, as in
    `sampling.generate`'s loop); a paged cache's pools already hold every layer. The cache's
    arrays ride in the scan's carry, and step i writes its new tokens into layer i's part
    (`layer_in_scan`: a dense cache's slice, a paged cache's pages offset by i·P) and attends
    over it, so XLA compiles one layer body whatever the depth.
    `last_query_at` [B, K]: the last layer runs its queries at those steps only (see
    `ForwardOptions.logits_at`), as one more layer body after the scan over the others.
    `layer_stack`: the layers' state already stacked (`ForwardOptions.layer_stack`).
    """
    stacked = cache.to_stacked()
    layers = list(self.layers)
    if last_query_at is not None:
      layers, last = layers[:-1], layers[-1]
    keys, values = stacked.keys, stacked.values
    if layers:
      if layer_stack is not None and last_query_at is None:
        graphdef, states = nnx.graphdef(layers[0]), layer_stack
      else:
        graphdef, states = _stack_layers(layers)

      span = mask.shape[-1]

      def body(carry, xs):
        h, keys, values = carry
        layer_state, index = xs
        view = stacked.layer_in_scan(keys, values, index, write_slots, input_lengths, span)
        h, (keys, values) = nnx.merge(graphdef, layer_state)(h, cos, sin, mask, view,
                                                             write_slots)
        return (h, keys, values), None

      (x, keys, values), _ = jax.lax.scan(
          body, (x, keys, values), (states, jnp.arange(len(layers), dtype=jnp.int32)))
    if last_query_at is not None:
      index = jnp.asarray(len(layers), jnp.int32)
      view = stacked.layer_in_scan(keys, values, index, write_slots, input_lengths,
                                   mask.shape[-1])
      x, (keys, values) = last(x, cos, sin, mask, view, write_slots, last_query_at)
    new_cache = stacked.replace(keys=keys, values=values)
    return x, new_cache.to_layers() if isinstance(cache.keys, tuple) else new_cache

  def output_embedding(self) -> jax.Array:
    """The output projection as [vocab, hidden] rows: the token embedding of a tied model, the
    transposed `lm_head` of an untied one; logits are `hidden @ output_embedding().T`."""
    if self.config.tie_word_embeddings:
      return self.embed[...]
    return self.lm_head[...].T

  def hidden_states(self, tokens: jax.Array, positions: Optional[jax.Array] = None,
                    attention_mask: Optional[jax.Array] = None) -> jax.Array:
    """The final-normed hidden states [B, T, hidden] of a cache-free call (the input of the
    output projection): for callers that need the logits a few tokens at a time, e.g.
    `packing.token_logprobs_from_hidden` on a large vocabulary."""
    positions, mask, _ = self._positions_and_mask(tokens, positions, attention_mask, None, None,
                                                  ForwardOptions())
    x, cos, sin = self._embed_and_rope(tokens, positions)
    return self.final_norm(self._layers_without_cache(x, cos, sin, mask))

  def _embed_and_rope(self, tokens: jax.Array, positions: jax.Array):
    """The first layer's input (token embeddings in the compute dtype) and RoPE's cos, sin."""
    # Recomputed at trace time (numpy constants) rather than stored as a non-Variable attribute.
    inv_freq = rope_inverse_frequencies(self.config.head_dim, self.config.rope_theta,
                                        self.config.rope_scaling)
    cos, sin = rope_cos_sin(positions, inv_freq)
    return jnp.take(self.embed[...], tokens, axis=0).astype(self.config.compute_dtype), cos, sin

  def __call__(self, tokens: jax.Array, positions: Optional[jax.Array] = None,
               attention_mask: Optional[jax.Array] = None, cache: Optional[KVCache] = None,
               input_lengths: Optional[jax.Array] = None, *,
               options: Optional[ForwardOptions] = None):
    options = ForwardOptions() if options is None else options
    positions, mask, write_slots = self._positions_and_mask(
        tokens, positions, attention_mask, cache, input_lengths, options)
    b, t = tokens.shape
    logits_at, unembedding = options.logits_at, options.unembedding
    x, cos, sin = self._embed_and_rope(tokens, positions)
    # With a cache, the last layer's output is read only where logits are wanted: it runs its
    # queries and MLP there alone, unless that is every step anyway (a decoding step).
    narrow = cache is not None and logits_at is not None and logits_at.shape[1] < t
    new_cache = cache
    if cache is None:
      x = self._layers_without_cache(x, cos, sin, mask)
    elif self.config.scan_layers:
      x, new_cache = self._scanned_layers_with_cache(x, cos, sin, mask, cache, write_slots,
                                                     input_lengths,
                                                     logits_at if narrow else None,
                                                     options.layer_stack)
    else:
      last = len(self.layers) - 1
      for i, layer in enumerate(self.layers):
        layer_cache = new_cache.layer(i, write_slots, input_lengths, mask.shape[-1])
        x, keys_values = layer(x, cos, sin, mask, layer_cache, write_slots,
                               logits_at if narrow and i == last else None)
        new_cache = new_cache.with_layer(i, keys_values)
    if logits_at is not None and not narrow:
      x = _at_steps(x, logits_at)
    x = self.final_norm(x)
    if unembedding is not None:
      logits = x @ unembedding.astype(x.dtype)
    elif self.config.tie_word_embeddings:
      logits = jnp.einsum("btm,vm->btv", x, self.embed[...].astype(x.dtype))
    else:
      logits = x @ self.lm_head[...].astype(x.dtype)
    logits = logits.astype(jnp.float32)

    if cache is None:
      return logits, None
    if input_lengths is None:
      input_lengths = jnp.full((b,), t, jnp.int32)
    return logits, new_cache.replace(lengths=cache.lengths + input_lengths.astype(jnp.int32))

  def _positions_and_mask(self, tokens, positions, attention_mask, cache, input_lengths,
                          options: ForwardOptions):
    """Checks a call's inputs; returns positions [B, T], the attention mask ([B, T, T], or
    [B, T, S'] over the S' cache slots attended) and the cache slots written [B, T] (None
    without a cache)."""
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, time], got shape {tokens.shape}")
    b, t = tokens.shape
    attend_length = options.attend_length
    if cache is None:
      if input_lengths is not None:
        raise ValueError("input_lengths is only meaningful with a cache")
      if attend_length is not None:
        raise ValueError("attend_length is only meaningful with a cache")
      if positions is None:
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      if attention_mask is None:
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
      else:
        if attention_mask.shape != (b, t, t):
          raise ValueError(f"attention_mask must be [batch, time, time] = {(b, t, t)}, got "
                           f"{attention_mask.shape}")
        mask = attention_mask.astype(bool)
      write_slots = None
    else:
      if attention_mask is not None:
        raise ValueError("attention_mask is not supported together with a cache: cached "
                         "attention is causal over each row's slots")
      if cache.batch_size != b:
        raise ValueError(f"cache has {cache.batch_size} rows but tokens have {b}")
      write_slots = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
      if positions is None:
        positions = write_slots
      attend_length = check_attend_length(attend_length, t, cache.max_length)
      key_slots = jnp.arange(cache.attend_span(attend_length), dtype=jnp.int32)
      mask = key_slots[None, None, :] <= write_slots[:, :, None]
    if positions.shape != (b, t):
      raise ValueError(f"positions must be [batch, time] = {(b, t)}, got {positions.shape}")
    logits_at = options.logits_at
    if logits_at is not None and (logits_at.ndim != 2 or logits_at.shape[0] != b):
      raise ValueError(f"logits_at must be [batch, K] time indices with batch {b}, got shape "
                       f"{logits_at.shape}")
    kernel_shape = (self.config.hidden_size, self.config.vocab_size)
    unembedding = options.unembedding
    if unembedding is not None and tuple(unembedding.shape) != kernel_shape:
      raise ValueError(f"unembedding must be [hidden, vocab] = {kernel_shape}, got shape "
                       f"{tuple(unembedding.shape)}")
    return positions, mask, write_slots


def check_attend_length(attend_length: Optional[int], num_new_tokens: int,
                        max_length: int) -> int:
  """The number of cache slots cached attention reads: `attend_length`, or all of them if None.

  It must be a Python int (it fixes a shape) in `[num_new_tokens, max_length]`.
  Example: `check_attend_length(None, 1, 64) == 64`, `check_attend_length(32, 1, 64) == 32`.
  """
  if attend_length is None:
    return max_length
  if isinstance(attend_length, bool) or not isinstance(attend_length, (int, np.integer)):
    raise ValueError(f"attend_length must be a Python int (a static shape), got "
                     f"{type(attend_length).__name__}")
  if not num_new_tokens <= attend_length <= max_length:
    raise ValueError(f"attend_length must be in [{num_new_tokens}, {max_length}] (the new "
                     f"tokens per row, the cache length), got {attend_length}")
  return int(attend_length)


def _remat_policy(name: str):
  """The `jax.checkpoint` policy of a `ModelConfig.remat` name (None: save nothing)."""
  if name == "dots":
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  return None


def _stack_layers(layers):
  """(graphdef, state with a leading layer axis) of identically shaped layers."""
  graphdefs, states = zip(*(nnx.split(layer) for layer in layers))
  if any(g != graphdefs[0] for g in graphdefs[1:]):
    raise ValueError("scan_layers needs identically structured layers")
  return graphdefs[0], jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def stacked_layer_state(graphdef, state):
  """The layers' state of `nnx.split(model)` stacked along a leading layer axis
  (`ForwardOptions.layer_stack`), or None when the model does not scan its layers."""
  model = nnx.merge(graphdef, state)
  return _stack_layers(model.layers)[1] if model.config.scan_layers else None


def forward(graphdef, state, tokens, positions=None, attention_mask=None, cache=None,
            input_lengths=None, *, options: Optional[ForwardOptions] = None):
  """Pure form of `Decoder.__call__` over `nnx.split(model)`, for `jax.jit` in hot loops.

  `options.attend_length` is a shape, held as static data of the `ForwardOptions` pytree: each
  value compiles its own program.
  """
  model = nnx.merge(graphdef, state)
  return model(tokens, positions=positions, attention_mask=attention_mask, cache=cache,
               input_lengths=input_lengths, options=options)


def forward_hidden(graphdef, state, tokens, positions=None, attention_mask=None):
  """Pure form of `Decoder.hidden_states`: (hidden states [B, T, hidden], the output projection
  as [vocab, hidden] rows, `Decoder.output_embedding`)."""
  model = nnx.merge(graphdef, state)
  hidden = model.hidden_states(tokens, positions=positions, attention_mask=attention_mask)
  return hidden, model.output_embedding()


def logprobs_and_entropy_from_logits(logits: jax.Array, targets: jax.Array,
                                     temperature=1.0) -> tuple[jax.Array, jax.Array]:
  """Log-probability of `targets` and entropy under `softmax(logits / temperature)`.

  This is the distribution the sampler draws from before any top-k / top-p truncation, and the
  one whose numbers it reports; temperature 0 (greedy) reports the untempered `softmax(logits)`.

  Args:
    logits: [..., V] float logits.
    targets: [...] int token ids.
    temperature: a Python float ≥ 0, or a float32 array > 0 (data of a compiled program:
      dividing by 1 is exact, so temperature 1 gives the numbers of the Python 1).

  Returns:
    (logprobs [...], entropies [...]) in float32. Example: logits `[0, 0]`, target 1 gives
    `log(1/2)` and entropy `log 2`.
  """
  scaled = logits.astype(jnp.float32)
  if isinstance(temperature, (int, float)):
    if temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature not in (0.0, 1.0):
      scaled = scaled / np.float32(temperature)
  else:
    scaled = scaled / jnp.asarray(temperature, jnp.float32)
  # With z = x - max(x), e = exp(z) and s = Σ e: log p_i = z_i - log s and
  # H = -Σ p_i log p_i = log s - Σ e_i z_i / s. One exponential per logit (a log-softmax followed
  # by exp(log p) takes two), and both terms of H are >= 0, so nothing cancels.
  # z is recomputed from x wherever it is used rather than materialised: XLA then fuses the two
  # sums into passes over the logits (3% of a decoding step at a 32k vocabulary).
  row_max = jax.lax.stop_gradient(jnp.max(scaled, axis=-1, keepdims=True))
  weights = jnp.exp(scaled - row_max)
  total = jnp.sum(weights, axis=-1)
  log_total = jnp.log(total)
  # Logits of -inf have weight 0 and add 0 (not 0·inf = nan) to the weighted sum.
  weighted = jnp.sum(jnp.where(weights > 0, weights * (scaled - row_max), 0.0), axis=-1)
  entropy = log_total - weighted / total
  target = jnp.take_along_axis(scaled, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return target - row_max[..., 0] - log_total, entropy


def token_logprobs_and_entropy(graphdef, state, tokens: jax.Array, targets: jax.Array,
                               positions: Optional[jax.Array] = None,
                               attention_mask: Optional[jax.Array] = None,
                               temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """Training-side per-token logprobs and entropies: a full forward, no cache.

  `targets[b, t]` is the token predicted from position t: for a plain sequence
  `targets = tokens[:, 1:]` padded by one column (the last column is then meaningless); for a
  packed tree, the next token along the path of token t. The numbers equal what the sampler
  returns for the same tokens and temperature, so the PPO importance ratio starts at 1.

  Returns:
    (logprobs [B, T], entropies [B, T]) float32.
  """
  logits, _ = forward(graphdef, state, tokens, positions=positions,
                      attention_mask=attention_mask)
  return logprobs_and_entropy_from_logits(logits, targets, temperature)
