"""The sampler: greedy ≡ transformers, logprobs ≡ training forward, forks, stops, distributions."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from bpo_jax import models
from bpo_jax import sampling
from bpo_jax.sampling import SamplingParams
from bpo_jax.testing.model_rounding import forward_roundings, sum_roundings
from bpo_jax.testing.tolerance import assert_close, eps, ulp_tol

VOCAB = 97
MAX_LENGTH = 48
score = jax.jit(models.token_logprobs_and_entropy, static_argnums=0,
                static_argnames="temperature")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  """A tiny random Qwen2 model in transformers and the same weights loaded by our loader."""
  torch.manual_seed(0)
  hf_model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
      tie_word_embeddings=True)).eval()
  path = str(tmp_path_factory.mktemp("policy"))
  hf_model.save_pretrained(path)
  model, config = models.load_hf_checkpoint(path)
  graphdef, state = nnx.split(model)
  return hf_model, config, graphdef, state, sampling.Sampler(graphdef, config, MAX_LENGTH)


PROMPTS = [np.random.RandomState(s).randint(0, VOCAB, n).tolist()
           for s, n in ((1, 5), (2, 11), (3, 8), (4, 2))]


def score_rows(graphdef, state, rows, temperature):
  """Training-side logprobs / entropies of each row's tokens after the first, one padded batch."""
  tokens, _ = sampling.pad_token_rows(rows, length=MAX_LENGTH)
  targets = np.roll(tokens, -1, axis=1)
  logprobs, entropies = score(graphdef, state, jnp.asarray(tokens), jnp.asarray(targets),
                              temperature=temperature)
  return ([np.asarray(logprobs[b, :len(r) - 1]) for b, r in enumerate(rows)],
          [np.asarray(entropies[b, :len(r) - 1]) for b, r in enumerate(rows)])


def generated(out, b):
  n = int(out.num_tokens[b])
  assert np.asarray(out.mask[b, :n]).all() and not np.asarray(out.mask[b, n:]).any()
  return (np.asarray(out.tokens[b, :n]).tolist(), np.asarray(out.logprobs[b, :n]),
          np.asarray(out.entropies[b, :n]))


@pytest.mark.slow
def test_greedy_equals_transformers_generate(policy):
  hf_model, _, _, state, sampler = policy
  ds = sampler.prefill(state, PROMPTS)
  ds, out = sampler.generate(state, ds, jax.random.key(0),
                             SamplingParams(temperature=0.0, max_new_tokens=12))
  for b, prompt in enumerate(PROMPTS):
    with torch.no_grad():
      # An explicit mask: generate would otherwise mask prompt tokens equal to pad_token_id.
      want = hf_model.generate(torch.as_tensor([prompt]),
                               attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                               do_sample=False, max_new_tokens=12, min_new_tokens=12,
                               pad_token_id=0)
    assert generated(out, b)[0] == want[0, len(prompt):].tolist()
  np.testing.assert_array_equal(np.asarray(ds.lengths), [len(p) + 12 for p in PROMPTS])


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, max_new_tokens=10),
    SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=10),
    SamplingParams(temperature=0.0, max_new_tokens=10),
])
def test_logprobs_equal_training_forward(policy, params):
  _, config, graphdef, state, sampler = policy
  ds = sampler.prefill(state, PROMPTS)
  _, out = sampler.generate(state, ds, jax.random.key(1), params)
  rows = [p + generated(out, b)[0] for b, p in enumerate(PROMPTS)]
  train_logprobs, train_entropies = score_rows(graphdef, state, rows, params.temperature)
  for b, prompt in enumerate(PROMPTS):
    _, logprobs, entropies = generated(out, b)
    start = len(prompt) - 1
    # A cached decode against a full forward over MAX_LENGTH tokens: the same function, summed
    # in other orders.
    roundings = forward_roundings(config, MAX_LENGTH, logprobs=True)
    assert_close(logprobs, train_logprobs[b][start:], steps=roundings)
    assert_close(entropies, train_entropies[b][start:], steps=roundings)
    # The PPO ratio π_train / π_sample therefore starts at 1: exp(δ) − 1 ≈ δ, and exp rounds.
    np.testing.assert_allclose(np.exp(train_logprobs[b][start:] - logprobs), 1.0, rtol=0,
                               atol=ulp_tol(np.float32, np.abs(train_logprobs[b]).max(), roundings)
                               + eps(np.float32))


@pytest.mark.slow
def test_fork_and_append_continue_like_a_fresh_prefill(policy):
  """Multi-turn: generate, fork a row, append a different observation to each fork, generate."""
  _, config, graphdef, state, sampler = policy
  greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
  ds = sampler.prefill(state, PROMPTS[:2])
  ds, first = sampler.generate(state, ds, jax.random.key(0), greedy)
  forked = sampling.fork(ds, rows=[1, 0], k=2)   # rows: 1, 1, 0, 0
  np.testing.assert_array_equal(np.asarray(forked.lengths),
                                np.asarray(ds.lengths)[[1, 1, 0, 0]])
  observations = {0: [3, 4, 5], 1: [6], 3: [7, 8]}  # row 2 gets no observation
  forked = sampler.append(state, forked, observations)
  forked, second = sampler.generate(state, forked, jax.random.key(0), greedy)

  histories = []
  for b, source in enumerate([1, 1, 0, 0]):
    histories.append(PROMPTS[source] + generated(first, source)[0] + observations.get(b, []))
  fresh = sampler.prefill(state, histories)
  _, reference = sampler.generate(state, fresh, jax.random.key(0), greedy)
  for b in range(4):
    got_tokens, got_logprobs, _ = generated(second, b)
    want_tokens, want_logprobs, _ = generated(reference, b)
    assert got_tokens == want_tokens
    assert_close(got_logprobs, want_logprobs,
                 steps=forward_roundings(config, MAX_LENGTH, logprobs=True))
  # Compaction: keep rows 3 and 0, in that order.
  kept = sampling.take_rows(forked, [3, 0])
  np.testing.assert_array_equal(np.asarray(kept.lengths), np.asarray(forked.lengths)[[3, 0]])
  np.testing.assert_array_equal(np.asarray(kept.next_logits),
                                np.asarray(forked.next_logits)[[3, 0]])


@pytest.mark.slow
def test_transposed_unembedding_is_made_once_per_embedding(policy, monkeypatch):
  """On the CPU a tied model's output projection over 2 rows or more runs on its embedding
  transposed, made at the first call and again only for another embedding array; the tokens are
  those of the model's own projection and the logprobs agree to float rounding."""
  _, config, graphdef, state, _ = policy
  sampler = sampling.Sampler(graphdef, config, MAX_LENGTH)
  kernel = sampler.unembedding(state, len(PROMPTS))
  np.testing.assert_array_equal(np.asarray(kernel), np.asarray(state["embed"][...]).T)
  assert sampler.unembedding(state, len(PROMPTS)) is kernel
  assert sampler.unembedding(state, 1) is None  # a single row: the model's own projection
  passed = []  # the kernel each compiled call of the Sampler receives
  for name in ("_prefill_jit", "_generate_jit"):
    compiled = getattr(sampling, name)
    monkeypatch.setattr(sampling, name, lambda *a, _f=compiled, **k: (
        passed.append(k["unembedding"]), _f(*a, **k))[1])
  params = SamplingParams(temperature=0.0, max_new_tokens=8)
  ds = sampler.prefill(state, PROMPTS)
  _, got = sampler.generate(state, ds, jax.random.key(0), params)
  sampler.generate(state, sampling.take_rows(ds, [0]), jax.random.key(0), params)
  assert passed[0] is kernel and passed[1] is kernel and passed[2] is None
  plain = sampling.prefill_tokens(graphdef, state, config, MAX_LENGTH,
                                  *map(jnp.asarray, sampling.pad_token_rows(PROMPTS)))
  _, want = sampling.generate(graphdef, state, plain, jax.random.key(0), params)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  # The output projection summed in another order (and other batch shapes in the programs).
  assert_close(got.logprobs, want.logprobs,
               steps=forward_roundings(config, MAX_LENGTH, logprobs=True))
  assert_close(ds.next_logits, plain.next_logits, steps=forward_roundings(config, MAX_LENGTH))
  # New parameters (an update): a new kernel from the new embedding, not the old one.
  updated = jax.tree_util.tree_map(lambda x: x, state)
  updated["embed"] = nnx.Param(2.0 * state["embed"][...])
  new_kernel = sampler.unembedding(updated, len(PROMPTS))
  assert new_kernel is not kernel
  np.testing.assert_array_equal(np.asarray(new_kernel), 2.0 * np.asarray(state["embed"][...]).T)
  untied = sampling.Sampler(graphdef, dataclasses.replace(config, tie_word_embeddings=False),
                            MAX_LENGTH)
  assert untied.unembedding(state, len(PROMPTS)) is None


def test_prefill_equals_an_append_to_an_empty_state(policy):
  """`prefill` builds the empty cache inside its compiled call: the same state as `append`."""
  _, _, _, state, sampler = policy
  got = sampler.prefill(state, PROMPTS)
  want = sampler.append(state, sampler.init_state(len(PROMPTS)), dict(enumerate(PROMPTS)))
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  np.testing.assert_array_equal(np.asarray(got.lengths), [len(p) for p in PROMPTS])
  with pytest.raises(ValueError, match="exceed the cache length"):
    sampler.prefill(state, [list(range(MAX_LENGTH + 1))])


@pytest.mark.slow
def test_stop_tokens_limits_and_inactive_rows(policy):
  _, _, _, state, sampler = policy
  ds = sampler.prefill(state, PROMPTS)
  _, free = sampler.generate(state, ds, jax.random.key(0),
                             SamplingParams(temperature=0.0, max_new_tokens=12))
  free_tokens = [generated(free, b)[0] for b in range(4)]
  stop_id = free_tokens[0][4]
  params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop_id,))
  after, out = sampler.generate(state, ds, jax.random.key(0), params,
                                active=[True, True, True, False])
  for b in range(3):
    tokens = generated(out, b)[0]
    n = free_tokens[b].index(stop_id) + 1 if stop_id in free_tokens[b] else 12
    assert tokens == free_tokens[b][:n]
    assert bool(out.stopped[b]) == (stop_id in free_tokens[b])
  assert int(out.num_tokens[0]) <= 5 and bool(out.stopped[0])
  assert int(out.num_tokens[3]) == 0 and not bool(out.stopped[3])   # inactive row untouched
  np.testing.assert_array_equal(np.asarray(after.lengths),
                                np.asarray(ds.lengths) + np.asarray(out.num_tokens))
  np.testing.assert_array_equal(np.asarray(after.next_logits[3]), np.asarray(ds.next_logits[3]))

  # A row whose cache fills up stops there, without a stop token.
  long_prompt = list(range(MAX_LENGTH - 3))
  full = sampler.prefill(state, [long_prompt, PROMPTS[0]])
  full, out = sampler.generate(state, full, jax.random.key(0),
                               SamplingParams(temperature=0.0, max_new_tokens=12))
  np.testing.assert_array_equal(np.asarray(out.num_tokens), [3, 12])
  np.testing.assert_array_equal(np.asarray(out.stopped), [False, False])
  np.testing.assert_array_equal(np.asarray(full.lengths), [MAX_LENGTH, len(PROMPTS[0]) + 12])


@pytest.mark.parametrize("params,per_row_keys", [
    (SamplingParams(temperature=1.0, max_new_tokens=7), False),
    (SamplingParams(temperature=0.8, top_k=6, max_new_tokens=7), True),
    (SamplingParams(temperature=0.0, max_new_tokens=1), False),
])
@pytest.mark.slow
def test_generate_without_keeping_the_state_emits_the_same(policy, params, per_row_keys):
  """keep_state=False skips the forward of each row's last token; what is emitted is the same,
  with stop tokens, a full cache and an inactive row, and with one key or one key per row."""
  _, config, _, state, sampler = policy
  rows = PROMPTS[:3] + [list(range(MAX_LENGTH - 4))]  # the last row fills its cache at 4 tokens
  ds = sampler.prefill(state, rows)
  key = jax.random.split(jax.random.key(3), len(rows)) if per_row_keys else jax.random.key(3)
  _, free = sampler.generate(state, ds, key, params)
  stop_id = int(free.tokens[0, min(2, params.max_new_tokens - 1)])
  params = dataclasses.replace(params, stop_token_ids=(stop_id,))
  active = [True, True, False, True]
  kept, want = sampler.generate(state, ds, key, params, active=active)
  dropped, got = sampler.generate(state, ds, key, params, active=active, keep_state=False)
  assert kept is not None and dropped is None
  for field in ("tokens", "mask", "stopped", "num_tokens"):
    np.testing.assert_array_equal(np.asarray(getattr(got, field)), np.asarray(getattr(want, field)))
  for field in ("logprobs", "entropies"):
    assert_close(getattr(got, field), getattr(want, field),
                 steps=forward_roundings(config, MAX_LENGTH, logprobs=True))
  assert int(got.num_tokens[2]) == 0 and int(got.num_tokens[0]) >= 1
  if params.max_new_tokens > 4:
    assert int(got.num_tokens[3]) <= 4 and bool(got.stopped[0])


def test_sample_logits_draws_from_the_truncated_distribution():
  logits = np.asarray([2.0, 1.5, 1.0, 0.5, 0.0, -3.0], np.float32)
  params = SamplingParams(temperature=0.5, top_k=4, top_p=0.9)
  # By hand: p ∝ exp(logits / 0.5) = e^[4, 3, 2, 1, 0, -6]; top-4 keeps the first four
  # (masses 0.644, 0.237, 0.087, 0.032); the nucleus keeps tokens whose preceding mass < 0.9:
  # tokens 0, 1, 2 (0.644 + 0.237 = 0.881 < 0.9, then 0.968).
  p = np.exp(np.asarray([4.0, 3.0, 2.0]))
  p /= p.sum()
  n = 40_000
  tokens, logprobs, entropies = jax.jit(sampling.sample_logits, static_argnums=2)(
      jnp.tile(jnp.asarray(logits), (n, 1)), jax.random.key(0), params)
  counts = np.bincount(np.asarray(tokens), minlength=6)
  assert counts[3:].sum() == 0
  sigma = np.sqrt(n * p * (1 - p))
  assert np.all(np.abs(counts[:3] - n * p) < 5 * sigma), (counts, n * p)
  # Reported numbers: the untruncated temperature-scaled distribution.
  full = np.exp(logits / 0.5 - np.log(np.exp(logits / 0.5).sum()))
  # float32 against float64: a scaling, a log-sum-exp over 6 logits and a subtraction.
  assert_close(logprobs, np.log(full)[np.asarray(tokens)], steps=sum_roundings(6) + 4)
  assert_close(entropies, -(full * np.log(full)).sum(), steps=2 * sum_roundings(6) + 4)


@pytest.mark.slow
def test_argmax_and_draws_equal_jax_argmax_and_categorical():
  # Ties go to the first index, as argmax has it.
  np.testing.assert_array_equal(
      sampling.first_index_of_max(jnp.asarray([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]])), [1, 0])
  rng = np.random.RandomState(0)
  logits = jnp.asarray(rng.randn(8, 300).astype(np.float32))
  logits = logits.at[0, :5].set(-jnp.inf).at[1, 7].set(logits[1, 3])
  np.testing.assert_array_equal(sampling.first_index_of_max(logits), jnp.argmax(logits, axis=-1))
  # A draw takes the Gumbel noise `categorical` takes from the same key: the same tokens.
  for seed in range(5):
    key = jax.random.key(seed)
    np.testing.assert_array_equal(
        jax.jit(sampling.sample_logits, static_argnums=2)(
            logits, key, SamplingParams(temperature=1.0))[0],
        jax.random.categorical(key, logits, axis=-1))
    row_keys = jax.random.split(key, 8)
    np.testing.assert_array_equal(
        sampling.sample_logits(logits, row_keys, SamplingParams(temperature=1.0))[0],
        jax.vmap(jax.random.categorical)(row_keys, logits))


def test_decode_loop_compiles_once_per_shape(policy):
  _, _, _, state, sampler = policy
  params = SamplingParams(temperature=1.0, max_new_tokens=4)
  ds = sampler.prefill(state, PROMPTS)
  sampler.generate(state, ds, jax.random.key(0), params)
  before = sampling._generate_jit._cache_size()  # pylint: disable=protected-access
  ds = sampler.prefill(state, [p[::-1] for p in PROMPTS])
  for seed in range(3):
    ds, out = sampler.generate(state, ds, jax.random.key(seed), params)
  assert sampling._generate_jit._cache_size() == before  # pylint: disable=protected-access
  np.testing.assert_array_equal(np.asarray(out.num_tokens), [4, 4, 4, 4])


@pytest.mark.slow
def test_attention_window_gives_the_numbers_of_the_whole_cache(policy, monkeypatch):
  """A 320-slot sampler attends over a 256-slot window; a 48-slot one over its whole cache.

  Generate, fork, append and generate again on both: the same tokens and numbers, and the
  window write-back leaves every row's cache as the whole-cache run's.
  """
  _, config, graphdef, state, small = policy
  large = sampling.Sampler(graphdef, config, 320)
  windows = []
  generate_jit = sampling._generate_jit  # pylint: disable=protected-access

  def spy(*args, attend_length=None, **kwargs):
    windows.append((args[2].cache.max_length, attend_length))
    return generate_jit(*args, attend_length=attend_length, **kwargs)

  monkeypatch.setattr(sampling, "_generate_jit", spy)
  greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
  results = []
  for sampler in (small, large):
    ds = sampler.prefill(state, PROMPTS)
    ds, first = sampler.generate(state, ds, jax.random.key(0), greedy)
    ds = sampler.append(state, sampling.fork(ds, rows=[1, 0], k=2),
                        {0: [3, 4, 5], 1: [6], 3: [7, 8]})
    ds, second = sampler.generate(state, ds, jax.random.key(0), greedy)
    results.append((ds, first, second))
  assert windows == [(48, 48), (48, 48), (320, 256), (320, 256)]
  (small_ds, *small_outs), (large_ds, *large_outs) = results
  # Softmax sums over 48 or 256 slots (the extra terms exactly 0) and matmuls over other shapes
  # may round differently: the numbers agree to a forward's roundings at 256 slots, not bit for
  # bit (XLA's CPU code, and so its rounding, differs between processors).
  logprob_roundings = forward_roundings(config, 256, logprobs=True)
  for small_out, large_out in zip(small_outs, large_outs):
    np.testing.assert_array_equal(np.asarray(large_out.tokens), np.asarray(small_out.tokens))
    np.testing.assert_array_equal(np.asarray(large_out.mask), np.asarray(small_out.mask))
    assert_close(large_out.logprobs, small_out.logprobs, steps=logprob_roundings)
    assert_close(large_out.entropies, small_out.entropies, steps=logprob_roundings)
  np.testing.assert_array_equal(np.asarray(large_ds.lengths), np.asarray(small_ds.lengths))
  assert_close(large_ds.next_logits, small_ds.next_logits, steps=forward_roundings(config, 256))
  # Keys and values after at most every layer.
  cache_roundings = forward_roundings(config, 256, layers=config.num_layers)
  for b, n in enumerate(np.asarray(small_ds.lengths)):
    for got, want in zip(large_ds.cache.keys, small_ds.cache.keys):  # [B, Hkv, D, S]
      assert_close(got[b, ..., :n], want[b, ..., :n], steps=cache_roundings)
    for got, want in zip(large_ds.cache.values, small_ds.cache.values):  # [B, Hkv, S, D]
      assert_close(got[b, :, :n], want[b, :, :n], steps=cache_roundings)


def test_attention_windows_by_hand(policy):
  _, config, graphdef, state, _ = policy
  assert sampling.MIN_ATTEND_LENGTH == 256
  assert sampling.attend_length_for([100, 40], 1024) == 256
  assert sampling.attend_length_for([256], 1024) == 256
  assert sampling.attend_length_for([257, 3], 1024) == 512
  assert sampling.attend_length_for([1500], 1024) == 1024   # rows stop at the cache's end
  assert sampling.attend_length_for([300], 384) == 384
  assert sampling.attend_length_for([], 48) == 48
  assert sampling.attend_length_for([5], 64, minimum=16) == 16
  ds = sampling.init_decode_state(config, 2, 48)
  with pytest.raises(ValueError, match=r"attend_length must be in \[1, 48\]"):
    sampling.generate(graphdef, state, ds, jax.random.key(0), SamplingParams(),
                      attend_length=64)


def test_bucketing():
  assert sampling.bucket_length(3) == 16
  assert sampling.bucket_length(17) == 32
  assert sampling.bucket_length(64) == 64
  assert sampling.bucket_length(40, maximum=48) == 48
  tokens, lengths = sampling.pad_token_rows([[5, 6, 7], [8]])
  assert tokens.shape == (2, 16)
  np.testing.assert_array_equal(tokens[:, :3], [[5, 6, 7], [8, 0, 0]])
  np.testing.assert_array_equal(lengths, [3, 1])
  with pytest.raises(ValueError, match="exceed the maximum length 48"):
    sampling.bucket_length(49, maximum=48)


def test_bad_inputs_get_clear_errors(policy):
  _, _, _, state, sampler = policy
  with pytest.raises(ValueError, match="temperature"):
    SamplingParams(temperature=-0.5)
  with pytest.raises(ValueError, match="top_p"):
    SamplingParams(top_p=0.0)
  with pytest.raises(ValueError, match="top_k"):
    SamplingParams(top_k=-1)
  with pytest.raises(ValueError, match="max_new_tokens"):
    SamplingParams(max_new_tokens=0)
  with pytest.raises(ValueError, match=r"token ids must be in \[0, 97\)"):
    sampler.prefill(state, [[1, 2, 97]])
  ds = sampler.prefill(state, [list(range(40)), [1]])
  with pytest.raises(ValueError, match=r"rows \[0\] would exceed the cache length 48"):
    sampler.append(state, ds, {0: list(range(9)), 1: [2]})
  with pytest.raises(ValueError, match="row 2 is out of range"):
    sampler.append(state, ds, {2: [1]})
  with pytest.raises(ValueError, match="active must have shape"):
    sampler.generate(state, ds, jax.random.key(0), SamplingParams(), active=[True])
  with pytest.raises(ValueError, match="k must be positive"):
    sampling.fork(ds, [0], 0)


@pytest.mark.slow
def test_per_row_keys_make_a_row_independent_of_its_batch_mates(policy):
  _, config, _, state, sampler = policy
  params = SamplingParams(temperature=1.0, max_new_tokens=6)
  keys = jax.random.split(jax.random.key(3), len(PROMPTS))
  _, together = sampler.generate(state, sampler.prefill(state, PROMPTS), keys, params)
  for b in (1, 3):
    _, alone = sampler.generate(state, sampler.prefill(state, [PROMPTS[b]]), keys[b:b + 1],
                                params)
    tokens, logprobs, entropies = generated(together, b)
    assert generated(alone, 0)[0] == tokens
    # One row against four: matmuls over other batch shapes round differently.
    roundings = forward_roundings(config, MAX_LENGTH, logprobs=True)
    assert_close(generated(alone, 0)[1], logprobs, steps=roundings)
    assert_close(generated(alone, 0)[2], entropies, steps=roundings)
  # Raw uint32 keys [B, 2] are per-row keys too, and a row's token at step s is drawn with
  # fold_in(key[b], s): the first token is categorical(fold_in(key[b], 0), logits[b]).
  raw = jax.random.key_data(keys)
  ds = sampler.prefill(state, PROMPTS)
  _, from_raw = sampler.generate(state, ds, raw, params)
  np.testing.assert_array_equal(np.asarray(from_raw.tokens), np.asarray(together.tokens))
  first = [int(jax.random.categorical(jax.random.fold_in(raw[b], 0), ds.next_logits[b]))
           for b in range(len(PROMPTS))]
  np.testing.assert_array_equal(np.asarray(together.tokens[:, 0]), first)
  assert len({tuple(generated(together, b)[0]) for b in range(len(PROMPTS))}) > 1
  with pytest.raises(ValueError, match="per-row keys must number 4 .the batch size., got 3"):
    sampler.generate(state, ds, keys[:3], params)


def test_lowered_generate_compiles_to_what_generate_samples(policy):
  """`Sampler.lower_generate` (what the dry run compiles), called on concrete inputs, samples
  `generate`'s tokens: attending to the whole cache instead of generate's window sums the same
  terms in other orders. One row, so `generate` uses the model's own output projection too."""
  _, config, _, state, sampler = policy
  params = SamplingParams(temperature=1.0, max_new_tokens=6)
  key, active = jax.random.split(jax.random.key(3), 1), jnp.ones((1,), bool)
  want_state, want = sampler.generate(state, sampler.prefill(state, PROMPTS[1:2]), key, params,
                                      active)
  decode_state = sampler.prefill(state, PROMPTS[1:2])
  abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
  compiled = sampler.lower_generate(abstract(state), abstract(decode_state), abstract(key),
                                    params, abstract(active)).compile()
  got_state, got = compiled(state, decode_state, key, active, unembedding=None,
                            settings=params.settings())
  assert generated(got, 0)[0] == generated(want, 0)[0] and int(got.num_tokens[0]) == 6
  roundings = forward_roundings(config, MAX_LENGTH, logprobs=True)
  assert_close(generated(got, 0)[1], generated(want, 0)[1], steps=roundings)
  np.testing.assert_array_equal(np.asarray(got_state.lengths), np.asarray(want_state.lengths))


def test_one_decode_program_serves_every_draw_setting(policy):
  """Temperature, greedy, top-k and top-p are data of the decode loop: greedy evaluation and
  tempered, truncated sampling run one compiled program per shape. Greedy takes the argmax,
  which a top-1 draw at temperature 1 also gives (the kept token alone has mass)."""
  _, _, _, state, sampler = policy
  ds = sampler.prefill(state, PROMPTS)
  settings = [SamplingParams(temperature=0.0, max_new_tokens=5),
              SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=5),
              SamplingParams(temperature=1.0, top_k=1, max_new_tokens=5),
              SamplingParams(temperature=1.3, greedy=True, max_new_tokens=5)]
  _, first = sampler.generate(state, ds, jax.random.key(0), settings[0])
  before = sampling._generate_jit._cache_size()  # pylint: disable=protected-access
  outs = [first] + [sampler.generate(state, ds, jax.random.key(1), p)[1] for p in settings[1:]]
  assert sampling._generate_jit._cache_size() == before  # pylint: disable=protected-access
  np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[2].tokens))
  np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[3].tokens))
  # The greedy path's numbers are those of softmax(logits / 1.3): larger entropies than at 1.
  mask = np.asarray(outs[0].mask)
  assert np.all(np.asarray(outs[3].entropies)[mask] > np.asarray(outs[0].entropies)[mask])


@pytest.mark.slow
def test_a_donating_sampler_reuses_the_state_and_gives_the_same_numbers(policy):
  """`Sampler(donate=True)`: `append` and `generate` take over the DecodeState passed in (its
  arrays are deleted: the result lives in their buffers), and the tokens and numbers are those
  of the sampler that copies."""
  _, config, graphdef, state, plain = policy
  donating = sampling.Sampler(graphdef, config, MAX_LENGTH, donate=True)
  params = SamplingParams(temperature=1.0, max_new_tokens=6)
  results = []
  for sampler in (plain, donating):
    ds = sampler.prefill(state, PROMPTS)
    given = ds
    ds, first = sampler.generate(state, ds, jax.random.key(0), params)
    assert given.cache.keys[0].is_deleted() == sampler.donate
    given = ds
    ds = sampler.append(state, ds, {0: [3, 4, 5], 2: [6]})
    assert given.cache.values[0].is_deleted() == sampler.donate
    _, probe = sampler.generate(state, ds, jax.random.key(1), params, keep_state=False)
    assert not ds.cache.keys[0].is_deleted()  # a probe keeps the state it reads
    ds, second = sampler.generate(state, ds, jax.random.key(2), params)
    results.append([np.asarray(x) for out in (first, probe, second)
                    for x in (out.tokens, out.logprobs)] + [np.asarray(ds.next_logits)])
  for a, b in zip(*results):
    np.testing.assert_array_equal(a, b)
