"""A paged KV cache: per-layer pools of fixed-size pages and a page table per row.

Layout. Keys live in one pool of L·P pages of `page_size` slots, [num_kv_heads, L·P,
page_size, head_dim] (the layout of the Pallas paged-attention ops), values in another: layer
i's page p is pool page `i·P + p`, so a page id names the same P pages in every layer and one
page table serves them all. Row b's slot s (token position s) is slot `s % page_size` of page
`page_table[b, s // page_size]`. Page 0 is the null page: it is never allocated, unallocated
table entries point at it, nothing is ever written to it, and the attention mask hides whatever
a row reads there.

One pool for all layers is what lets a scanned layer stack (`ModelConfig.scan_layers`) carry
the cache: step i reads and writes its layer's pages by offsetting the table by i·P (a traced
offset), with no slice or copy of a layer's pool, and the Pallas op takes the whole pool too.

Bookkeeping (`PageBook`, on the host, numpy): the page table, how many pages each row holds
(always `ceil(length / page_size)` after a sampler call), each row's length, a reference count
per page (the rows whose table holds it) and a free list. A page is free when its count is 0.

Forks share pages. `take_rows(rows)` (a fork when rows repeat) gives each new row its source's
table entries and raises their counts; only a source's last, partly filled page is copied, once
per further occurrence of that source (copy on write: a row writes only into its last page and
pages past it, so that page must be its own, and a full page is never written again). A fork's
device work is therefore at most one page per new row plus the rows' small per-row data (table
row, length), whatever the prefix length; `PageBook.stats` counts it. Rows dropped release
their pages.

What a tree's cache holds: every full page is shared by all rows that reach it, so a token is
stored once, except the tokens of a copied last page (fewer than `page_size` per copy). With L
rows, pages in use ≤ ceil((distinct tokens + tokens of copied pages) / page_size) + L.

Attention over pages (`attend_pages` in the decoder): the portable implementation gathers the
attended pages of each row by its table into a dense window and runs masked attention; it runs
everywhere and is the reference. `kernel="auto"` picks, for one-token decode steps on a GPU, the
Pallas paged-attention op of the installed jax (`jax.experimental.pallas.ops.gpu.
paged_attention`); `"pallas_interpret"` runs that op in Pallas interpret mode (any platform, for
tests). TPU runs the portable path: the TPU op is not wired here.

Ownership: a paged cache is used linearly. Every sampler call that takes it hands its pool and
its bookkeeping to the result; the input must not be used again (the `Sampler` donates it).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

NULL_PAGE = 0
KERNELS = ("auto", "portable", "pallas_interpret")


class PageBook:
  """Host bookkeeping of a `PagedKVCache`'s pages (see the module docstring).

  Attributes:
    table: [B, pages_per_row] int32 page ids (`NULL_PAGE` where unallocated).
    held: [B] pages row b holds (its table's first `held[b]` entries).
    lengths: [B] tokens per row, as the device holds them after the last call.
    counts: [P] reference counts (the null page's is pinned at 1).
    stats: counters of device work: `pages_copied` and `kv_bytes_copied` (copy on write),
      `row_bytes_moved` (per-row data written by `take_rows`: table rows and lengths),
      `pool_growths` and `growth_bytes`.
  """

  def __init__(self, batch: int, pages_per_row: int, page_size: int, num_pages: int,
               page_bytes: int):
    self.page_size = page_size
    self.table = np.zeros((batch, pages_per_row), np.int32)
    self.held = np.zeros((batch,), np.int64)
    self.lengths = np.zeros((batch,), np.int64)
    self.counts = np.zeros((0,), np.int32)
    self.free: list[int] = []
    self.page_bytes = page_bytes
    self.stats = dict(pages_copied=0, kv_bytes_copied=0, row_bytes_moved=0, pool_growths=0,
                      growth_bytes=0)
    self.add_pages(num_pages)
    self.free.remove(NULL_PAGE)
    self.counts[NULL_PAGE] = 1

  @property
  def num_pages(self) -> int:
    return len(self.counts)

  def pages_in_use(self) -> int:
    """Pages some row holds (the null page not counted)."""
    return int(np.count_nonzero(self.counts)) - 1

  def add_pages(self, count: int) -> None:
    """Makes room for `count` more pages (ids after the current ones), all free."""
    start = len(self.counts)
    self.counts = np.concatenate([self.counts, np.zeros((count,), np.int32)])
    # A stack whose top is the lowest free id: allocation order is deterministic.
    self.free = list(range(start + count - 1, start - 1, -1)) + self.free

  def pages_short(self, lengths_after: np.ndarray) -> int:
    """How many pages are missing to give every row room for `lengths_after` tokens."""
    need = -(-np.asarray(lengths_after, np.int64) // self.page_size) - self.held
    return max(int(np.maximum(need, 0).sum()) - len(self.free), 0)

  def copies_for(self, rows: np.ndarray) -> int:
    """Pages `take(rows)` copies: one per repeat of a source whose last page is partly filled."""
    rows = np.asarray(rows, np.int64)
    partial = self.lengths[rows] % self.page_size != 0
    _, first = np.unique(rows, return_index=True)
    return int(partial.sum()) - int(partial[first].sum())

  def reserve(self, lengths_after: np.ndarray) -> None:
    """Allocates pages so that row b can hold `lengths_after[b]` tokens (call `pages_short`
    first and grow the pool by what it says)."""
    need = -(-np.asarray(lengths_after, np.int64) // self.page_size)
    for b in np.nonzero(need > self.held)[0]:
      for j in range(int(self.held[b]), int(need[b])):
        page = self.free.pop()
        self.counts[page] = 1
        self.table[b, j] = page
      self.held[b] = need[b]

  def trim(self, lengths: np.ndarray) -> None:
    """Row lengths after a call; releases each row's pages past `ceil(length / page_size)`."""
    self.lengths = np.asarray(lengths, np.int64).copy()
    keep = -(-self.lengths // self.page_size)
    for b in np.nonzero(self.held > keep)[0]:
      self._release(self.table[b, keep[b]:self.held[b]])
      self.table[b, keep[b]:] = NULL_PAGE
      self.held[b] = keep[b]

  def _release(self, pages: np.ndarray) -> None:
    """Drops one reference to each of `pages` (distinct); pages left without one are free."""
    self.counts[pages] -= 1
    self.free.extend(pages[self.counts[pages] == 0].tolist())

  def take(self, rows: np.ndarray) -> tuple[list[int], list[int]]:
    """Row i of the result is a copy of row `rows[i]` (rows may repeat or be left out).

    Full pages are shared; a source's partly filled last page goes to its first occurrence and
    is copied for each later one. Returns the (source, destination) pages to copy. Counts
    change only for the pages of repeated rows (one reference more per repeat) and of rows left
    out (released), as whole-array steps on the host.
    """
    rows = np.asarray(rows, np.int64)
    table, held, lengths = self.table[rows], self.held[rows], self.lengths[rows]
    partial = lengths % self.page_size != 0
    repeat = np.ones(len(rows), bool)
    repeat[np.unique(rows, return_index=True)[1]] = False
    copied = np.nonzero(repeat & partial)[0]
    source = table[copied, held[copied] - 1].tolist()
    destination = [self.free.pop() for _ in copied]
    for i in np.nonzero(repeat)[0]:
      self.counts[table[i, :held[i] - int(partial[i])]] += 1
    table[copied, held[copied] - 1] = destination
    self.counts[destination] = 1
    for r in np.setdiff1d(np.arange(len(self.held)), rows):
      self._release(self.table[r, :self.held[r]])
    self.table, self.held, self.lengths = table, held, lengths
    self.stats["pages_copied"] += len(destination)
    self.stats["kv_bytes_copied"] += len(destination) * self.page_bytes
    self.stats["row_bytes_moved"] += table.nbytes + len(rows) * 4
    return source, destination

  def place(self, pairs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Row `dst` becomes a copy of row `src` for each (src, dst) pair, in place (a fork into
    free slots of the batch): full pages shared, a partly filled last page copied. Each `dst`
    must hold no pages (`release` it first) and be no pair's source. Returns the (source,
    destination) pages to copy."""
    source, destination = [], []
    for src, dst in pairs:
      if self.held[dst]:
        raise ValueError(f"row {dst} still holds pages; release it before placing a row there")
      n, partial = int(self.held[src]), int(self.lengths[src] % self.page_size != 0)
      shared = self.table[src, :n - partial]
      self.counts[shared] += 1
      self.table[dst, :n - partial] = shared
      if partial:
        source.append(int(self.table[src, n - 1]))
        destination.append(self.free.pop())
        self.table[dst, n - 1] = destination[-1]
        self.counts[destination[-1]] = 1
      self.held[dst], self.lengths[dst] = n, self.lengths[src]
    self.stats["pages_copied"] += len(destination)
    self.stats["kv_bytes_copied"] += len(destination) * self.page_bytes
    self.stats["row_bytes_moved"] += len(pairs) * (self.table.shape[1] + 1) * 4
    return source, destination

  def release(self, rows) -> None:
    """Rows emptied (length 0), their pages released."""
    for r in rows:
      self._release(self.table[r, :self.held[r]])
      self.table[r], self.held[r], self.lengths[r] = NULL_PAGE, 0, 0

  def truncate(self, row: int, length: int) -> tuple[list[int], list[int]]:
    """Row `row` cut back to its first `length` tokens: pages past them released, and its new
    last page, if partly filled and shared, replaced by a copy (the row writes there next).
    Returns the (source, destination) pages to copy."""
    if not 0 <= length <= self.lengths[row]:
      raise ValueError(f"row {row} holds {self.lengths[row]} tokens; cannot cut it to {length}")
    keep = -(-length // self.page_size)
    self._release(self.table[row, keep:self.held[row]])
    self.table[row, keep:] = NULL_PAGE
    self.held[row], self.lengths[row] = keep, length
    last = self.table[row, keep - 1] if keep else NULL_PAGE
    if length % self.page_size == 0 or self.counts[last] == 1:
      return [], []
    new = self.free.pop()
    self.counts[last] -= 1
    self.counts[new] = 1
    self.table[row, keep - 1] = new
    self.stats["pages_copied"] += 1
    self.stats["kv_bytes_copied"] += self.page_bytes
    return [int(last)], [new]

  def copy(self) -> "PageBook":
    """An independent copy (for a call whose result is dropped)."""
    book = object.__new__(PageBook)
    book.__dict__.update({k: (v.copy() if hasattr(v, "copy") else v)
                          for k, v in self.__dict__.items()})
    return book


@flax.struct.dataclass
class PagedKVCache:
  """Keys and values of B rows in per-layer page pools (see the module docstring).

  Attributes:
    keys: [num_kv_heads, L·P, page_size, head_dim], the pool of every layer's keys (after
      RoPE): layer i's page p is page `i·P + p`.
    values: the values' pool, of the same shape.
    page_table: [B, pages_per_row] int32, the device copy of `book.table`.
    lengths: [B] int32, number of valid slots of each row.
    max_length: (static) slots per row, at most `pages_per_row * page_size`.
    num_layers: (static) L.
    kernel: (static) the attention of one-token steps: one of `KERNELS`.
    dtype: (static) the keys' and values' dtype; the pools hold `storage_dtype(dtype)`.
    book: (static) the host `PageBook`; None inside compiled calls (`without_book`).
  """
  keys: jax.Array
  values: jax.Array
  page_table: jax.Array
  lengths: jax.Array
  max_length: int = flax.struct.field(pytree_node=False, default=0)
  num_layers: int = flax.struct.field(pytree_node=False, default=1)
  kernel: str = flax.struct.field(pytree_node=False, default="portable")
  dtype: str = flax.struct.field(pytree_node=False, default="float32")
  book: Optional[PageBook] = flax.struct.field(pytree_node=False, default=None)

  @classmethod
  def init(cls, config, batch_size: int, max_length: int, page_size: int, kernel: str = "auto",
           dtype=None, num_pages: Optional[int] = None) -> "PagedKVCache":
    """Empty rows; the pool holds `num_pages` pages per layer (the null page included), by
    default `batch_size * pages_per_row` plus the null page (the dense cache's size), and grows
    when rows need more."""
    if batch_size <= 0 or max_length <= 0 or page_size <= 0:
      raise ValueError(f"batch_size, max_length and page_size must be positive, got "
                       f"{batch_size}, {max_length}, {page_size}")
    if kernel not in KERNELS:
      raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    dtype = jnp.dtype(dtype or config.compute_dtype)
    pages_per_row = -(-max_length // page_size)
    if num_pages is None:
      num_pages = batch_size * pages_per_row + 1
    if num_pages < 2:
      raise ValueError(f"a pool needs the null page and at least one more, got {num_pages}")
    page_bytes = 2 * config.num_layers * config.num_kv_heads * page_size * config.head_dim
    book = PageBook(batch_size, pages_per_row, page_size, num_pages, page_bytes * dtype.itemsize)
    shape = (config.num_kv_heads, config.num_layers * num_pages, page_size, config.head_dim)
    zeros = lambda: jnp.zeros(shape, storage_dtype(dtype))
    return cls(keys=zeros(), values=zeros(), page_table=_to_device(book.table),
               lengths=jnp.zeros((batch_size,), jnp.int32), max_length=max_length,
               num_layers=config.num_layers, kernel=kernel, dtype=dtype.name, book=book)

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  @property
  def page_size(self) -> int:
    return self.keys.shape[2]

  @property
  def num_pages(self) -> int:
    """P, the pages of one layer (the pool holds L·P)."""
    return self.keys.shape[1] // self.num_layers

  def attend_span(self, attend_length: int) -> int:
    """Slots attention reads for a window of `attend_length`: whole pages."""
    return -(-attend_length // self.page_size) * self.page_size

  def copy_slots(self, copies: int) -> int:
    """The length a call's list of `copies` page copies is padded to: the most rows the pool
    holds (⌊(P − 1) / (pages per row + 1)⌋, `training.translate.kv_pool_pages` inverted), at
    least one copy per row a fork makes, so a pool of one size copies with one program; a
    power of two past that."""
    rows = (self.num_pages - 1) // (self.page_table.shape[1] + 1)
    return max(rows, 1) if copies <= rows else 1 << (copies - 1).bit_length()

  def without_book(self) -> "PagedKVCache":
    return self.replace(book=None)

  def layer(self, i, write_slots: jax.Array, input_lengths: Optional[jax.Array],
            span: int) -> "PagedLayer":
    """Layer i's view (i an int or a traced int32): the pools, the pool pages its new tokens
    go to and the pool pages a window of `span` slots reads (the table offset by i·P).

    Tokens past a row's `input_lengths` and slots past `max_length` are not written (their page
    is L·P, out of range, and the write drops them).
    """
    ps, (b, t) = self.page_size, write_slots.shape
    offset = i * self.num_pages
    index = jnp.minimum(write_slots // ps, self.page_table.shape[1] - 1)
    pages = jnp.take_along_axis(self.page_table, index, axis=1) + offset
    real = write_slots < self.max_length
    if input_lengths is not None:
      real &= jnp.arange(t)[None, :] < input_lengths[:, None]
    pages = jnp.where(real, pages, self.keys.shape[1])
    return PagedLayer(keys=self.keys, values=self.values,
                      table=self.page_table[:, :span // ps] + offset, write_pages=pages,
                      write_offsets=write_slots % ps, kernel=self.kernel, dtype=self.dtype)

  def layer_in_scan(self, keys, values, i, write_slots, input_lengths, span) -> "PagedLayer":
    """Layer i's view of the pools `keys`, `values` that a scan over the layers carries."""
    return self.replace(keys=keys, values=values).layer(i, write_slots, input_lengths, span)

  def to_stacked(self) -> "PagedKVCache":
    """Itself: its pools already hold every layer (what a scanned layer stack carries)."""
    return self

  def with_layer(self, i: int, keys_values: tuple) -> "PagedKVCache":
    """The cache after layer i wrote its tokens: the pools that layer returned."""
    del i
    return self.replace(keys=keys_values[0], values=keys_values[1])


class PagedLayer(NamedTuple):
  """One layer's view of a `PagedKVCache` during a forward call.

  keys, values: the pools (every layer's); table: [B, n] the pool pages attention reads, in slot
  order; write_pages, write_offsets: [B, T] where each new token's key and value go (a page
  past the pool: dropped);
  kernel: one of `KERNELS`; dtype: the values' dtype (the pools may store their bits,
  `storage_dtype`).
  """
  keys: jax.Array
  values: jax.Array
  table: jax.Array
  write_pages: jax.Array
  write_offsets: jax.Array
  kernel: str
  dtype: str


def storage_dtype(dtype) -> jnp.dtype:
  """The dtype pools of `dtype` values are stored in: uint16 bits for a 2-byte float on the
  CPU, else `dtype`.

  XLA's CPU backend runs a gather or scatter on a bfloat16 array by converting the whole array
  to float32 and back (and a bitcast of the whole pool is a copy too), which would make moving
  a few pages cost the whole pool; on integers it moves only those pages. The values gathered
  or written are bitcast, a window or the new tokens only.
  """
  dtype = jnp.dtype(dtype)
  if dtype.itemsize == 2 and jnp.issubdtype(dtype, jnp.floating) and (
      jax.default_backend() == "cpu"):
    return jnp.dtype(jnp.uint16)
  return dtype


def _stored(x: jax.Array, pool: jax.Array, dtype) -> jax.Array:
  """Values x in `dtype`, as the pool stores them."""
  x = x.astype(dtype)
  return x if pool.dtype == x.dtype else jax.lax.bitcast_convert_type(x, pool.dtype)


def _loaded(x: jax.Array, dtype) -> jax.Array:
  """Stored values x back in `dtype`."""
  return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


def write(layer: PagedLayer, k: jax.Array, v: jax.Array) -> PagedLayer:
  """The layer with the new keys and values k, v [B, T, Hkv, D] written to their slots."""
  def put(pool, x):
    new = _stored(x.transpose(2, 0, 1, 3), pool, layer.dtype)
    return pool.at[:, layer.write_pages, layer.write_offsets].set(new, mode="drop")
  return layer._replace(keys=put(layer.keys, k), values=put(layer.values, v))


def gather_window(layer: PagedLayer) -> tuple[jax.Array, jax.Array]:
  """The attended pages of each row as a dense window: keys [B, Hkv, D, S'] and values
  [B, Hkv, S', D] (S' = pages read · page_size), the dense cache's layouts."""
  k = _loaded(layer.keys[:, layer.table], layer.dtype)  # [Hkv, B, n, page, D]
  v = _loaded(layer.values[:, layer.table], layer.dtype)
  hkv, b, n, ps, d = k.shape
  return (k.transpose(1, 0, 4, 2, 3).reshape(b, hkv, d, n * ps),
          v.transpose(1, 0, 2, 3, 4).reshape(b, hkv, n * ps, d))


def uses_kernel(layer: PagedLayer, num_queries: int) -> bool:
  """Whether a call of `num_queries` new tokens per row attends with a Pallas kernel."""
  if num_queries != 1 or layer.kernel == "portable":
    return False
  return layer.kernel == "pallas_interpret" or jax.default_backend() == "gpu"


def _largest_power_of_two_dividing(n: int, at_most: int) -> int:
  size = 1
  while size * 2 <= at_most and n % (size * 2) == 0:
    size *= 2
  return size


def kernel_attend(q: jax.Array, layer: PagedLayer, lengths: jax.Array) -> jax.Array:
  """Decode-step attention by the Pallas GPU paged-attention op: q [B, Hkv, G, 1, D] (one
  query per row, its token already written) gives [B, Hkv, G, 1, D], row b attending to its
  slots `< lengths[b]`. The op takes no scale, so queries are multiplied by 1/√D first."""
  from jax.experimental.pallas.ops.gpu import paged_attention as pallas_paged

  b, hkv, g, _, d = q.shape
  n = layer.table.shape[1]
  splits = _largest_power_of_two_dividing(n, 16)
  per_block = _largest_power_of_two_dividing(n // splits, 8)
  scaled = (q.reshape(b, hkv * g, d) * np.float32(1 / math.sqrt(d))).astype(q.dtype)
  keys, values = (_loaded(pool, layer.dtype).astype(q.dtype)
                  for pool in (layer.keys, layer.values))
  out = pallas_paged.paged_attention(
      scaled, keys, values, layer.table,
      lengths.astype(jnp.int32), k_splits=splits, pages_per_compute_block=per_block,
      interpret=layer.kernel == "pallas_interpret")
  return out.reshape(b, hkv, g, 1, d)


def _to_device(host) -> jax.Array:
  """Host integers as a device int32 array, by a transfer of a copy (`jnp.asarray` would run
  a small compiled program per shape, and the host arrays change after the call)."""
  return jax.device_put(np.array(host, np.int32))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _grow_pools(pools, extra: int, num_layers: int):
  """The pools with `extra` zero pages after each layer's P pages (a new, larger buffer:
  nothing to donate)."""
  def grow(p):
    h, total, ps, d = p.shape
    p = p.reshape(h, num_layers, total // num_layers, ps, d)
    return jnp.pad(p, ((0, 0), (0, 0), (0, extra), (0, 0), (0, 0))).reshape(h, -1, ps, d)
  return jax.tree.map(grow, pools)


@functools.partial(jax.jit, static_argnums=(3,), donate_argnums=(0,))
def _copy_pages(pools, source: jax.Array, destination: jax.Array, num_layers: int):
  """Pages `source` copied onto pages `destination` in every layer of every pool (destination
  P: no copy)."""
  def copy(p):
    per_layer = p.shape[1] // num_layers
    shift = (jnp.arange(num_layers, dtype=jnp.int32) * per_layer)[:, None]
    src = (source[None, :] + shift).reshape(-1)
    dst = jnp.where(destination[None, :] < per_layer, destination[None, :] + shift, p.shape[1])
    return p.at[:, dst.reshape(-1)].set(p[:, src], mode="drop")
  return jax.tree.map(copy, pools)


def _grown(cache: PagedKVCache, short: int) -> PagedKVCache:
  """The cache with at least `short` more free pages: the pool doubles (or grows by `short`),
  a copy of the pool counted in `stats`; the input's pools are left intact."""
  extra = max(short, cache.num_pages)
  keys, values = _grow_pools((cache.keys, cache.values), extra, cache.num_layers)
  book = cache.book
  book.add_pages(extra)
  book.stats["pool_growths"] += 1
  book.stats["growth_bytes"] += cache.num_pages * book.page_bytes
  return cache.replace(keys=keys, values=values)


def with_room(cache: PagedKVCache, lengths_after) -> PagedKVCache:
  """The cache with pages allocated so that row b can hold `lengths_after[b]` tokens (capped
  at `max_length`), the device page table updated. The input's pools are not written (a
  growing pool is a new buffer), so a call whose result is dropped may use a copy of the book."""
  lengths_after = np.minimum(np.asarray(lengths_after, np.int64), cache.max_length)
  short = cache.book.pages_short(lengths_after)
  if short:
    cache = _grown(cache, short)
  cache.book.reserve(lengths_after)
  return cache.replace(page_table=_to_device(cache.book.table))


def settle(cache: PagedKVCache) -> PagedKVCache:
  """After a call whose row lengths the host did not know in advance (a decode loop): reads
  them and releases the pages past each row's last token."""
  cache.book.trim(np.asarray(cache.lengths))
  return cache.replace(page_table=_to_device(cache.book.table))


def _with_copies(cache: PagedKVCache, source: list[int], destination: list[int]) -> PagedKVCache:
  """The pools with pages `source` copied onto `destination` (padded to `copy_slots`, so the
  copy compiles once per pool size), the device page table and lengths from the book."""
  keys, values = cache.keys, cache.values
  if source:
    pad = cache.copy_slots(len(source)) - len(source)
    keys, values = _copy_pages(
        (keys, values), _to_device(source + [NULL_PAGE] * pad),
        _to_device(destination + [cache.num_pages] * pad), cache.num_layers)
  return cache.replace(keys=keys, values=values, page_table=_to_device(cache.book.table),
                       lengths=_to_device(cache.book.lengths))


def truncate(cache: PagedKVCache, lengths: dict[int, int]) -> PagedKVCache:
  """Rows cut back to `lengths[row]` tokens (`PageBook.truncate`), e.g. to recompute a state's
  logits by appending its last token again."""
  if len(cache.book.free) < len(lengths):
    cache = _grown(cache, len(lengths))
  source, destination = [], []
  for row, length in lengths.items():
    copied = cache.book.truncate(int(row), int(length))
    source += copied[0]
    destination += copied[1]
  return _with_copies(cache, source, destination)


def take_rows(cache: PagedKVCache, rows) -> PagedKVCache:
  """Rows `rows` of the cache (rows may repeat: a fork), sharing pages; see `PageBook.take`.

  The device work is the copied last pages and the new page table and lengths.
  """
  rows = np.asarray(rows, np.int64)
  if rows.ndim != 1 or not len(rows):
    raise ValueError(f"rows must be a non-empty 1-D list of row indices, got shape {rows.shape}")
  if rows.min() < 0 or rows.max() >= cache.batch_size:
    raise ValueError(f"rows must be in [0, {cache.batch_size}), got {rows.tolist()}")
  short = cache.book.copies_for(rows) - len(cache.book.free)
  if short > 0:
    cache = _grown(cache, short)
  source, destination = cache.book.take(rows)
  return _with_copies(cache, source, destination)


def place(cache: PagedKVCache, pairs: list[tuple[int, int]]) -> PagedKVCache:
  """Rows copied into other rows of the same batch (`PageBook.place`): a fork into free slots,
  the rest of the batch untouched."""
  partial = sum(int(cache.book.lengths[src] % cache.page_size != 0) for src, _ in pairs)
  if partial > len(cache.book.free):
    cache = _grown(cache, partial - len(cache.book.free))
  source, destination = cache.book.place(pairs)
  return _with_copies(cache, source, destination)


def release(cache: PagedKVCache, rows) -> PagedKVCache:
  """Rows emptied, their pages released (`PageBook.release`): free slots of the batch."""
  cache.book.release([int(r) for r in rows])
  return _with_copies(cache, [], [])
