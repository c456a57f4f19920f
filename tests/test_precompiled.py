"""The sampler's closed program set: the enumerated shapes are exactly those the bucket rules
give, and a sampler run from precompiled executables gives the same numbers with no compile."""

import itertools

import jax
import numpy as np
import pytest
from flax import nnx

from bpo_jax import models
from bpo_jax import precompiled
from bpo_jax import sampling
from bpo_jax import sampling_shapes as shapes
from bpo_jax import sharding
from bpo_jax.models import ModelConfig
from bpo_jax.sampling_shapes import ProgramKey
from bpo_jax.testing import model_rounding
from bpo_jax.testing import tolerance
from bpo_jax.training import compile_cache
from bpo_jax.training import translate


def test_buckets_and_windows_by_hand():
  assert shapes.token_buckets(320) == [16, 32, 64, 128, 256, 320]
  assert shapes.token_buckets(256) == [16, 32, 64, 128, 256]
  assert shapes.token_buckets(8) == [8]
  assert shapes.windows(1024) == [256, 512, 1024]
  assert shapes.windows(320) == [256, 320]
  assert shapes.windows(100) == [100]
  assert shapes.batch_sizes((8, 16, 32), 4) == [8]
  assert shapes.batch_sizes((8, 16, 32), 20) == [8, 16, 32]
  assert shapes.batch_sizes((8, 16, 32), 70) == [8, 16, 32, 64, 96]


def test_the_quickstart_set_by_hand():
  """8 rows, 320 slots: appends (T, 256) for T = 16..256 and (T, 320) for T = 16..320, then
  the decode loops at 256 and 320 (with the probe's beside them)."""
  keys = shapes.sampler_program_keys([8], 320)
  appends = [(k.tokens, k.window) for k in keys if k.name == "append"]
  assert appends == ([(t, 256) for t in (16, 32, 64, 128, 256)]
                     + [(t, 320) for t in (16, 32, 64, 128, 256, 320)])
  assert [k for k in keys if k.name == "generate"] == [
      ProgramKey("generate", 8, 0, 256), ProgramKey("generate", 8, 0, 320)]
  probed = shapes.sampler_program_keys([8, 16], 320, probe=True)
  assert len(probed) == 2 * (11 + 4)
  assert ProgramKey("generate", 16, 0, 320, keep_state=False) in probed


def _shapes_the_rules_give(max_length: int, max_new_tokens: int):
  """(T, w) of every append and w of every decode loop, by running the bucket rules on every
  (tokens appended n, row length after ℓ ≥ n) and every length before a decode."""
  lengths = range(1, max_length + 1)
  tokens = {n: shapes.bucket_length(n, maximum=max_length) for n in lengths}
  window = {n: shapes.attend_length_for([n], max_length) for n in lengths}
  appends = {(tokens[n], max(window[after], tokens[n]))
             for n, after in itertools.product(lengths, repeat=2) if n <= after}
  decodes = {shapes.attend_length_for([before + max_new_tokens], max_length)
             for before in range(1, max_length + 1)}
  return appends, decodes


def test_the_set_is_exactly_what_the_bucket_rules_reach():
  for max_length in (48, 256, 320, 600):
    appends, decodes = _shapes_the_rules_give(max_length, max_new_tokens=5)
    keys = shapes.sampler_program_keys([8], max_length)
    assert {(k.tokens, k.window) for k in keys if k.name == "append"} == appends, max_length
    assert {k.window for k in keys if k.name == "generate"} == decodes, max_length


def test_bounded_appends_are_exactly_what_the_rules_reach_from_empty_rows_and_short_appends():
  """A call's first append on empty rows (prompts of n ≤ P tokens: the longest row holds n),
  later ones of n ≤ O tokens onto rows of any length: the (T, w) pairs the rules give."""
  for max_length, longest_prompt, longest_append in ((48, 30, 5), (320, 100, 40), (600, 700, 17),
                                                     (1100, 300, 300)):
    lengths = range(1, max_length + 1)
    tokens = {n: shapes.bucket_length(n, maximum=max_length) for n in lengths}
    window = {n: shapes.attend_length_for([n], max_length) for n in lengths}
    prefills = {(tokens[n], max(window[n], tokens[n]))
                for n in range(1, min(longest_prompt, max_length) + 1)}
    appends = {(tokens[n], max(window[after], tokens[n]))
               for n, after in itertools.product(lengths, repeat=2)
               if n <= min(after, longest_append)}
    bounds = shapes.AppendBounds((8,), longest_prompt, longest_append)
    keys = shapes.sampler_program_keys([8, 16], max_length, bounds=bounds)
    got = {(k.batch, k.tokens, k.window) for k in keys if k.name == "append"}
    want = ({(8, t, w) for t, w in prefills | appends} | {(16, t, w) for t, w in appends})
    assert got == want, max_length
  # The docstring's example: 3 + 3 appends after the prefill, and its (128, 256).
  keys = shapes.sampler_program_keys([8], 320, bounds=shapes.AppendBounds((8,), 100, 40))
  assert [(k.tokens, k.window) for k in keys if k.name == "append"] == [
      (16, 256), (32, 256), (64, 256), (128, 256), (16, 320), (32, 320), (64, 320)]


CONFIG = ModelConfig.tiny_qwen3(vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=8,
                                tie_word_embeddings=True)
LIMITS = sampling.SamplingParams(max_new_tokens=4, stop_token_ids=(3,))


def _decode(sampler, state, prompts, observation, mesh=None):
  """Prefill 2 rows (of a batch of 8), decode, append an observation to row 0, decode again
  (on `mesh`: the rows' cache laid out there)."""
  ds = sampler.append(state, sampler.init_state(8, mesh), dict(enumerate(prompts)))
  keys = jax.random.split(jax.random.key(0), 8)
  active = np.arange(8) < 2
  ds, first = sampler.generate(state, ds, keys, LIMITS, active)
  ds = sampler.append(state, ds, {0: observation})
  ds, second = sampler.generate(state, ds, keys, LIMITS, active)
  return ds, first, second


@pytest.mark.slow
def test_a_sampler_on_its_program_set_compiles_nothing_and_gives_the_same_numbers():
  graphdef, state = nnx.split(models.Decoder(CONFIG, rngs=nnx.Rngs(0)))
  prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
  lazy = sampling.Sampler(graphdef, CONFIG, 48, donate=True)
  expected = _decode(lazy, state, prompts, [13, 14])
  programs = precompiled.ProgramSet(LIMITS.limits())
  sampler = sampling.Sampler(graphdef, CONFIG, 48, donate=True, programs=programs)
  keys = [k for k in shapes.sampler_program_keys([8], 48) if k.tokens in (0, 16)]
  precompiled.compile_sampler_programs(programs, sampler, precompiled.abstract(state), keys)
  assert list(programs.seconds) == keys  # append (16, 48) and the decode loop at 48
  counter = compile_cache.CompileCounter()
  got = _decode(sampler, state, prompts, [13, 14])
  names = {name for name, _ in counter.log}
  assert not names & {"jit(append_tokens)", "jit(generate)"}, counter.log
  assert (programs.hits, programs.misses) == (4, 0)  # 2 appends, 2 decode loops
  for want, have in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(want), np.asarray(have))
  # 17 tokens pad to 32: outside the set, run all the same, counted and compiled on the call.
  observation = {1: list(range(20, 37))}
  want = lazy.append(state, expected[0], observation)
  have = sampler.append(state, got[0], observation)
  assert programs.misses == 1 and programs.missed == [ProgramKey("append", 8, 32, 48)]
  assert "jit(append_tokens)" in {name for name, _ in counter.log}
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(have)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_sampler_on_a_mesh_runs_from_its_set_with_the_numbers_of_one_device():
  """Parameters in the sampling layout of a mesh fsdp 2 x tensor 2 (the tied embedding's
  vocabulary split over "tensor", so the CPU's transposed copy is split too): the set lowered on
  their abstract layout runs every append and decode loop (an input laid out otherwise would
  be refused by the executable), compiles none of them, and gives one device's tokens, with
  logprobs within the rounding of sums split over "tensor"."""
  graphdef, state = nnx.split(models.Decoder(CONFIG, rngs=nnx.Rngs(0)))
  prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
  expected = _decode(sampling.Sampler(graphdef, CONFIG, 48, donate=True), state, prompts,
                     [13, 14])
  mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=2, tensor=2), jax.devices()[:4])
  laid_out = jax.device_put(state, sharding.param_shardings(state, mesh,
                                                             sharding.SAMPLING_RULES))
  assert laid_out["embed"][...].sharding.spec[0] == "tensor"
  programs = precompiled.ProgramSet(LIMITS.limits())
  sampler = sampling.Sampler(graphdef, CONFIG, 48, donate=True, programs=programs)
  keys = [k for k in shapes.sampler_program_keys([8], 48) if k.tokens in (0, 16)]
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          laid_out)
  precompiled.compile_sampler_programs(programs, sampler, abstract, keys)
  counter = compile_cache.CompileCounter()
  got = _decode(sampler, laid_out, prompts, [13, 14], mesh)
  assert not {name for name, _ in counter.log} & {"jit(append_tokens)", "jit(generate)"}
  assert (programs.hits, programs.misses) == (4, 0)
  for want, have in zip(expected[1:], got[1:]):
    np.testing.assert_array_equal(np.asarray(want.tokens), np.asarray(have.tokens))
    # Log-probabilities of at most log(64) ≈ 4.2 in magnitude, from logits of about as much.
    steps = model_rounding.forward_roundings(CONFIG, attended_slots=48, logprobs=True)
    tolerance.assert_close(np.asarray(have.logprobs), np.asarray(want.logprobs), steps=steps,
                           magnitude=max(8.0, float(np.abs(np.asarray(want.logprobs)).max())))


@pytest.mark.slow
def test_a_paged_sampler_runs_from_its_set_on_its_fixed_pool_and_misses_on_another():
  """A paged sampler of a fixed pool (`pool_pages`, as a run's engine has): its set holds the
  appends, decode loops and the forks' next-logit move; the calls compile none of them and
  give the numbers of a sampler without a set. A state on a pool of another size (one that grew)
  runs all the same, outside the set, and counts as a miss."""
  graphdef, state = nnx.split(models.Decoder(CONFIG, rngs=nnx.Rngs(0)))
  prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
  pool = translate.kv_pool_pages(8, 48, 8)  # 8 rows x (6 pages + 1) + the null page = 57
  lazy = sampling.Sampler(graphdef, CONFIG, 48, donate=True, page_size=8, pool_pages=pool)
  expected = _decode(lazy, state, prompts, [13, 14])
  programs = precompiled.ProgramSet(LIMITS.limits())
  sampler = sampling.Sampler(graphdef, CONFIG, 48, donate=True, page_size=8, pool_pages=pool,
                             programs=programs)
  keys = [k for k in shapes.sampler_program_keys([8], 48) if k.tokens in (0, 16)]
  precompiled.compile_sampler_programs(programs, sampler, precompiled.abstract(state), keys)
  assert list(programs.seconds) == keys + [ProgramKey("place_logits", 8, 0, 0)]
  counter = compile_cache.CompileCounter()
  got = _decode(sampler, state, prompts, [13, 14])
  assert not {name for name, _ in counter.log} & {"jit(append_tokens)", "jit(generate)"}
  assert (programs.hits, programs.misses) == (4, 0)
  for want, have in zip(jax.tree.leaves(expected[1:]), jax.tree.leaves(got[1:])):
    np.testing.assert_array_equal(np.asarray(want), np.asarray(have))
  grown = sampling.Sampler(graphdef, CONFIG, 48, donate=True, page_size=8).init_state(8)
  assert grown.cache.num_pages == 8 * 6 + 1 != pool
  sampler.append(state, grown, {0: [5, 6]})
  assert programs.misses == 1 and programs.missed == [ProgramKey("append", 8, 16, 48)]
  with pytest.raises(ValueError, match="a paged one of a fixed pool"):
    precompiled.compile_sampler_programs(
        programs, sampling.Sampler(graphdef, CONFIG, 48, donate=True, page_size=8),
        precompiled.abstract(state), keys)
