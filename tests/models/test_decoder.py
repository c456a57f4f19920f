"""Decoder numerics: cached decode ≡ full forward, forks ≡ recomputation, packed-tree masks."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bpo_jax import models
from bpo_jax.models import ForwardOptions, KVCache, ModelConfig
from bpo_jax.testing.model_rounding import forward_roundings
from bpo_jax.testing.tolerance import assert_close, eps

F32 = eps(np.float32)


def random_model(config, seed=0, scale=0.2):
  """A model whose weights are N(0, scale²) (norm weights around 1), so logits are far from flat."""
  model = models.Decoder(config, rngs=nnx.Rngs(seed))
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree_util.tree_flatten(state)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  leaves = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return graphdef, jax.tree_util.tree_unflatten(treedef, leaves)


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request):
  config = (ModelConfig.tiny() if request.param == "qwen2" else
            ModelConfig.tiny_llama())
  graphdef, state = random_model(config)
  return config, graphdef, state


# One jitted forward for all tests (graphdef static): eager dispatch would compile op by op.
# `ForwardOptions.attend_length` is static data of the options pytree: no static_argnames.
forward = jax.jit(models.forward, static_argnums=0)
ROWS, WIDTH = 4, 16


def full_logits(graphdef, state, rows, positions=None):
  """Full-forward logits of each token list, all run as one right-padded [4, 16] batch.

  One shape for every test keeps compilation to once per model. Causal attention keeps real
  tokens from seeing the right padding.
  """
  tokens = np.zeros((ROWS, WIDTH), np.int32)
  all_positions = np.tile(np.arange(WIDTH, dtype=np.int32), (ROWS, 1))
  for b, row in enumerate(rows):
    tokens[b, :len(row)] = row
    if positions is not None:
      all_positions[b, :len(row)] = positions[b]
  logits, _ = forward(graphdef, state, jnp.asarray(tokens), positions=jnp.asarray(all_positions))
  return [np.asarray(logits[b, :len(row)]) for b, row in enumerate(rows)]


@pytest.mark.slow
def test_published_parameter_counts_and_shape_first_build():
  # Parameter counts published for these checkpoints.
  assert ModelConfig.qwen2_5_0_5b().num_params() == 494_032_768
  assert ModelConfig.qwen2_5_7b().num_params() == 7_615_616_512
  assert ModelConfig.llama3_1_8b().num_params() == 8_030_261_248
  # Built shape-first (no weights in memory), the module holds exactly that many parameters.
  config = ModelConfig.qwen2_5_0_5b()
  abstract = nnx.eval_shape(lambda: models.Decoder(config, rngs=nnx.Rngs(0)))
  params = nnx.state(abstract, nnx.Param)
  assert sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params)) == 494_032_768
  assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  tiny = ModelConfig.tiny()
  model = models.Decoder(tiny, rngs=nnx.Rngs(0))
  assert sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))) == (
      tiny.num_params())


@pytest.mark.parametrize("bad, message", [
    (dict(num_heads=4, num_kv_heads=3), "multiple of num_kv_heads"),
    (dict(head_dim=15), "even"),
    (dict(architecture="gpt2"), "architecture"),
    (dict(dtype="int8"), "dtype"),
    (dict(num_layers=0), "num_layers"),
])
def test_config_rejects_bad_values(bad, message):
  with pytest.raises(ValueError, match=message):
    ModelConfig.tiny(**bad)


def test_rope_inverse_frequencies_by_hand():
  # θ^(-2i/d) is a float32 power and a division, each rounded once.
  np.testing.assert_allclose(models.rope_inverse_frequencies(4, 100.0), [1.0, 0.1], rtol=2 * F32)
  # head_dim 8, θ = 10⁴: f = [1, 0.1, 0.01, 0.001], wavelengths 2π·[1, 10, 100, 1000].
  # Context 64, low factor 1, high factor 4: short (< 16) kept, long (> 64) divided by 8,
  # wavelength 62.8 blended with s = (64/62.83 − 1)/3.
  scaling = models.Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=64)
  got = models.rope_inverse_frequencies(8, 1e4, scaling)
  s = (64 / (2 * math.pi * 10) - 1) / 3
  want = [1.0, (1 - s) * 0.1 / 8 + s * 0.1, 0.01 / 8, 0.001 / 8]
  # The blend takes about eight float32 operations on top of the frequency's two.
  np.testing.assert_allclose(got, want, rtol=10 * F32)


@pytest.mark.slow
def test_cached_decode_equals_full_forward(model):
  config, graphdef, state = model
  rng = np.random.RandomState(0)
  rows = [rng.randint(0, config.vocab_size, n).tolist() for n in (5, 9, 12, 8)]
  prompt_lengths = np.asarray([3, 6, 8, 8])

  # Batched, right-padded prefill of rows of different lengths...
  prompts = np.zeros((4, 8), np.int32)
  for b, row in enumerate(rows):
    prompts[b, :prompt_lengths[b]] = row[:prompt_lengths[b]]
  cache = KVCache.init(config, 4, 16)
  logits, cache = forward(graphdef, state, jnp.asarray(prompts), cache=cache,
                          input_lengths=jnp.asarray(prompt_lengths))
  got = [[np.asarray(logits[b, t]) for t in range(prompt_lengths[b])] for b in range(4)]
  # ...then one token at a time, rows that are finished appending nothing.
  for step in range(max(len(r) for r in rows) - prompt_lengths.min()):
    positions = prompt_lengths + step
    tokens = np.asarray([[r[p] if p < len(r) else 0] for r, p in zip(rows, positions)], np.int32)
    live = np.asarray([p < len(r) for r, p in zip(rows, positions)])
    logits, cache = forward(graphdef, state, jnp.asarray(tokens), cache=cache,
                            input_lengths=jnp.asarray(live.astype(np.int32)))
    for b in range(4):
      if live[b]:
        got[b].append(np.asarray(logits[b, 0]))
  np.testing.assert_array_equal(np.asarray(cache.lengths), [5, 9, 12, 8])
  roundings = forward_roundings(config, 16)
  for b, want in enumerate(full_logits(graphdef, state, rows)):
    assert_close(np.stack(got[b]), want, steps=roundings)


def test_attention_window_gives_the_numbers_of_the_whole_cache(model):
  """Attending over the first `attend_length` slots only (all a row can hold) changes nothing."""
  config, graphdef, state = model
  rng = np.random.RandomState(2)
  rows = [rng.randint(0, config.vocab_size, n).tolist() for n in (5, 9, 12, 8)]
  prompts = np.zeros((4, 8), np.int32)
  for b, row in enumerate(rows):
    prompts[b, :min(len(row), 8)] = row[:8]
  prompt_lengths = jnp.asarray([5, 8, 8, 8])
  whole, windowed = KVCache.init(config, 4, 16), KVCache.init(config, 4, 16)
  want, whole = forward(graphdef, state, jnp.asarray(prompts), cache=whole,
                        input_lengths=prompt_lengths)
  got, windowed = forward(graphdef, state, jnp.asarray(prompts), cache=windowed,
                          input_lengths=prompt_lengths, options=ForwardOptions(attend_length=8))
  logits = {"whole": [want], "windowed": [got]}
  # Row 0 stops after its prompt and takes no tokens from then on.
  for t in range(4):
    step_tokens = jnp.asarray([[0]] + [[r[8 + t] if 8 + t < len(r) else 0] for r in rows[1:]])
    live = jnp.asarray([0] + [int(8 + t < len(r)) for r in rows[1:]])
    want, whole = forward(graphdef, state, step_tokens, cache=whole, input_lengths=live)
    # Every live row ends at slot 12 at most: 12 of the 16 slots suffice.
    got, windowed = forward(graphdef, state, step_tokens, cache=windowed, input_lengths=live,
                            options=ForwardOptions(attend_length=12))
    logits["whole"].append(want)
    logits["windowed"].append(got)
  np.testing.assert_array_equal(np.asarray(windowed.lengths), np.asarray(whole.lengths))
  roundings = forward_roundings(config, 16)  # softmax sums over 8, 12 or 16 slots
  for got, want in zip(logits["windowed"], logits["whole"]):
    assert_close(got, want, steps=roundings)
  for got, want in zip(windowed.keys + windowed.values, whole.keys + whole.values):
    assert_close(got, want, steps=roundings)
  # And both are the full forward's numbers.
  reference = full_logits(graphdef, state, rows)
  assert_close(logits["windowed"][0][0, :5], reference[0][:5], steps=roundings)
  for b in range(1, 4):
    steps = len(rows[b]) - 8
    got = np.concatenate([np.asarray(logits["windowed"][0][b])] +
                         [np.asarray(x[b]) for x in logits["windowed"][1:1 + steps]])
    assert_close(got, reference[b], steps=roundings)


def test_forked_cache_continued_equals_recompute(model):
  config, graphdef, state = model
  rng = np.random.RandomState(1)
  prefixes = [rng.randint(0, config.vocab_size, n).tolist() for n in (4, 7)]
  prompts = np.zeros((4, 8), np.int32)
  prompts[0, :4], prompts[1, :7] = prefixes[0], prefixes[1]
  _, cache = forward(graphdef, state, jnp.asarray(prompts), cache=KVCache.init(config, 4, 16),
                     input_lengths=jnp.asarray([4, 7, 0, 0]))
  # Row 1 forked three ways, row 0 kept once: a gather on the batch axis.
  sources = [1, 1, 0, 1]
  forked = cache.take_rows(sources)
  continuations = rng.randint(0, config.vocab_size, (4, 3))
  got = []
  for t in range(3):
    logits, forked = forward(graphdef, state, jnp.asarray(continuations[:, t:t + 1], jnp.int32),
                             cache=forked, input_lengths=jnp.ones((4,), jnp.int32))
    got.append(np.asarray(logits[:, 0]))
  got = np.stack(got, axis=1)
  rows = [prefixes[source] + continuations[b].tolist() for b, source in enumerate(sources)]
  for b, want in enumerate(full_logits(graphdef, state, rows)):
    assert_close(got[b], want[-3:], steps=forward_roundings(config, 16))
  np.testing.assert_array_equal(np.asarray(forked.lengths), [10, 10, 7, 10])


def test_packed_tree_with_ancestor_mask_equals_each_path(model):
  config, graphdef, state = model
  rng = np.random.RandomState(2)
  prefix, branch_a, branch_b = (rng.randint(0, config.vocab_size, n).tolist() for n in (4, 3, 2))
  packed = prefix + branch_a + branch_b
  node = [0] * 4 + [1] * 3 + [2] * 2
  ancestors = {0: {0}, 1: {0, 1}, 2: {0, 2}}
  mask = np.asarray([[node[k] in ancestors[node[j]] and k <= j for k in range(9)]
                     for j in range(9)])
  positions = list(range(4)) + [4, 5, 6] + [4, 5]
  logits, _ = forward(graphdef, state, jnp.asarray([packed]), positions=jnp.asarray([positions]),
                      attention_mask=jnp.asarray([mask]))
  logits = np.asarray(logits[0])
  path_a, path_b, causal = full_logits(
      graphdef, state, [prefix + branch_a, prefix + branch_b, packed],
      positions=[range(7), range(6), positions])
  roundings = forward_roundings(config, 16)
  assert_close(logits[:7], path_a, steps=roundings)
  assert_close(logits[7:], path_b[4:], steps=roundings)
  # Without the mask the packed row is a different (causal) sequence: the test can fail.
  assert np.abs(causal[7:] - path_b[4:]).max() > 1e-3


@pytest.mark.slow
def test_bfloat16_model_tracks_float32():
  config = ModelConfig.tiny()
  graphdef, state = random_model(config)
  bf16_config = config.replace(dtype="bfloat16", param_dtype="bfloat16")
  bf16_graphdef, _ = nnx.split(models.Decoder(bf16_config, rngs=nnx.Rngs(0)))
  bf16_state = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), state)
  tokens = jnp.asarray(np.random.RandomState(4).randint(0, config.vocab_size, (2, 8)), jnp.int32)
  want, _ = forward(graphdef, state, tokens)
  got, _ = forward(bf16_graphdef, bf16_state, tokens)
  assert got.dtype == jnp.float32
  # Every weight and activation is rounded to bf16 (eps 2⁻⁷): many independent roundings, whose
  # sum grows like the square root of their count (the count itself, the worst case, would be
  # the whole magnitude at bf16's eps).
  assert_close(got, want, steps=math.sqrt(forward_roundings(config, 8)), dtype=jnp.bfloat16)


# A log-softmax and entropy over a few logits take a handful of float32 operations (exp, sum,
# log, subtract, multiply, divide), each rounded once: 8 roundings of the value compared.
HAND = 8 * F32


def test_logprobs_and_entropy_by_hand():
  logits = jnp.asarray([[0.0, 0.0], [0.0, math.log(3.0)]])
  logprobs, entropy = models.logprobs_and_entropy_from_logits(logits, jnp.asarray([1, 1]))
  np.testing.assert_allclose(logprobs, [math.log(0.5), math.log(0.75)], rtol=HAND)
  np.testing.assert_allclose(
      entropy, [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], rtol=HAND)
  # Temperature 2 halves the logits: [0, log 3] -> [0, log √3], p = [1, √3] / (1 + √3).
  logprobs, _ = models.logprobs_and_entropy_from_logits(logits[1:], jnp.asarray([0]), 2.0)
  np.testing.assert_allclose(logprobs, [-math.log(1 + math.sqrt(3))], rtol=HAND)
  # Temperature 0 (greedy) reports the untempered distribution.
  logprobs, _ = models.logprobs_and_entropy_from_logits(logits[1:], jnp.asarray([0]), 0.0)
  np.testing.assert_allclose(logprobs, [math.log(0.25)], rtol=HAND)
  with pytest.raises(ValueError, match="temperature"):
    models.logprobs_and_entropy_from_logits(logits, jnp.asarray([0, 0]), -1.0)


def test_logprobs_and_entropy_with_masked_logits_and_their_gradient():
  # A logit of -inf has probability 0 and adds nothing to the entropy (not 0·inf = nan).
  logits = jnp.asarray([[0.0, -jnp.inf, math.log(3.0)]])
  logprobs, entropy = models.logprobs_and_entropy_from_logits(logits, jnp.asarray([2]))
  np.testing.assert_allclose(logprobs, [math.log(0.75)], rtol=HAND)
  np.testing.assert_allclose(
      entropy, [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], rtol=HAND)
  # Gradients by hand: d log p_t / dx = onehot(t) - p and dH / dx_i = -p_i (log p_i + H).
  x = jnp.asarray([0.3, -1.2, 2.0, 0.5])
  p = np.asarray(jax.nn.softmax(x))
  h = -(p * np.log(p)).sum()
  grad_logprob = jax.grad(
      lambda v: models.logprobs_and_entropy_from_logits(v, jnp.asarray(2))[0])(x)
  grad_entropy = jax.grad(
      lambda v: models.logprobs_and_entropy_from_logits(v, jnp.asarray(2))[1])(x)
  # Gradients of values of size ~1: the same handful of operations, twice over (forward, back).
  assert_close(grad_logprob, np.eye(4)[2] - p, steps=16)
  assert_close(grad_entropy, -p * (np.log(p) + h), steps=16)


@pytest.mark.slow
def test_logits_at_picks_the_logits_of_the_full_output(model):
  config, graphdef, state = model
  tokens = jnp.asarray(np.random.RandomState(6).randint(0, config.vocab_size, (3, 7)))
  picks = np.asarray([[6, 0], [2, 2], [4, 5]], np.int32)
  full, _ = forward(graphdef, state, tokens)
  picked, _ = forward(graphdef, state, tokens, options=ForwardOptions(logits_at=jnp.asarray(picks)))
  assert picked.shape == (3, 2, config.vocab_size)
  want = np.take_along_axis(np.asarray(full), picks[:, :, None], axis=1)
  roundings = forward_roundings(config, 8)
  assert_close(picked, want, steps=roundings)
  # With a cache: the last real token of each right-padded row, as a continued prefill takes it.
  lengths = np.asarray([7, 3, 5], np.int32)
  cache = KVCache.init(config, 3, 8)
  full, full_cache = forward(graphdef, state, tokens, cache=cache,
                             input_lengths=jnp.asarray(lengths))
  last, last_cache = forward(graphdef, state, tokens, cache=cache,
                             input_lengths=jnp.asarray(lengths),
                             options=ForwardOptions(logits_at=jnp.asarray(lengths - 1)[:, None]))
  assert_close(last[:, 0], np.asarray(full)[np.arange(3), lengths - 1], steps=roundings)
  for got, want in zip(last_cache.keys + last_cache.values, full_cache.keys + full_cache.values):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # Several steps per row, repeated and out of order: the last layer then runs its queries and
  # MLP at those steps only, the keys and values of every token still cached.
  picked, picked_cache = forward(graphdef, state, tokens, cache=cache,
                                 input_lengths=jnp.asarray(lengths),
                                 options=ForwardOptions(logits_at=jnp.asarray(picks)))
  want = np.take_along_axis(np.asarray(full), picks[:, :, None], axis=1)
  assert_close(picked, want, steps=roundings)
  for got, want in zip(picked_cache.keys + picked_cache.values,
                       full_cache.keys + full_cache.values):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_unembedding_replaces_the_output_projection(model):
  """A given [hidden, vocab] kernel is the output projection: the model's own (the tied
  embedding transposed, or the untied lm_head) gives its logits; another kernel gives x @ it."""
  config, graphdef, state = model
  tokens = jnp.asarray(np.random.RandomState(8).randint(0, config.vocab_size, (2, 5)))
  own = state["embed"][...].T if config.tie_word_embeddings else state["lm_head"][...]
  want, _ = forward(graphdef, state, tokens)
  got, _ = forward(graphdef, state, tokens,
                   options=ForwardOptions(unembedding=jnp.asarray(np.asarray(own))))
  roundings = forward_roundings(config, 5)
  assert_close(got, want, steps=roundings)
  doubled, _ = forward(graphdef, state, tokens, options=ForwardOptions(unembedding=2.0 * own))
  assert_close(doubled, 2.0 * np.asarray(want), steps=roundings)
  with pytest.raises(ValueError, match=r"unembedding must be \[hidden, vocab\]"):
    models.forward(graphdef, state, tokens, options=ForwardOptions(unembedding=own.T))


def test_training_logprobs_match_a_full_forward(model):
  config, graphdef, state = model
  tokens = np.random.RandomState(5).randint(0, config.vocab_size, (2, 6))
  targets = np.roll(tokens, -1, axis=1)
  logprobs, entropies = jax.jit(models.token_logprobs_and_entropy, static_argnums=0,
                                static_argnames="temperature")(
      graphdef, state, jnp.asarray(tokens), jnp.asarray(targets), temperature=0.5)
  logits, _ = forward(graphdef, state, jnp.asarray(tokens))
  log_p = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64) / 0.5, axis=-1))
  want = np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
  # The same logits twice (two compiled programs), then a float32 log-softmax against float64.
  roundings = forward_roundings(config, 6, logprobs=True)
  assert_close(logprobs, want, steps=roundings)
  assert_close(entropies, -(np.exp(log_p) * log_p).sum(-1), steps=roundings)


def test_bad_inputs_get_clear_errors():
  config = ModelConfig.tiny()
  graphdef, state = nnx.split(models.Decoder(config, rngs=nnx.Rngs(0)))
  tokens = jnp.zeros((2, 4), jnp.int32)
  with pytest.raises(ValueError, match="tokens must be"):
    models.forward(graphdef, state, jnp.zeros((4,), jnp.int32))
  with pytest.raises(ValueError, match="attention_mask must be"):
    models.forward(graphdef, state, tokens, attention_mask=jnp.ones((2, 4, 5), bool))
  with pytest.raises(ValueError, match="positions must be"):
    models.forward(graphdef, state, tokens, positions=jnp.zeros((2, 3), jnp.int32))
  with pytest.raises(ValueError, match="cache has 3 rows"):
    models.forward(graphdef, state, tokens, cache=KVCache.init(config, 3, 8))
  with pytest.raises(ValueError, match="not supported together with a cache"):
    models.forward(graphdef, state, tokens, attention_mask=jnp.ones((2, 4, 4), bool),
                   cache=KVCache.init(config, 2, 8))
  with pytest.raises(ValueError, match="input_lengths"):
    models.forward(graphdef, state, tokens, input_lengths=jnp.ones((2,), jnp.int32))
  with pytest.raises(ValueError, match="attend_length is only meaningful with a cache"):
    models.forward(graphdef, state, tokens, options=ForwardOptions(attend_length=4))
  cache = KVCache.init(config, 2, 8)
  with pytest.raises(ValueError, match=r"attend_length must be in \[4, 8\].*got 9"):
    models.forward(graphdef, state, tokens, cache=cache, options=ForwardOptions(attend_length=9))
  with pytest.raises(ValueError, match=r"attend_length must be in \[4, 8\].*got 3"):
    models.forward(graphdef, state, tokens, cache=cache, options=ForwardOptions(attend_length=3))
  with pytest.raises(ValueError, match="attend_length must be a Python int"):
    models.forward(graphdef, state, tokens, cache=cache,
                   options=ForwardOptions(attend_length=jnp.int32(6)))
  with pytest.raises(ValueError, match=r"logits_at must be \[batch, K\].*batch 2.*\(2,\)"):
    models.forward(graphdef, state, tokens,
                   options=ForwardOptions(logits_at=jnp.zeros((2,), jnp.int32)))


@pytest.mark.slow
def test_attention_by_query_blocks_is_the_dense_attention_and_its_gradient():
  """`attend` with query blocks (4 blocks of 16 queries; 3 of 22 for blocks of at most 24, two
  queries of padding; under `jax.checkpoint`) gives what one block of all 64 queries gives, and both the float64 NumPy
  formula softmax(q kᵀ/√D + mask) v under an ancestor-like mask (causal, some earlier keys
  hidden, each token sees itself); the gradients agree as well. Roundings: D products, S
  exponentials and sums, S products."""
  b, kv_heads, groups, t, d = 2, 2, 2, 64, 8
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=shape).astype(np.float32) for shape in
             ((b, kv_heads, groups, t, d), (b, kv_heads, d, t), (b, kv_heads, t, d)))
  mask = np.tril(np.ones((t, t), bool))[None] & (rng.random((b, t, t)) < 0.7)
  mask |= np.eye(t, dtype=bool)[None]
  scores = np.einsum("bkgqd,bkds->bkgqs", q.astype(np.float64), k) / math.sqrt(d)
  scores = np.where(mask[:, None, None], scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  expected = np.einsum("bkgqs,bksd->bkgqd", probs, v)
  dense = models.decoder.attend(q, k, v, mask, jnp.float32, query_block=t)
  steps = 2 * (t + d)
  assert_close(dense, expected, steps=steps, magnitude=np.abs(v).max())
  for block in (16, 24):
    blocks = models.decoder.attend(q, k, v, mask, jnp.float32, query_block=block)
    assert blocks.shape == expected.shape
    blocked = jax.make_jaxpr(functools.partial(models.decoder.attend, dtype=jnp.float32,
                                               query_block=block))(q, k, v, mask)
    assert "scan" in str(blocked), "queries were not taken a block at a time"
    assert_close(blocks, expected, steps=steps, magnitude=np.abs(v).max())
  weights = rng.normal(size=expected.shape).astype(np.float32)

  def loss(block, q, k, v):
    return jnp.sum(models.decoder.attend(q, k, v, mask, jnp.float32, query_block=block) * weights)

  dense_grads, *block_grads = [jax.grad(functools.partial(loss, block), argnums=(0, 1, 2))(q, k, v)
                               for block in (t, 16, 24)]
  for grads in block_grads:
    for dense_grad, block_grad in zip(dense_grads, grads):
      assert block_grad.shape == dense_grad.shape
      assert_close(block_grad, dense_grad, steps=4 * steps,
                   magnitude=np.abs(dense_grad).max() + np.abs(weights).max() * np.abs(v).max())


@pytest.mark.slow
def test_causal_attention_reads_keys_up_to_each_block_and_skips_blocks_of_padding():
  """`attend(causal=True)` by blocks of 16 of a 64-token row equals the float64 NumPy formula
  softmax(q kᵀ/√D + mask) v under the mask and k <= j (keys after the query, allowed by the
  mask here, are not attended), and so does its gradient. The two rows are packed-batch-like:
  real tokens up to 40 and 20, then padding that attends only itself, so the last block is
  padding in both rows (skipped: `cond`) and its outputs are the queries' own values; a second
  batch whose first row is real to the end has no block to skip and still agrees."""
  b, kv_heads, groups, t, d, block = 2, 2, 2, 64, 8, 16
  rng = np.random.default_rng(1)
  q, k, v = (rng.normal(size=shape).astype(np.float32) for shape in
             ((b, kv_heads, groups, t, d), (b, kv_heads, d, t), (b, kv_heads, t, d)))
  weights = rng.normal(size=q.shape).astype(np.float32)
  causal = np.tril(np.ones((t, t), bool))
  for lengths in ((40, 20), (64, 20)):
    mask = (rng.random((b, t, t)) < 0.7) | np.eye(t, dtype=bool)[None]
    mask[:, 0, 1] = True  # past the query: the causal path must not read it
    for row, n in enumerate(lengths):
      mask[row, n:] = np.eye(t, dtype=bool)[n:]
      mask[row, :, n:] &= np.eye(t, dtype=bool)[:, n:]
    seen = mask & causal[None]

    def reference(q, k, v):
      scores = np.einsum("bkgqd,bkds->bkgqs", q.astype(np.float64), k) / math.sqrt(d)
      scores = np.where(seen[:, None, None], scores, -np.inf)
      probs = np.exp(scores - scores.max(-1, keepdims=True))
      return np.einsum("bkgqs,bksd->bkgqd", probs / probs.sum(-1, keepdims=True), v)

    attend = functools.partial(models.decoder.attend, mask=jnp.asarray(mask), dtype=jnp.float32,
                               query_block=block, causal=True)
    out = attend(q, k, v)
    steps = 2 * (t + d)
    assert_close(out, reference(q, k, v), steps=steps, magnitude=np.abs(v).max())
    jaxpr = str(jax.make_jaxpr(attend)(q, k, v))
    assert jaxpr.count("cond[") == t // block - 1, "blocks after the first are not conditional"
    if lengths == (40, 20):
      np.testing.assert_array_equal(out[:, :, :, 48:], np.broadcast_to(
          v[:, :, None, 48:], (b, kv_heads, groups, t - 48, d)))
    grads = jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) * weights), argnums=(0, 1, 2))(
        q, k, v)
    # The float64 reference gradient by central differences would be slow; the dense float32
    # attention of the causally masked mask is the reference instead (one block, no causal path).
    dense = jax.grad(lambda q, k, v: jnp.sum(models.decoder.attend(
        q, k, v, jnp.asarray(seen), jnp.float32, query_block=t) * weights), argnums=(0, 1, 2))(
            q, k, v)
    for got, want in zip(grads, dense):
      assert_close(got, want, steps=4 * steps,
                   magnitude=np.abs(want).max() + np.abs(weights).max() * np.abs(v).max())
