"""Continued prefill and decode time of the sampler's windowed attention against attending over
the whole cache.

The sampler attends only over the cache slots that can hold data (`Sampler.append` /
`Sampler.generate` pick a power-of-two window from the row lengths, see `bpo_jax.sampling`).
The reference, measured side by side in the same process, is the same jitted functions with
`attend_length=None`: every call reads all `max_length` slots of every row, as before windows.

For each cache length (default 512 and 1024): a batch of rows of about `--row-length` tokens
(random lengths within ±20%) of a ~10M parameter Qwen2-style random decoder (fp32), then

* append: an observation of `--observation-length` tokens into every row (continued prefill);
* decode: `--new-tokens` greedy tokens per row (one `generate` call, no stop token);

medians of `--repeats` runs after a warm-up (compilation excluded), the two sides' runs
interleaved so that the machine's load drifts on both alike. Both sides must give the same
next-token logits, tokens and logprobs (checked; max differences printed).

  python benchmarks/cached_attention.py [--json] [--max-lengths 512,1024] [--batch 16]
                                        [--row-length 100] [--repeats 9]

With `--json` it prints one JSON object: per-case seconds of both sides and their ratios
(`append_speedup`, `decode_speedup` = reference seconds / windowed seconds),
`min_append_speedup_vs_whole_cache` and `min_decode_speedup_vs_whole_cache`.
"""

import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402
from bpo_jax import models  # pylint: disable=g-import-not-at-top
from bpo_jax import sampling  # pylint: disable=g-import-not-at-top

# The "10M" case of benchmarks/sampling.py.
CONFIG = models.ModelConfig(vocab_size=8192, hidden_size=256, intermediate_size=1024,
                            num_layers=8, num_heads=4, num_kv_heads=2, head_dim=64,
                            rope_theta=1_000_000.0)

whole_cache_append = jax.jit(sampling.append_tokens, static_argnums=(0,))
whole_cache_generate = jax.jit(sampling.generate, static_argnums=(0, 4))


def interleaved_median_seconds(fns, repeats):
  """Median wall time of each of `fns` (each blocks on its outputs), run in turn per repeat."""
  for fn in fns:
    jax.block_until_ready(fn())  # warm-up: compilation, allocator
  times = [[] for _ in fns]
  for _ in range(repeats):
    for fn, fn_times in zip(fns, times):
      start = time.perf_counter()
      jax.block_until_ready(fn())
      fn_times.append(time.perf_counter() - start)
  return [statistics.median(t) for t in times]


def run_case(graphdef, state, max_length, batch, row_length, observation_length, new_tokens,
             repeats):
  rng = np.random.RandomState(max_length)
  lengths = rng.randint(int(row_length * 0.8), int(row_length * 1.2) + 1, batch)
  rows = [rng.randint(1, CONFIG.vocab_size, n).tolist() for n in lengths]
  observations = {b: rng.randint(1, CONFIG.vocab_size, observation_length).tolist()
                  for b in range(batch)}
  sampler = sampling.Sampler(graphdef, CONFIG, max_length)
  decode_state = sampler.prefill(state, rows)
  params = sampling.SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
  key = jax.random.key(0)
  obs_tokens, obs_lengths = sampling.pad_token_rows(
      [observations[b] for b in range(batch)], maximum=max_length)
  obs_tokens, obs_lengths = jnp.asarray(obs_tokens), jnp.asarray(obs_lengths)
  results = {}

  def windowed_append():
    results["append"] = sampler.append(state, decode_state, observations)
    return results["append"].next_logits

  def reference_append():
    results["append_ref"] = whole_cache_append(graphdef, state, decode_state, obs_tokens,
                                               obs_lengths)
    return results["append_ref"].next_logits

  def windowed_decode():
    results["decode"] = sampler.generate(state, decode_state, key, params)[1]
    return results["decode"].tokens

  def reference_decode():
    results["decode_ref"] = whole_cache_generate(graphdef, state, decode_state, key, params)[1]
    return results["decode_ref"].tokens

  append_s, append_ref_s = interleaved_median_seconds([windowed_append, reference_append],
                                                      repeats)
  decode_s, decode_ref_s = interleaved_median_seconds([windowed_decode, reference_decode],
                                                      repeats)
  window = sampling.attend_length_for(np.asarray(decode_state.lengths) + new_tokens, max_length)
  logits_diff = float(jnp.max(jnp.abs(results["append"].next_logits
                                      - results["append_ref"].next_logits)))
  logprob_diff = float(jnp.max(jnp.abs(results["decode"].logprobs
                                       - results["decode_ref"].logprobs)))
  return dict(
      max_length=max_length, batch=batch, mean_row_length=float(lengths.mean()),
      decode_window=window, append_seconds=append_s, append_whole_cache_seconds=append_ref_s,
      append_speedup=append_ref_s / append_s, decode_seconds=decode_s,
      decode_whole_cache_seconds=decode_ref_s, decode_speedup=decode_ref_s / decode_s,
      decode_tokens_per_s=batch * new_tokens / decode_s,
      decode_whole_cache_tokens_per_s=batch * new_tokens / decode_ref_s,
      max_next_logits_difference=logits_diff, max_logprob_difference=logprob_diff,
      tokens_agree=bool(np.array_equal(np.asarray(results["decode"].tokens),
                                       np.asarray(results["decode_ref"].tokens))))


def main():
  parser = common.parser(__doc__.split("\n\n")[0], repeats=9)
  parser.add_argument("--max-lengths", default="512,1024", help="cache lengths, comma separated")
  parser.add_argument("--batch", type=int, default=16, help="rows")
  parser.add_argument("--row-length", type=int, default=100, help="tokens per row (mean)")
  parser.add_argument("--observation-length", type=int, default=32, help="tokens appended")
  parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per row")
  args = parser.parse_args()

  graphdef, state = nnx.split(models.Decoder(CONFIG, rngs=nnx.Rngs(0)))
  cases = []
  for max_length in map(int, args.max_lengths.split(",")):
    case = run_case(graphdef, state, max_length, args.batch, args.row_length,
                    args.observation_length, args.new_tokens, args.repeats)
    cases.append(case)
    if not args.json:
      print(f"max_length {max_length:>5}, {args.batch} rows of ~{case['mean_row_length']:.0f} "
            f"tokens:\n"
            f"  append {args.observation_length} tokens: windowed {case['append_seconds'] * 1e3:8.1f}"
            f" ms, whole cache {case['append_whole_cache_seconds'] * 1e3:8.1f} ms, speedup "
            f"{case['append_speedup']:.2f}x (next logits differ by "
            f"{case['max_next_logits_difference']:.1e})\n"
            f"  decode {args.new_tokens} tokens (window {case['decode_window']}): windowed "
            f"{case['decode_tokens_per_s']:8.1f} tok/s, whole cache "
            f"{case['decode_whole_cache_tokens_per_s']:8.1f} tok/s, speedup "
            f"{case['decode_speedup']:.2f}x (tokens agree: {case['tokens_agree']}, logprobs "
            f"differ by {case['max_logprob_difference']:.1e})", flush=True)
  summary = dict(
      reference="the same jitted append / generate attending over the whole cache "
                "(attend_length=None)",
      device=jax.devices()[0].platform, num_params=CONFIG.num_params(), batch=args.batch,
      row_length=args.row_length, observation_length=args.observation_length,
      new_tokens=args.new_tokens, repeats=args.repeats, cases=cases,
      min_append_speedup_vs_whole_cache=min(c["append_speedup"] for c in cases),
      min_decode_speedup_vs_whole_cache=min(c["decode_speedup"] for c in cases))
  if args.json:
    print(json.dumps(summary))
  else:
    print(f"min_append_speedup_vs_whole_cache: {summary['min_append_speedup_vs_whole_cache']:.2f}"
          f"\nmin_decode_speedup_vs_whole_cache: {summary['min_decode_speedup_vs_whole_cache']:.2f}")


if __name__ == "__main__":
  main()
