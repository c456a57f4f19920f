"""The dense KV cache: `max_length` slots per row, per-layer keys and values.

A `KVCache` is a pytree passed into and out of the decoder's calls, with a fixed number of slots
so shapes stay static; forking rows is a gather on the batch axis (`KVCache.take_rows`). Between
calls it holds one array per layer; a scanned layer stack (`ModelConfig.scan_layers`) carries it
stacked along a leading layer axis (`to_stacked`), each scan step writing and reading its
layer's slice in place (`StackedLayer`, `write_stacked`).

`models.paged.PagedKVCache` answers the same calls the decoder makes of a cache (`layer`,
`layer_in_scan`, `with_layer`, `to_stacked`, `take_rows`, ...), so the decoder takes either.
"""

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from bpo_jax.models.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  """Per-layer keys and values for B rows of at most `max_length` tokens each.

  Attributes:
    keys: one [B, num_kv_heads, head_dim, S] array per layer (keys after RoPE), stored
      transposed so that a decoding step's scores `q · K` are a plain batched matmul over the
      slots (with [S, head_dim] keys XLA CPU's batched matmul is ~3x slower at decode sizes).
    values: one [B, num_kv_heads, S, head_dim] array per layer.
    lengths: [B] int32, number of valid slots of each row (slots `0..lengths[b]-1`).
  """
  keys: tuple
  values: tuple
  lengths: jax.Array

  @classmethod
  def init(cls, config: ModelConfig, batch_size: int, max_length: int,
           dtype=None) -> "KVCache":
    """An empty cache of `batch_size` rows and `max_length` slots per row."""
    if batch_size <= 0 or max_length <= 0:
      raise ValueError(f"batch_size and max_length must be positive, got {batch_size}, "
                       f"{max_length}")
    dtype = dtype or config.compute_dtype
    shape = (batch_size, config.num_kv_heads, max_length, config.head_dim)
    key_shape = (batch_size, config.num_kv_heads, config.head_dim, max_length)
    zeros = lambda s: tuple(jnp.zeros(s, dtype) for _ in range(config.num_layers))
    return cls(keys=zeros(key_shape), values=zeros(shape),
               lengths=jnp.zeros((batch_size,), jnp.int32))

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_length(self) -> int:
    return self.values[0].shape[2]

  def take_rows(self, rows) -> "KVCache":
    """The cache of rows `rows` (a gather on the batch axis; rows may repeat)."""
    rows = jnp.asarray(rows, jnp.int32)
    return jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0), self)

  def window(self, window: int) -> "KVCache":
    """The first `window` slots of every row (a static slice of keys and values): what a
    decode loop over that window works on."""
    return self.replace(keys=tuple(k[..., :window] for k in self.keys),
                        values=tuple(v[:, :, :window] for v in self.values))

  def with_window(self, part: "KVCache") -> "KVCache":
    """The cache with its first slots replaced by those of `part` (a `window` of it after a
    decode loop), and `part`'s lengths."""
    put = lambda full, head: jax.lax.dynamic_update_slice(full, head, (0, 0, 0, 0))
    return KVCache(keys=tuple(map(put, self.keys, part.keys)),
                   values=tuple(map(put, self.values, part.values)), lengths=part.lengths)

  def attend_span(self, attend_length: int) -> int:
    """Slots attention reads for a window of `attend_length` slots (all of them)."""
    return attend_length

  def layer(self, i: int, write_slots, input_lengths, span: int) -> tuple:
    """Layer i's (keys, values); a `paged.PagedKVCache` gives a `paged.PagedLayer`."""
    del write_slots, input_lengths, span
    return self.keys[i], self.values[i]

  def layer_in_scan(self, keys, values, i, write_slots, input_lengths, span) -> "StackedLayer":
    """Layer i (a traced int32) of the stacked keys and values a scan over the layers carries."""
    del write_slots, input_lengths, span
    return StackedLayer(keys, values, i)

  def with_layer(self, i: int, keys_values: tuple) -> "KVCache":
    """The cache with layer i's keys and values replaced (a layer loop's step)."""
    k, v = keys_values
    return self.replace(keys=self.keys[:i] + (k,) + self.keys[i + 1:],
                        values=self.values[:i] + (v,) + self.values[i + 1:])

  def to_stacked(self) -> "KVCache":
    """The same cache with keys and values each one array of a leading layer axis ([L, B,
    ...], one copy; `keys[i]` is still layer i): what a scanned layer stack carries."""
    if not isinstance(self.keys, tuple):
      return self
    return self.replace(keys=jnp.stack(self.keys), values=jnp.stack(self.values))

  def to_layers(self) -> "KVCache":
    """The same cache as tuples of per-layer arrays (one copy), its layout between calls."""
    if isinstance(self.keys, tuple):
      return self
    return self.replace(keys=tuple(self.keys), values=tuple(self.values))


class StackedLayer(NamedTuple):
  """Layer `index` (a traced int32) of a stacked cache's keys [L, B, Hkv, D, S] and values
  [L, B, Hkv, S, D]: what a scanned layer reads and writes, in place in the scan's carry."""
  keys: jax.Array
  values: jax.Array
  index: jax.Array


def write_stacked(layer: StackedLayer, k: jax.Array, v: jax.Array, write_slots) -> tuple:
  """The stacked (keys, values) with the new tokens k, v [B, T, Hkv, D] written into layer
  `layer.index` at slots `write_slots` [B, T] (a scatter into the whole stack, done in place
  in a scan's carry; slots past the end are dropped, as for a per-layer cache)."""
  rows = jnp.arange(k.shape[0])[:, None]
  i = layer.index
  keys = layer.keys.at[i, rows, :, :, write_slots].set(k.astype(layer.keys.dtype), mode="drop")
  values = layer.values.at[i, rows, :, write_slots].set(v.astype(layer.values.dtype),
                                                        mode="drop")
  return keys, values
