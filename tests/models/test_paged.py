"""The paged KV cache: forks that share pages, the pages a tree holds, paged against dense
sampling, the Pallas paged-attention op against the portable attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bpo_jax import sampling
from bpo_jax.models import Decoder
from bpo_jax.models import ModelConfig
from bpo_jax.models import paged
from bpo_jax.models.decoder import attend
from bpo_jax.sampling import SamplingParams
from bpo_jax.testing.model_rounding import forward_roundings, sum_roundings
from bpo_jax.testing.tolerance import assert_close

# On a GPU the Pallas op itself ("auto") runs too, beside its interpret mode.
GPU_KERNELS = ["auto"] if jax.default_backend() == "gpu" else []
VOCAB = 61
MAX_LENGTH = 60
PAGE = 4


@pytest.fixture(scope="module")
def policy():
  """A tiny float32 decoder, random weights scaled up so its distributions are not flat."""
  config = ModelConfig.tiny(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                            num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
  model = Decoder(config, rngs=nnx.Rngs(0))
  model.embed[...] = model.embed[...] * 30.0
  graphdef, state = nnx.split(model)
  return config, graphdef, state


def _cache_config():
  return ModelConfig.tiny(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2,
                          num_heads=2, num_kv_heads=1, head_dim=4)


def _filled(lengths, page_size=16, max_length=4160):
  """A paged cache whose rows hold `lengths` tokens, each slot's key its page id (so copies
  and shares can be read back)."""
  cache = paged.PagedKVCache.init(_cache_config(), len(lengths), max_length, page_size,
                                  kernel="portable")
  cache = paged.with_room(cache, lengths)
  cache.book.trim(np.asarray(lengths))
  ids = jnp.tile(jnp.arange(cache.num_pages, dtype=jnp.float32), cache.num_layers)
  keys = jnp.broadcast_to(ids[None, :, None, None], cache.keys.shape)
  return cache.replace(keys=keys, lengths=jnp.asarray(lengths, jnp.int32))


def _pages(cache, pages):
  """Pages `pages` of every layer of the keys' pool (its first head): pool pages l·P + page,
  [L, len(pages), page_size, head_dim]."""
  pages = np.atleast_1d(np.asarray(pages))
  shift = np.arange(cache.num_layers)[:, None] * cache.num_pages
  return np.asarray(cache.keys[0, shift + pages[None, :]])


@pytest.mark.parametrize("offset", [0, 5])
def test_a_forks_work_does_not_depend_on_the_prefix_length(offset):
  # K = 4 siblings of row 0 (and row 1 kept): the pages copied (the last page when it is partly
  # filled, once per sibling after the first) and the bytes moved are the same at prefix 128
  # and 4096; every full page is shared, not copied.
  work = []
  for prefix in (128 + offset, 4096 + offset):
    cache = _filled([prefix, 7])
    before = dict(cache.book.stats)
    forked = paged.take_rows(cache, [0, 0, 0, 0, 1])
    book = forked.book
    work.append({k: book.stats[k] - before[k] for k in book.stats})
    full = prefix // 16
    table = book.table
    assert (table[1:4, :full] == table[0, :full]).all()  # shared, in place
    assert (book.counts[table[0, :full]] == 4).all()
    if offset:
      last = table[:4, full]
      assert len(set(last.tolist())) == 4 and (book.counts[last] == 1).all()
      # A copy holds its source page's contents: the source's id in every slot.
      copied = _pages(forked, last[1:])  # in every layer
      assert (copied == last[0]).all()
    assert book.pages_in_use() == full + (4 if offset else 0) + 1  # row 1: one page
  assert work[0] == work[1]
  assert work[0]["pages_copied"] == (3 if offset else 0)
  assert work[0]["kv_bytes_copied"] == work[0]["pages_copied"] * forked.book.page_bytes
  assert work[0]["pool_growths"] == 0


def test_dropped_rows_release_their_pages_and_shared_pages_survive():
  cache = _filled([40, 9], page_size=8, max_length=64)
  assert cache.book.pages_in_use() == 5 + 2
  cache = paged.take_rows(cache, [0, 0, 1])     # 40 = 5 full pages: nothing copied
  assert cache.book.pages_in_use() == 7 and cache.book.stats["pages_copied"] == 0
  cache = paged.take_rows(cache, [1])           # row 0 and row 1 (its copy) dropped
  assert cache.book.pages_in_use() == 5          # row 1 still holds the shared pages
  cache = paged.take_rows(cache, [0])
  assert cache.book.pages_in_use() == 5
  cache.book.trim(np.asarray([0]))
  assert cache.book.pages_in_use() == 0 and sorted(cache.book.free) == list(range(1, 17))


def test_cutting_a_row_back_copies_its_shared_last_page():
  # Two rows share 3 full pages; cutting row 1 to 10 tokens leaves page 2 half used, and row 1
  # writes there next: it gets a copy, row 0 keeps the original.
  cache = paged.take_rows(_filled([24], page_size=8, max_length=64), [0, 0])
  shared = cache.book.table[0, :3].copy()
  cache = paged.truncate(cache, {1: 10})
  table, counts = cache.book.table, cache.book.counts
  assert (table[0, :3] == shared).all() and table[1, 0] == shared[0]
  assert table[1, 1] != shared[1] and table[1, 2] == paged.NULL_PAGE
  assert counts[shared[1]] == 1 and counts[table[1, 1]] == 1 and counts[shared[2]] == 1
  assert np.asarray(cache.lengths).tolist() == [24, 10]
  assert (_pages(cache, table[1, 1]) == shared[1]).all()
  with pytest.raises(ValueError, match="cannot cut it to 30"):
    paged.truncate(cache, {1: 30})


def test_the_pool_grows_when_rows_need_more_pages():
  cache = _filled([8], page_size=8, max_length=16)   # 2 pages + the null page
  cache = paged.take_rows(cache, [0, 0, 0])
  cache = paged.with_room(cache, [16, 16, 16])       # 3 more pages than the pool has
  assert cache.num_pages == len(cache.book.counts) > 3 and cache.book.stats["pool_growths"] == 1
  assert cache.book.pages_in_use() == 4
  assert (np.asarray(cache.page_table) == cache.book.table).all()


def _grow_tree(sampler, state, prompt):
  """A tree of forks (3 siblings after the prompt, 2 below one of them, a branch ended) grown
  by the sampler; returns the live rows' token lists and each call's outputs."""
  params = SamplingParams(temperature=1.0, max_new_tokens=6)
  rows, outs = [list(prompt)], []

  def decode(ds, key, active=None):
    ds, out = sampler.generate(state, ds, jax.random.key(key), params, active=active)
    outs.append(out)
    for b in range(len(rows)):
      rows[b] += np.asarray(out.tokens[b, :int(out.num_tokens[b])]).tolist()
    return ds

  # Three rows throughout (rows 1 and 2 empty and idle at first): one program per call kind.
  rows += [[], []]
  ds = decode(sampler.prefill(state, [prompt, [], []]), 0, active=[True, False, False])
  ds = sampler.take_rows(ds, [0, 0, 0])
  rows = [list(rows[0]) for _ in range(3)]
  observations = {0: [5, 6, 7], 1: [8], 2: [9, 10, 11, 12, 13]}
  ds = sampler.append(state, ds, observations)
  for b, obs in observations.items():
    rows[b] += obs
  ds = decode(ds, 1)
  ds = sampler.take_rows(ds, [0, 2, 2])   # branch 1 ended; branch 2 forks in two
  rows = [rows[0], rows[2], list(rows[2])]
  ds = decode(ds, 2, active=[True, True, True])
  return ds, rows, outs


def _distinct_tokens(rows):
  """Tokens of the rows' prefix tree (a shared prefix counted once)."""
  return len({tuple(row[:n + 1]) for row in rows for n in range(len(row))})


PROMPT = np.random.RandomState(0).randint(0, VOCAB, 13).tolist()


@pytest.fixture(scope="module")
def dense_tree(policy):
  config, graphdef, state = policy
  return _grow_tree(sampling.Sampler(graphdef, config, MAX_LENGTH), state, PROMPT)


# The kernel's tree (its decode loop in Pallas interpret mode compiles for ~20 s) is slow; the
# kernel itself is checked against the portable attention below, in seconds.
@pytest.mark.parametrize("kernel", ["portable",
                                    pytest.param("pallas_interpret", marks=pytest.mark.slow)]
                         + GPU_KERNELS)
def test_paged_sampling_gives_the_dense_trees(policy, dense_tree, kernel):
  # The same tree grown with the dense and the paged cache: the same tokens for the same keys,
  # logprobs and entropies within a forward's roundings (attention sums over other spans).
  config, graphdef, state = policy
  prompt = PROMPT
  dense_ds, dense_rows, dense_outs = dense_tree
  sampler = sampling.Sampler(graphdef, config, MAX_LENGTH, page_size=PAGE, kernel=kernel)
  paged_ds, paged_rows, paged_outs = _grow_tree(sampler, state, prompt)
  assert paged_rows == dense_rows
  steps = forward_roundings(config, MAX_LENGTH, logprobs=True) + sum_roundings(MAX_LENGTH)
  for got, want in zip(paged_outs, dense_outs):
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_array_equal(np.asarray(got.mask), np.asarray(want.mask))
    assert_close(got.logprobs, want.logprobs, steps=steps)
    assert_close(got.entropies, want.entropies, steps=steps)
  assert_close(paged_ds.next_logits, dense_ds.next_logits,
               steps=forward_roundings(config, MAX_LENGTH) + sum_roundings(MAX_LENGTH))
  np.testing.assert_array_equal(np.asarray(paged_ds.lengths), [len(r) for r in paged_rows])
  # Each row holds ceil(length / page) pages, a shared prefix once.
  book = paged_ds.cache.book
  assert book.held.tolist() == [-(-len(r) // PAGE) for r in paged_rows]
  assert book.pages_in_use() <= -(-_distinct_tokens(paged_rows) // PAGE) + len(paged_rows)
  assert book.pages_in_use() < sum(book.held)   # pages are shared


@pytest.mark.parametrize("kernel", ["pallas_interpret"] + GPU_KERNELS)
def test_pallas_paged_attention_equals_the_portable_attention(kernel):
  # One query per row over pages in a shuffled order, rows of 1 to 29 slots of 8 pages of 4.
  rng = np.random.RandomState(0)
  b, hkv, g, d, pages, page = 5, 2, 3, 16, 41, 4
  keys = jnp.asarray(rng.randn(hkv, pages, page, d), jnp.float32)
  values = jnp.asarray(rng.randn(hkv, pages, page, d), jnp.float32)
  table = jnp.asarray(rng.permutation(np.arange(1, pages))[:b * 8].reshape(b, 8), jnp.int32)
  lengths = jnp.asarray([1, 4, 5, 17, 29], jnp.int32)
  q = jnp.asarray(rng.randn(b, hkv, g, 1, d), jnp.float32)
  layer = paged.PagedLayer(keys=keys, values=values, table=table, write_pages=None,
                           write_offsets=None, kernel=kernel, dtype="float32")
  assert paged.uses_kernel(layer, 1) and not paged.uses_kernel(layer, 2)
  got = paged.kernel_attend(q, layer, lengths)
  k, v = paged.gather_window(layer)
  mask = (jnp.arange(32)[None, :] < lengths[:, None])[:, None, :]
  want = attend(q, k, v, mask, jnp.float32)
  # Scores: a D-term dot product, the query scaled first; softmax and the value sum over at
  # most 32 slots, in blocks (online softmax): each side a few sums of up to 32 terms.
  assert_close(got, want, steps=2 * sum_roundings(d) + 4 * sum_roundings(32) + 8,
               magnitude=float(jnp.max(jnp.abs(values))))


def test_bad_paged_inputs_are_named(policy):
  config, graphdef, _ = policy
  with pytest.raises(ValueError, match="page_size must be >= 0"):
    sampling.Sampler(graphdef, config, MAX_LENGTH, page_size=-1)
  with pytest.raises(ValueError, match="kernel must be one of"):
    paged.PagedKVCache.init(config, 2, MAX_LENGTH, PAGE, kernel="fast")
  sampler = sampling.Sampler(graphdef, config, MAX_LENGTH, page_size=PAGE)
  with pytest.raises(ValueError, match="made on one device"):
    sampler.init_state(2, mesh=object())
  with pytest.raises(ValueError, match=r"rows must be in \[0, 2\)"):
    sampler.take_rows(sampler.init_state(2), [0, 2])


def test_placing_a_row_in_a_free_slot_shares_its_pages():
  # Slots of one batch of 4: row 0 (21 tokens: 2 full pages of 8 and 5 tokens) placed into
  # slots 2 and 3 shares the full pages, copies the last; row 1 is left as it was. Releasing
  # slot 2 drops its references only.
  cache = _filled([21, 9, 0, 0], page_size=8, max_length=64)
  row1 = cache.book.table[1].copy()
  cache = paged.place(cache, [(0, 2), (0, 3)])
  table, counts = cache.book.table, cache.book.counts
  assert (table[2, :2] == table[0, :2]).all() and (table[3, :2] == table[0, :2]).all()
  assert (counts[table[0, :2]] == 3).all() and len({table[0, 2], table[2, 2], table[3, 2]}) == 3
  assert (table[1] == row1).all() and cache.book.stats["pages_copied"] == 2
  assert np.asarray(cache.lengths).tolist() == [21, 9, 21, 21]
  assert (_pages(cache, table[3, 2]) == table[0, 2]).all()  # the copy's contents
  cache = paged.release(cache, [2])
  assert (counts[table[0, :2]] == 2).all() and cache.book.pages_in_use() == 3 + 2 + 1
  assert np.asarray(cache.lengths).tolist() == [21, 9, 0, 21]
  with pytest.raises(ValueError, match="row 3 still holds pages"):
    paged.place(cache, [(1, 3)])
