"""Decode throughput of the jitted sampler against transformers' PyTorch `generate`.

For a ~10M and a ~100M parameter Qwen2-style config, at batch 1, 8 and 32: both sides load the
same random weights (written once with `save_pretrained`), prefill the same prompts and decode
the same number of new tokens greedily (no stop token), timed end to end (prefill included,
compilation excluded), side by side in one process: each of `--repeats` rounds times one run of
each side, so both see the same machine load; times are medians over the rounds and a case's
speedup is the median of its rounds' ratios. Both sides drop their decode state (ours with
`keep_state=False`), so neither runs the last token through the model. The greedy tokens of
both sides are compared as a check that the work is the same.

  python benchmarks/sampling.py [--json] [--new-tokens 32] [--prompt-length 16] [--repeats 5]
                                [--max-length 1024]

`--max-length` sets the sampler's cache slots per row (default: the prompt and new tokens,
rounded up to a power of two); the decode loop attends over a window of the slots the rows can
fill, so a longer cache should cost about the same. The transformers cache grows with the rows.

With `--json` it prints one JSON object: per-case tokens/s of each side and their ratio, and
`min_decode_speedup_vs_hf_torch`, the smallest ratio over the cases. Each case also times the
prefill alone (ours: `Sampler.prefill`; transformers: the forward over the prompts with a cache
that starts its `generate`) and reports `prefill_speedup` and `decode_phase_speedup` (the end to
end times less the prefill times): where the end-to-end ratio comes from.
"""

import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # pylint: disable=g-import-not-at-top
from bpo_jax import models  # pylint: disable=g-import-not-at-top
from bpo_jax import sampling  # pylint: disable=g-import-not-at-top

CONFIGS = {
    # Qwen2-style (q/k/v bias, tied embeddings), fp32.
    "10M": dict(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2),
    "100M": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                 num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4),
}
BATCHES = (1, 8, 32)


def timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def run_case(hf_model, graphdef, state, config, batch, prompt_length, new_tokens, repeats,
             max_length=None):
  prompts = np.random.RandomState(batch).randint(1, config.vocab_size, (batch, prompt_length))
  params = sampling.SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
  sampler = sampling.Sampler(graphdef, config,
                             max_length or sampling.bucket_length(prompt_length + new_tokens))
  key = jax.random.key(0)
  result = {}

  def ours():
    ds = sampler.prefill(state, prompts.tolist())
    # The state is dropped, as transformers' is: the last token needs no forward (keep_state).
    _, out = sampler.generate(state, ds, key, params, keep_state=False)
    result["ours"] = np.asarray(jax.block_until_ready(out.tokens))

  def theirs():
    with torch.no_grad():
      out = hf_model.generate(torch.as_tensor(prompts), attention_mask=torch.ones_like(
          torch.as_tensor(prompts)), do_sample=False, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, pad_token_id=0)
    result["theirs"] = out[:, prompt_length:].numpy()

  def ours_prefill():
    jax.block_until_ready(sampler.prefill(state, prompts.tolist()).next_logits)

  def theirs_prefill():  # the forward over the prompts that starts `generate`
    with torch.no_grad():
      hf_model(torch.as_tensor(prompts), use_cache=True, logits_to_keep=1)

  sides = (ours, theirs, ours_prefill, theirs_prefill)
  for fn in sides:  # warm-up (compilation, allocators)
    fn()
  # Rounds alternate the sides so all see the same machine load; a speedup is the median of the
  # rounds' ratios. The prefill alone is timed too: the decoding phase is the rest.
  rounds = [tuple(timed(fn) for fn in sides) for _ in range(repeats)]
  ours_s = statistics.median(r[0] for r in rounds)
  theirs_s = statistics.median(r[1] for r in rounds)
  tokens = batch * new_tokens
  return dict(batch=batch, jax_tokens_per_s=tokens / ours_s, hf_torch_tokens_per_s=tokens / theirs_s,
              speedup=statistics.median(r[1] / r[0] for r in rounds),
              jax_prefill_s=statistics.median(r[2] for r in rounds),
              hf_torch_prefill_s=statistics.median(r[3] for r in rounds),
              prefill_speedup=statistics.median(r[3] / r[2] for r in rounds),
              decode_phase_speedup=statistics.median((r[1] - r[3]) / (r[0] - r[2])
                                                     for r in rounds),
              greedy_tokens_agree=float(np.mean(result["ours"] == result["theirs"])))


def main():
  parser = common.parser(__doc__.splitlines()[0], repeats=5)
  parser.add_argument("--new-tokens", type=int, default=32)
  parser.add_argument("--prompt-length", type=int, default=16)
  parser.add_argument("--configs", default="10M,100M")
  parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
  parser.add_argument("--max-length", type=int, default=None,
                      help="cache slots per row (default: prompt + new tokens, bucketed)")
  args = parser.parse_args()

  cases = []
  for name in args.configs.split(","):
    torch.manual_seed(0)
    hf_model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        tie_word_embeddings=True, **CONFIGS[name])).eval()
    with tempfile.TemporaryDirectory() as path:
      hf_model.save_pretrained(path)
      model, config = models.load_hf_checkpoint(path)
    graphdef, state = nnx.split(model)
    for batch in map(int, args.batches.split(",")):
      case = dict(config=name, params=config.num_params(),
                  **run_case(hf_model, graphdef, state, config, batch, args.prompt_length,
                             args.new_tokens, args.repeats, args.max_length))
      cases.append(case)
      if not args.json:
        print(f"{name:>5} ({case['params'] / 1e6:.1f}M params) batch {batch:>2}: "
              f"jax {case['jax_tokens_per_s']:8.1f} tok/s  hf-torch "
              f"{case['hf_torch_tokens_per_s']:8.1f} tok/s  speedup {case['speedup']:.2f}x "
              f"(prefill {case['prefill_speedup']:.2f}x, decoding phase "
              f"{case['decode_phase_speedup']:.2f}x)  greedy tokens agree "
              f"{case['greedy_tokens_agree']:.2f}", flush=True)
  summary = dict(
      reference="transformers PyTorch generate (greedy, same weights, batch and length)",
      device=jax.devices()[0].platform, torch_threads=torch.get_num_threads(),
      prompt_length=args.prompt_length, new_tokens=args.new_tokens, repeats=args.repeats,
      max_length=args.max_length,
      cases=cases, min_decode_speedup_vs_hf_torch=min(c["speedup"] for c in cases))
  if args.json:
    print(json.dumps(summary))
  else:
    print(f"min_decode_speedup_vs_hf_torch: {summary['min_decode_speedup_vs_hf_torch']:.2f}")


if __name__ == "__main__":
  main()
