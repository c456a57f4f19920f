"""Jitted prefill / decode / fork for many rows at once, with per-token logprob and entropy.

The state of the sampler is a pytree passed in and out, `DecodeState(cache, next_logits)`:
the KV cache of B rows with a fixed number of slots, and for each row the logits of its next
token. A host rollout loop drives it:

  sampler = Sampler(graphdef, config, max_length=512)
  ds = sampler.prefill(state, [prompt_a, prompt_b])          # rows of different lengths
  ds, out = sampler.generate(state, ds, key, SamplingParams(temperature=1.0, max_new_tokens=64,
                                                            stop_token_ids=(eos,)))
  ds = fork(ds, rows=[0], k=4)                               # row 0 copied into rows 0..3
  ds = sampler.append(state, ds, {1: observation_tokens})     # continued prefill of row 1
  ds = take_rows(ds, [0, 2])                                  # drop / compact rows

Layout: rows are right padded. Row b holds its tokens in cache slots `0..lengths[b]-1`, token
positions equal slot indices, and appended tokens go to the next free slots. Every emitted token
is written to the cache, so the cache always holds exactly the row's prompt, generations and
observations, and `next_logits` is ready for the next `generate`.

On a mesh: parameters laid out on a device mesh (`params_mesh`; the training loop reshards them
to `sharding.SAMPLING_RULES`, split over "tensor") decode on that mesh. `Sampler.init_state`
and `Sampler.take_rows` given the mesh lay the DecodeState out by `sharding.cache_shardings`
(rows over "data" and "fsdp", KV heads over "tensor"); `append` and `generate` lay the state
they return out the same (their static `mesh`), and a fork's gather is one compiled program
whose output is laid out the same, so the cache never leaves the devices and every call takes
the layout its program was compiled for.

Paged cache: `Sampler(..., page_size=n)` makes states whose cache is a `models.paged.
PagedKVCache` (pages of n slots, a page table per row, host reference counts): `take_rows` then
shares pages (a fork copies at most one page per new row), `place` forks a row into free rows of
the same batch and `release` frees rows. The calls and their results are those of the dense
cache, up to the rounding of attention's sums; a paged state is consumed by each call.

Keys: `generate` takes one PRNG key for the whole batch (split once per decode step), or one
key per row (typed keys of shape [B], or raw keys [B, 2]): row b's token at decode step s is then
drawn with `fold_in(keys[b], s)`, so what a row samples does not depend on the other rows of the
batch (the rollout engine gives every branch of every tree its own key this way).

Numbers returned per generated token (`SampleOutput`): the token id, its log-probability and the
entropy under the temperature-scaled distribution `softmax(logits / temperature)` before top-k /
top-p truncation (temperature 0, i.e. greedy, reports `softmax(logits)`), and a mask of the
tokens actually generated. `bpo_jax.models.token_logprobs_and_entropy` computes the same numbers
from a full training-mode forward, so the importance ratio starts at 1.

Attention window: cached attention reads only the cache slots that can hold data, so a call
costs what the rows hold, not what the cache could hold. `Sampler.append` and
`Sampler.generate` read the row lengths on the host and pass a static `attend_length`
(`attend_length_for`): the longest row after the call, i.e. `max(lengths + new tokens)` over the
rows that take tokens (`append`) or over the active rows (`generate`, `max_new_tokens` new
tokens each), rounded up to a power of two of at least `MIN_ATTEND_LENGTH` slots and capped at
the cache length. `generate` slices the cache to that window once, runs its decode loop on the
window and writes it back; `append` writes the new keys and values into the full cache and
attends over the window. Slots past the window are masked out in any case, so the numbers are
those of attending over the whole cache.

Compiled shapes (bucketing): `append` compiles once per (batch size, token bucket, window),
`generate` once per (batch size, `SamplingParams.limits()`, window); token buckets are powers
of two from 16 and windows powers of two from `MIN_ATTEND_LENGTH` (256; below that a row's keys
and values are a small part of a call beside the weights), both capped at the cache length
(`sampling_shapes`, which enumerates the closed set of keys they give). The draw settings
(temperature, greedy, top-k, top-p) are data (`SamplingSettings`), so greedy evaluation and
tempered rollouts of the same limits share their programs. The decode loop is one
`lax.while_loop` with no host round-trip per token, stopping early when every row is done. A
`Sampler` given a `precompiled.ProgramSet` compiled for those keys runs its executables
instead of compiling on a call.
"""

import dataclasses
import functools
from typing import Mapping, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import sharding
from bpo_jax.models.config import ModelConfig
from bpo_jax.models.decoder import check_attend_length
from bpo_jax.models.decoder import forward
from bpo_jax.models.decoder import ForwardOptions
from bpo_jax.models.decoder import logprobs_and_entropy_from_logits, stacked_layer_state
from bpo_jax.models.kv_cache import KVCache
from bpo_jax.models import paged
# The bucket rules live beside the enumeration of the shapes they give; callers find them here.
from bpo_jax.sampling_shapes import MIN_ATTEND_LENGTH  # pylint: disable=unused-import
from bpo_jax.sampling_shapes import attend_length_for, bucket_length, pad_token_rows
from bpo_jax.sampling_shapes import ProgramKey


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How tokens are drawn (hashable). The compiled decode loop takes the draw settings
  (temperature, greedy, top-k, top-p: `settings()`) as data and only the limits
  (`max_new_tokens`, `stop_token_ids`: `limits()`) as static arguments, so one program serves
  every temperature, greedy evaluation included.

  Attributes:
    temperature: 0 for greedy (argmax, numbers reported under `softmax(logits)`), else logits
      are divided by it.
    top_p: nucleus mass in (0, 1]; 1 disables it.
    top_k: keep the k most likely tokens; 0 disables it.
    max_new_tokens: most tokens generated per row in one `generate` call.
    stop_token_ids: ids that end a row's generation (the stop token is emitted and cached).
    greedy: argmax tokens at any temperature; the numbers reported are still those of
      `softmax(logits / temperature)` (the greedy-action entropy probe).
  """
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 32
  stop_token_ids: tuple[int, ...] = ()
  greedy: bool = False

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
    if self.max_new_tokens <= 0:
      raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
    object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

  def settings(self) -> "SamplingSettings":
    """The draw settings as arrays (temperature 0 becomes greedy at temperature 1)."""
    greedy = self.greedy or self.temperature == 0
    return SamplingSettings(temperature=np.float32(self.temperature or 1.0),
                            top_p=np.float32(self.top_p), top_k=np.int32(self.top_k),
                            greedy=np.bool_(greedy))

  def limits(self) -> "SamplingParams":
    """These parameters with the default draw settings: the static part of a compiled call."""
    return SamplingParams(max_new_tokens=self.max_new_tokens,
                          stop_token_ids=self.stop_token_ids)


@flax.struct.dataclass
class SamplingSettings:
  """`SamplingParams`' draw settings as (scalar) arrays, data of the compiled decode loop.

  Attributes:
    temperature: float32 > 0; logits are divided by it (1 divides exactly, changing nothing).
    top_p: float32 nucleus mass in (0, 1].
    top_k: int32; 0 (or at least the vocabulary) keeps every token.
    greedy: bool; argmax tokens, the numbers still those of `softmax(logits / temperature)`.
  """
  temperature: jax.Array
  top_p: jax.Array
  top_k: jax.Array
  greedy: jax.Array


@flax.struct.dataclass
class DecodeState:
  """The KV cache of B rows and the logits [B, V] (float32) of each row's next token."""
  cache: KVCache
  next_logits: jax.Array

  @property
  def lengths(self) -> jax.Array:
    return self.cache.lengths

  @property
  def batch_size(self) -> int:
    return self.cache.batch_size


@flax.struct.dataclass
class SampleOutput:
  """What one `generate` call produced, [B, max_new_tokens] unless noted.

  Attributes:
    tokens: int32 token ids (0 where `mask` is False).
    logprobs: float32 log-probabilities of the tokens (0 where `mask` is False).
    entropies: float32 entropies of the distributions they were drawn from.
    mask: bool, True for generated tokens.
    stopped: [B] bool, the row emitted a stop token.
    num_tokens: [B] int32, tokens generated per row.
  """
  tokens: jax.Array
  logprobs: jax.Array
  entropies: jax.Array
  mask: jax.Array
  stopped: jax.Array
  num_tokens: jax.Array


def init_decode_state(config: ModelConfig, batch_size: int, max_length: int,
                      dtype=None) -> DecodeState:
  """Empty rows (length 0) with `max_length` cache slots each."""
  return DecodeState(cache=KVCache.init(config, batch_size, max_length, dtype),
                     next_logits=jnp.zeros((batch_size, config.vocab_size), jnp.float32))


def params_mesh(state) -> Optional[jax.sharding.Mesh]:
  """The mesh of more than one device that the parameters `state` are laid out on, or None
  (one device, or host arrays): where a `Sampler` given them decodes."""
  for leaf in jax.tree.leaves(state):
    layout = getattr(leaf, "sharding", None)
    if isinstance(layout, jax.sharding.NamedSharding) and layout.mesh.size > 1:
      return layout.mesh
  return None


def _on_mesh(out, mesh: jax.sharding.Mesh):
  """A DecodeState / KVCache constrained to the layout of `sharding.cache_shardings`."""
  return jax.lax.with_sharding_constraint(out, sharding.cache_shardings(out, mesh))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _init_on_mesh(config: ModelConfig, batch_size: int, max_length: int,
                  mesh: jax.sharding.Mesh) -> DecodeState:
  return _on_mesh(init_decode_state(config, batch_size, max_length), mesh)


@functools.partial(jax.jit, static_argnums=(2,))
def _take_rows_on_mesh(tree, rows: jax.Array, mesh: jax.sharding.Mesh):
  return _on_mesh(take_rows(tree, rows), mesh)


def take_rows(tree, rows):
  """Rows `rows` of a DecodeState / KVCache / SampleOutput: a gather on the batch axis.

  A DecodeState of a paged cache shares pages instead (`paged.take_rows`: the cache's pages
  copied are at most one per new row); it consumes the state passed in.
  """
  if isinstance(getattr(tree, "cache", None), paged.PagedKVCache):
    return DecodeState(cache=paged.take_rows(tree.cache, rows),
                       next_logits=_take_logits(tree.next_logits, jnp.asarray(rows, jnp.int32)))
  if not isinstance(rows, jax.Array):  # host indices: a transfer, no program per shape
    rows = jax.device_put(np.asarray(rows, np.int32))
  if rows.ndim != 1:
    raise ValueError(f"rows must be a 1-D list of row indices, got shape {rows.shape}")
  return _gather_rows(tree, rows)


@jax.jit
def _gather_rows(tree, rows: jax.Array):
  """Every leaf's rows `rows` (axis 0): one compiled program for the whole state, not one
  eager gather per leaf."""
  return jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0), tree)


@jax.jit
def _take_logits(next_logits: jax.Array, rows: jax.Array) -> jax.Array:
  return jnp.take(next_logits, rows, axis=0)


@functools.partial(jax.jit, donate_argnums=(0,))
def _place_logits(next_logits: jax.Array, source: jax.Array, destination: jax.Array):
  """Rows `source` copied onto rows `destination` (a destination past the batch: no copy)."""
  return next_logits.at[destination].set(next_logits[source], mode="drop")


def fork(tree, rows, k: int):
  """Copies each of `rows` into k consecutive rows: `[r0]*k + [r1]*k + ...`.

  Example: rows `[2, 0]`, k 2 gives a batch of the rows `[2, 2, 0, 0]`.
  """
  if k <= 0:
    raise ValueError(f"k must be positive, got {k}")
  return take_rows(tree, jnp.repeat(jnp.asarray(rows, jnp.int32), k))


def append_tokens(graphdef, state, decode_state: DecodeState, tokens: jax.Array,
                  lengths: jax.Array, attend_length: Optional[int] = None,
                  unembedding: Optional[jax.Array] = None, layer_stack=None,
                  mesh: Optional[jax.sharding.Mesh] = None) -> DecodeState:
  """Continued prefill: appends `tokens[b, :lengths[b]]` to row b (pure; jit it).

  Rows with `lengths[b] == 0` keep their cache length and next logits. The caller keeps
  `decode_state.lengths + lengths <= max_length` (`Sampler.append` checks it).

  `attend_length` (static; None = the cache length) is the number of cache slots attention
  reads; the caller keeps `decode_state.lengths[b] + lengths[b] <= attend_length` for every row
  with `lengths[b] > 0` (`Sampler.append` picks the bucket of the longest such row).
  `unembedding` (optional) is the output projection's [hidden, vocab] kernel, passed on to the
  model (see `Sampler.unembedding`), as is `layer_stack` (`generate`'s stacked layers), in
  `models.ForwardOptions`, with each row's last real token the only step given logits.
  `mesh` (static; the parameters', `params_mesh`): the state returned is laid out by
  `sharding.cache_shardings` there, as `Sampler.init_state` lays it out, so that the next call
  takes it in the layout its program was compiled for (left to propagation, a vocabulary split
  over "tensor" would split the next logits too).
  """
  last = jnp.maximum(lengths - 1, 0)
  options = ForwardOptions(attend_length=attend_length, logits_at=last[:, None],
                           unembedding=unembedding, layer_stack=layer_stack)
  logits, cache = forward(graphdef, state, tokens, cache=decode_state.cache,
                          input_lengths=lengths, options=options)
  last_logits = logits[:, 0]
  next_logits = jnp.where((lengths > 0)[:, None], last_logits, decode_state.next_logits)
  out = DecodeState(cache=cache, next_logits=next_logits)
  return out if mesh is None else _on_mesh(out, mesh)


def prefill_tokens(graphdef, state, config: ModelConfig, max_length: int, tokens: jax.Array,
                   lengths: jax.Array, attend_length: Optional[int] = None,
                   unembedding: Optional[jax.Array] = None,
                   mesh: Optional[jax.sharding.Mesh] = None) -> DecodeState:
  """`append_tokens` on a new, empty DecodeState of `max_length` slots per row (pure; jit it
  with `graphdef`, `config`, `max_length`, `attend_length` and `mesh` static)."""
  empty = init_decode_state(config, tokens.shape[0], max_length)
  return append_tokens(graphdef, state, empty, tokens, lengths, attend_length, unembedding,
                       mesh=mesh)


def is_per_row_key(key: jax.Array) -> bool:
  """Whether `key` holds one PRNG key per row (typed [B] or raw [B, 2]) rather than one key."""
  typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
  return key.ndim == (1 if typed else 2)


def first_index_of_max(values: jax.Array) -> jax.Array:
  """`jnp.argmax(values, axis=-1)` as int32, computed as two plain reductions.

  The first index holding the row maximum, as argmax returns on ties. XLA lowers argmax to a
  reduction over (value, index) pairs that the CPU backend runs about 10× slower than a max
  followed by a min over the indices where the maximum sits (it dominated a decode step's
  sampling at a 32k vocabulary). A row holding a NaN gives its last index (argmax: the NaN's).
  Example: `[[1, 3, 3], [2, 0, 1]]` gives `[1, 0]`.
  """
  size = values.shape[-1]
  row_max = jnp.max(values, axis=-1, keepdims=True)
  indices = jax.lax.broadcasted_iota(jnp.int32, values.shape, values.ndim - 1)
  first = jnp.min(jnp.where(values == row_max, indices, size), axis=-1)
  return jnp.minimum(first, size - 1)


def _draw(key: jax.Array, logits: jax.Array) -> jax.Array:
  """`jax.random.categorical(key, logits)` over the last axis: argmax of logits + Gumbel noise.

  The same noise as `categorical` draws from the same key, so the same tokens, with the argmax
  of `first_index_of_max`.
  """
  return first_index_of_max(logits + jax.random.gumbel(key, logits.shape, logits.dtype))


def _top_k_filter(scaled: jax.Array, k: jax.Array) -> jax.Array:
  """`scaled` [B, V] with every logit below the row's k-th largest set to -inf (k traced)."""
  descending = -jnp.sort(-scaled, axis=-1)
  kth_largest = jax.lax.dynamic_slice_in_dim(descending, k - 1, 1, axis=1)
  return jnp.where(scaled < kth_largest, -jnp.inf, scaled)


def _top_p_filter(filtered: jax.Array, top_p: jax.Array) -> jax.Array:
  """`filtered` [B, V] outside the smallest set of most likely tokens whose mass reaches
  `top_p` set to -inf."""
  descending = -jnp.sort(-filtered, axis=-1)
  probs = jax.nn.softmax(descending, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  # The most likely token always survives (its mass_before is 0).
  threshold = jnp.min(jnp.where(mass_before < top_p, descending, jnp.inf), axis=-1,
                      keepdims=True)
  return jnp.where(filtered < threshold, -jnp.inf, filtered)


def sample_logits(logits: jax.Array, key: jax.Array, params):
  """Draws one token per row of logits [B, V]; returns (tokens, logprobs, entropies).

  `params`: a `SamplingParams` or its `SamplingSettings` (arrays: the same program for every
  temperature). `key` is one key for the batch, or one key per row (`is_per_row_key`): row b is
  then drawn with `key[b]` alone, as `jax.random.categorical(key[b], logits[b])` would.

  Sampling uses `softmax(logits / T)` restricted to the top-k tokens and then to the smallest
  set of most likely tokens whose mass reaches top_p; greedy takes the argmax. The logprob and
  entropy reported are those of the untruncated `softmax(logits / T)` (see
  `logprobs_and_entropy_from_logits`). Each truncation runs (a sort of the vocabulary) only
  when it is on (`lax.cond`).
  """
  s = params.settings() if isinstance(params, SamplingParams) else params
  scaled = logits.astype(jnp.float32) / s.temperature
  vocab = logits.shape[-1]

  def draw():
    filtered = jax.lax.cond((s.top_k > 0) & (s.top_k < vocab),
                            lambda: _top_k_filter(scaled, s.top_k), lambda: scaled)
    filtered = jax.lax.cond(s.top_p < 1.0, lambda: _top_p_filter(filtered, s.top_p),
                            lambda: filtered)
    if is_per_row_key(key):
      return jax.vmap(_draw)(key, filtered)
    return _draw(key, filtered)

  tokens = jax.lax.cond(s.greedy, lambda: first_index_of_max(logits), draw)
  logprobs, entropies = logprobs_and_entropy_from_logits(logits, tokens, s.temperature)
  return tokens, logprobs, entropies


def _loop_cache(graphdef, state, cache, window: int):
  """(the cache `generate`'s loop works on, the stacked layers or None): a dense cache cut to
  the window (a paged cache as it is) and, if the model scans its layers, the model's layers and
  the cache's stacked once rather than at every step (`ForwardOptions.layer_stack`)."""
  if window < cache.max_length and not isinstance(cache, paged.PagedKVCache):
    cache = cache.window(window)
  layer_stack = stacked_layer_state(graphdef, state)
  return (cache, None) if layer_stack is None else (cache.to_stacked(), layer_stack)


def _cache_after_loop(full_cache, loop_cache):
  """The cache `generate` returns: the loop's, per layer, written back into the whole one."""
  if isinstance(full_cache, paged.PagedKVCache):
    return loop_cache
  loop_cache = loop_cache.to_layers()  # a no-op unless stacked
  sliced = loop_cache.max_length < full_cache.max_length
  return full_cache.with_window(loop_cache) if sliced else loop_cache


def _emit_token(step, logits, key, finished, out, *, params: SamplingSettings, keyed_rows: bool,
                stop_ids: jax.Array):
  """Samples decode step `step`'s token of every unfinished row and records it in `out`:
  (tokens [B], emitted [B], the key to carry, out)."""
  if keyed_rows:  # row b's token at step s: fold_in(key[b], s)
    subkey = jax.vmap(jax.random.fold_in, in_axes=(0, None))(key, step)
  else:
    key, subkey = jax.random.split(key)
  tokens, logprobs, entropies = sample_logits(logits, subkey, params)
  emit = ~finished
  tokens = jnp.where(emit, tokens, 0)
  out = dict(
      tokens=out["tokens"].at[:, step].set(tokens),
      logprobs=out["logprobs"].at[:, step].set(jnp.where(emit, logprobs, 0.0)),
      entropies=out["entropies"].at[:, step].set(jnp.where(emit, entropies, 0.0)),
      mask=out["mask"].at[:, step].set(emit),
      stopped=out["stopped"] | (emit & jnp.isin(tokens, stop_ids)),
  )
  return tokens, emit, key, out


def generate(graphdef, state, decode_state: DecodeState, key: jax.Array,
             params: SamplingParams, active: Optional[jax.Array] = None,
             attend_length: Optional[int] = None, keep_state: bool = True,
             unembedding: Optional[jax.Array] = None,
             settings: Optional[SamplingSettings] = None,
             mesh: Optional[jax.sharding.Mesh] = None):
  """Decodes up to `params.max_new_tokens` tokens per active row in one `lax.while_loop`.

  A row stops after emitting a stop token, after `max_new_tokens`, or when its cache is full.
  `key` is one key for the batch or one per row (see "Keys" in the module docstring).
  Pure: jit it with `graphdef`, `params`, `attend_length` and `keep_state` static
  (`Sampler.generate` does, with `params.limits()` and the draw as data in `settings`, which
  replaces `params`' own draw settings when given).

  `attend_length` (None = the cache length) is the window of cache slots the loop works on: it
  slices the cache to the window once, decodes there and writes the window back (a paged cache
  is not sliced: each step reads the window's pages), so each step reads `attend_length` slots
  rather than all of them. A row also stops when it fills the window, so choose it at least
  `max(lengths + max_new_tokens)` over the active rows (capped at the cache length) to get the
  same tokens as with the whole cache; `Sampler.generate` picks the bucket of that.

  `keep_state=False` (callers that drop the state: a probe, a last turn, plain text): the last
  token each row emits is not run through the model, one batch forward fewer (as transformers'
  `generate`), and the state returned is None; the output is the same.

  `unembedding` (optional) is the output projection's [hidden, vocab] kernel for every step
  (see `Sampler.unembedding`). `mesh` (static): the state returned is laid out there as
  `append_tokens` lays it out.

  Returns:
    (decode_state with every emitted token cached, or None without `keep_state`; SampleOutput).
  """
  batch = decode_state.batch_size
  steps = params.max_new_tokens
  full_cache = decode_state.cache
  window = check_attend_length(attend_length, 1, full_cache.max_length)
  loop_cache, layer_stack = _loop_cache(graphdef, state, full_cache, window)
  decode_state = decode_state.replace(cache=loop_cache)
  active = jnp.ones((batch,), bool) if active is None else active
  stop_ids = jnp.asarray(params.stop_token_ids or (-1,), jnp.int32)
  keyed_rows = is_per_row_key(key)
  if keyed_rows and key.shape[0] != batch:
    raise ValueError(f"per-row keys must number {batch} (the batch size), got {key.shape[0]}")

  emit_token = functools.partial(_emit_token, keyed_rows=keyed_rows, stop_ids=stop_ids,
                                 params=params.settings() if settings is None else settings)

  # Without keep_state the loop stops one step early and the last token is emitted after it.
  loop_steps = steps if keep_state else steps - 1

  def cond(carry):
    step, _, _, finished, _ = carry
    return (step < loop_steps) & ~jnp.all(finished)

  def body(carry):
    step, ds, key, finished, out = carry
    tokens, emit, key, out = emit_token(step, ds.next_logits, key, finished, out)
    ds = append_tokens(graphdef, state, ds, tokens[:, None], emit.astype(jnp.int32),
                       attend_length=window, unembedding=unembedding, layer_stack=layer_stack)
    finished = finished | out["stopped"] | (ds.cache.lengths >= window)
    return step + 1, ds, key, finished, out

  out = dict(tokens=jnp.zeros((batch, steps), jnp.int32),
             logprobs=jnp.zeros((batch, steps), jnp.float32),
             entropies=jnp.zeros((batch, steps), jnp.float32),
             mask=jnp.zeros((batch, steps), bool), stopped=jnp.zeros((batch,), bool))
  finished = ~active.astype(bool) | (decode_state.cache.lengths >= window)
  carry = (jnp.int32(0), decode_state, key, finished, out)
  step, decode_state, key, finished, out = jax.lax.while_loop(cond, body, carry)
  if keep_state:
    decode_state = decode_state.replace(cache=_cache_after_loop(full_cache, decode_state.cache))
    if mesh is not None:
      decode_state = _on_mesh(decode_state, mesh)
  else:
    # step < steps here; rows already finished (all of them if the loop ended early) emit
    # nothing.
    _, _, _, out = emit_token(step, decode_state.next_logits, key, finished, out)
    decode_state = None
  return decode_state, SampleOutput(num_tokens=jnp.sum(out["mask"], axis=1, dtype=jnp.int32),
                                    **out)


_append_jit = jax.jit(append_tokens, static_argnums=(0,),
                      static_argnames=("attend_length", "mesh"))
_prefill_jit = jax.jit(prefill_tokens, static_argnums=(0, 2, 3),
                       static_argnames=("attend_length", "mesh"))
_generate_jit = jax.jit(generate, static_argnums=(0, 4),
                        static_argnames=("attend_length", "keep_state", "mesh"))
_transpose_jit = jax.jit(jnp.transpose)
# The same programs taking over the DecodeState's buffers (`Sampler(donate=True)`).
_append_donating = jax.jit(append_tokens, static_argnums=(0,),
                           static_argnames=("attend_length", "mesh"), donate_argnums=(2,))
_generate_donating = jax.jit(generate, static_argnums=(0, 4),
                             static_argnames=("attend_length", "keep_state", "mesh"),
                             donate_argnums=(2,))


def _is_paged(decode_state: DecodeState) -> bool:
  return isinstance(decode_state.cache, paged.PagedKVCache)


def _paged_with_room(decode_state: DecodeState, lengths_after, own: bool = True):
  """(the state with pages for `lengths_after` tokens per row and no host bookkeeping, as a
  compiled call takes it; the bookkeeping). `own=False` works on a copy of the bookkeeping,
  for a call that leaves the input intact."""
  cache = decode_state.cache
  if not own:
    cache = cache.replace(book=cache.book.copy())
  cache = paged.with_room(cache, lengths_after)
  return decode_state.replace(cache=cache.without_book()), cache.book


class Sampler:
  """Host-side driver of the jitted functions for one model structure (`graphdef`).

  Holds no model state and no KV cache: parameters (`state`) and `DecodeState`s go in and out of
  every call, so training can update the parameters between rollouts. The one thing it keeps is
  derived from the parameters and checked against them at every call: a tied model's embedding
  transposed for the output projection on the CPU (`unembedding`).
  """

  def __init__(self, graphdef, config: ModelConfig, max_length: int, donate: bool = False,
               page_size: int = 0, kernel: str = "auto", programs=None, pool_pages: int = 0):
    """`donate`: `append` and `generate` (keeping the state) take over the buffers of the
    DecodeState passed in and write the result into them, so a row set's cache is in memory
    once rather than twice during a call; the caller must not read that DecodeState again
    (the rollout engine replaces it by the result every time).

    `page_size` > 0: the states it makes hold a paged cache (`models.paged`) of pages of that
    many slots, whose forks share pages; 0: the dense cache of `max_length` slots per row.
    A paged state is used linearly: every call that takes one and returns a state consumes
    it, `donate` or not. `kernel`: the paged attention of one-token steps (`paged.KERNELS`).
    `pool_pages` > 0: every paged state's pool holds that many pages per layer, whatever its
    rows, so its programs keep their shapes (0: a batch's dense size, grown when rows need
    more). Paged states are made on one device (no mesh).

    `programs`: a `precompiled.ProgramSet` holding this sampler's `append` and `generate`
    compiled for a closed set of shapes (`ProgramKey`); a call whose shape it holds runs that
    executable, any other compiles as without it (a miss the set counts and logs).
    """
    if page_size < 0:
      raise ValueError(f"page_size must be >= 0 (0 = the dense cache), got {page_size}")
    if pool_pages < 0:
      raise ValueError(f"pool_pages must be >= 0 (0 = a batch's dense size), got {pool_pages}")
    self.graphdef = graphdef
    self.config = config
    self.max_length = max_length
    self.donate = donate
    self.page_size = page_size
    self.kernel = kernel
    self.pool_pages = pool_pages
    self.programs = programs
    self._unembedding = None  # (the embedding array it was made from, its transpose)

  def unembedding(self, state, batch_size: int) -> Optional[jax.Array]:
    """The [hidden, vocab] output-projection kernel the compiled calls on `batch_size` rows use,
    or None (the model's own).

    For a tied model whose parameters live on the CPU, and at least 2 rows: its [vocab, hidden]
    embedding transposed, made once per parameter version (an embedding array other than the
    last one seen makes a new one) and kept for the calls after. XLA's CPU matmul reads a
    [hidden, vocab] right-hand side faster than the embedding contracted over its minor axis
    once there are 2 rows or more (vocabulary 32000, hidden 768: 6.4 against 7.6 ms at 2 rows,
    4.9 against 8.4 at 4, 12.3 against 14.7 at 32), and a decode loop projects once per token;
    a single row is the other way round (2.6 against 2.3 ms). It costs a second copy of the
    embedding. Untied models, single rows and parameters on an accelerator (where the matmul
    reads either layout alike) get None.
    """
    if not self.config.tie_word_embeddings or batch_size < 2:
      return None
    embedding = state["embed"][...]
    if any(device.platform != "cpu" for device in embedding.devices()):
      return None
    if self._unembedding is None or self._unembedding[0] is not embedding:
      self._unembedding = (embedding, _transpose_jit(embedding))
    return self._unembedding[1]

  def init_state(self, batch_size: int, mesh: Optional[jax.sharding.Mesh] = None
                 ) -> DecodeState:
    """Empty rows; on `mesh` (the parameters', `params_mesh`) laid out by
    `sharding.cache_shardings`, made on the devices that hold them."""
    if self.page_size:
      if mesh is not None:
        raise ValueError("a paged KV cache is made on one device; decode on a mesh with the "
                         "dense cache (page size 0)")
      cache = paged.PagedKVCache.init(self.config, batch_size, self.max_length, self.page_size,
                                      self.kernel, num_pages=self.pool_pages or None)
      return DecodeState(cache=cache,
                         next_logits=jnp.zeros((batch_size, self.config.vocab_size), jnp.float32))
    if mesh is None:
      return init_decode_state(self.config, batch_size, self.max_length)
    return _init_on_mesh(self.config, batch_size, self.max_length, mesh)

  def take_rows(self, decode_state: DecodeState, rows: Sequence[int],
                mesh: Optional[jax.sharding.Mesh] = None) -> DecodeState:
    """`take_rows` (fork, drop or reorder rows); on `mesh` one compiled gather whose output
    keeps the cache layout (rows over the batch axes), so the fork stays on the devices."""
    if mesh is None or _is_paged(decode_state):
      return take_rows(decode_state, rows)
    return _take_rows_on_mesh(decode_state, jax.device_put(np.asarray(rows, np.int32)), mesh)

  def _check_tokens(self, tokens: np.ndarray):
    if tokens.size and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
      raise ValueError(f"token ids must be in [0, {self.config.vocab_size}), got range "
                       f"[{tokens.min()}, {tokens.max()}]")

  def prefill(self, state, rows: Sequence[Sequence[int]]) -> DecodeState:
    """A new DecodeState with one row per token list (lists may differ in length).

    The same as `append` on `init_state(len(rows))`, but the empty cache is made inside the
    compiled call rather than passed in (and copied, as an input that is not donated).
    """
    if self.page_size:
      return self.append(state, self.init_state(len(rows)), dict(enumerate(rows)))
    tokens, lengths, window = self._pad_rows(np.zeros((len(rows),), np.int64),
                                             dict(enumerate(rows)), self.max_length)
    return _prefill_jit(self.graphdef, state, self.config, self.max_length,
                        jax.device_put(tokens), jax.device_put(lengths), attend_length=window,
                        unembedding=self.unembedding(state, len(rows)), mesh=params_mesh(state))

  def append(self, state, decode_state: DecodeState,
             rows: Mapping[int, Sequence[int]]) -> DecodeState:
    """Appends `rows[b]` to row b (continued prefill, e.g. an observation); others unchanged."""
    tokens, lengths, window = self._pad_rows(np.asarray(decode_state.lengths), rows,
                                             decode_state.cache.max_length)
    append = _append_donating if self.donate else _append_jit
    book = None
    if _is_paged(decode_state):
      append = _append_donating
      decode_state, book = _paged_with_room(decode_state, decode_state.cache.book.lengths
                                            + lengths)
    # Host arrays moved as they are (`jnp.asarray` would compile a program per shape).
    args = (state, decode_state, jax.device_put(tokens), jax.device_put(lengths))
    kwargs = dict(unembedding=self.unembedding(state, decode_state.batch_size))
    key = ProgramKey("append", decode_state.batch_size, tokens.shape[1], window)
    out = self._run(key, self.donate, decode_state, args, kwargs,
                    functools.partial(append, self.graphdef, attend_length=window,
                                      mesh=params_mesh(state)))
    if book is not None:
      book.lengths = book.lengths + lengths
      out = out.replace(cache=out.cache.replace(book=book))
    return out

  def place(self, decode_state: DecodeState, pairs: Sequence[tuple[int, int]]) -> DecodeState:
    """Row `dst` becomes a copy of row `src` for each (src, dst), the other rows untouched: a
    fork into free slots of a persistent batch (paged cache only; each `dst` released first,
    none a source). The next logits of the rows move in one compiled scatter."""
    if not _is_paged(decode_state):
      raise ValueError("place needs a paged cache (page_size > 0); take_rows forks a dense one")
    pairs = [(int(src), int(dst)) for src, dst in pairs]
    if not pairs:
      return decode_state
    # Padded to the batch (each destination is a distinct row): one program per batch size.
    batch = decode_state.batch_size
    src = [p[0] for p in pairs] + [0] * (batch - len(pairs))
    dst = [p[1] for p in pairs] + [batch] * (batch - len(pairs))
    args = (decode_state.next_logits, jax.device_put(np.asarray(src, np.int32)),
            jax.device_put(np.asarray(dst, np.int32)))
    next_logits = self._run(ProgramKey("place_logits", batch, 0, 0),
                            True, decode_state, args, {}, _place_logits)
    return DecodeState(cache=paged.place(decode_state.cache, pairs), next_logits=next_logits)

  def release(self, decode_state: DecodeState, rows: Sequence[int]) -> DecodeState:
    """Rows emptied and their pages released: free slots (paged cache only)."""
    if not _is_paged(decode_state):
      raise ValueError("release needs a paged cache (page_size > 0)")
    return decode_state.replace(cache=paged.release(decode_state.cache, rows))

  def truncate(self, decode_state: DecodeState, lengths: Mapping[int, int]) -> DecodeState:
    """Rows cut back to `lengths[row]` tokens (their next logits stay; append the last token
    again to recompute them). A paged cache first copies a shared last page (`paged.truncate`)."""
    if _is_paged(decode_state):
      return decode_state.replace(cache=paged.truncate(decode_state.cache, dict(lengths)))
    cut = np.asarray(decode_state.cache.lengths).copy()
    for row, length in lengths.items():
      cut[row] = length
    return decode_state.replace(cache=decode_state.cache.replace(
        lengths=jnp.asarray(cut, jnp.int32)))

  def _pad_rows(self, lengths_now: np.ndarray, rows: Mapping[int, Sequence[int]],
                cache_length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(tokens [B, T], lengths [B], attention window) for appending `rows` to rows of
    `lengths_now` tokens; checks the row indices, the token ids and the cache's room."""
    batch = len(lengths_now)
    lists = [[] for _ in range(batch)]
    for b, row_tokens in rows.items():
      if not 0 <= b < batch:
        raise ValueError(f"row {b} is out of range for a batch of {batch}")
      lists[b] = list(row_tokens)
    added = np.asarray([len(r) for r in lists])
    over = np.nonzero(lengths_now + added > self.max_length)[0]
    if over.size:
      raise ValueError(f"rows {over.tolist()} would exceed the cache length {self.max_length} "
                       f"(have {lengths_now[over].tolist()}, adding {added[over].tolist()})")
    tokens, lengths = pad_token_rows(lists, maximum=self.max_length)
    self._check_tokens(tokens)
    window = attend_length_for((lengths_now + added)[added > 0], cache_length)
    return tokens, lengths, max(window, tokens.shape[1])

  def generate(self, state, decode_state: DecodeState, key: jax.Array, params: SamplingParams,
               active: Optional[Sequence[bool]] = None, keep_state: bool = True):
    """Decodes every active row; returns (DecodeState, SampleOutput).

    With `keep_state=False` the DecodeState returned is None and the last emitted token of
    each row is not run through the model (see `generate`).
    """
    lengths = np.asarray(decode_state.lengths)
    emitting = np.ones(lengths.shape, bool)
    if active is not None:
      emitting = np.asarray(active, bool)
      if emitting.shape != lengths.shape:
        raise ValueError(f"active must have shape ({decode_state.batch_size},), got "
                         f"{emitting.shape}")
      active = jax.device_put(emitting)
    window = attend_length_for(lengths[emitting] + params.max_new_tokens,
                               decode_state.cache.max_length)
    run = _generate_donating if self.donate and keep_state else _generate_jit
    book = None
    if _is_paged(decode_state):
      # Room for every token the call may emit; `paged.settle` releases what it did not use. A
      # probe (no state kept) works on a copy of the bookkeeping and leaves the input intact.
      run = _generate_donating if keep_state else _generate_jit
      after = np.where(emitting, lengths + params.max_new_tokens, lengths)
      decode_state, book = _paged_with_room(decode_state, after, keep_state)
    program = ProgramKey("generate", decode_state.batch_size, 0, window, keep_state)
    mesh = params_mesh(state)
    kwargs = dict(active=active, unembedding=self.unembedding(state, decode_state.batch_size),
                  settings=params.settings())
    # The set holds the engine's decode loops: donating when they keep the state, with rows
    # marked active, at the engine's limits.
    eligible = (active is not None and (self.donate or not keep_state)
                and getattr(self.programs, "limits", None) == params.limits())
    out_state, out = self._run(
        program, eligible, decode_state, (state, decode_state, key), kwargs,
        lambda s, ds, k, **rest: run(self.graphdef, s, ds, k, params.limits(),
                                     attend_length=window, keep_state=keep_state, mesh=mesh,
                                     **rest))
    if book is not None and keep_state:
      out_state = out_state.replace(cache=paged.settle(out_state.cache.replace(book=book)))
    return out_state, out

  def _run(self, key: ProgramKey, eligible: bool, decode_state: DecodeState, args: tuple,
           kwargs: dict, compile_on_call):
    """`compile_on_call(*args, **kwargs)`, or the executable `self.programs` holds for `key`
    (calls in the programs' calling convention: `eligible`). A paged `decode_state` whose pool
    is not the sampler's fixed `pool_pages` (it grew past them) has other shapes than the
    set's programs: a miss, counted as one."""
    if self.programs is None or not eligible:
      return compile_on_call(*args, **kwargs)
    if _is_paged(decode_state) and decode_state.cache.num_pages != self.pool_pages:
      self.programs.miss(key, "runs on a paged pool of another size than the set's")
      return compile_on_call(*args, **kwargs)
    return self.programs.run(key, args, kwargs, compile_on_call)

  def lower_generate(self, state, decode_state: DecodeState, key, params: SamplingParams,
                     active, keep_state: bool = True):
    """`generate`'s jitted function lowered for abstract arguments (`jax.ShapeDtypeStruct`s,
    with shardings where they are laid out on a mesh), attending to the whole cache (the
    largest window `generate` picks) and with the model's own output projection (what an
    accelerator runs): the program a dry run compiles. Returns a `jax.stages.Lowered`."""
    return _generate_jit.lower(self.graphdef, state, decode_state, key, params.limits(), active,
                               attend_length=None, keep_state=keep_state, unembedding=None,
                               settings=params.settings(), mesh=params_mesh(state))
