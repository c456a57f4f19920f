"""Accelerator figures from `pretrained_iteration.py --json` output: decode tokens/s against the
memory-bandwidth bound and the update's model-flops utilisation.

    python benchmarks/device_figures.py RESULT_JSON "NVIDIA H200" > figures.json

The chip's figures come from `CHIPS` (found by a name's substring, as `nvidia-smi` prints it).
Per estimator:

* `decode_tokens_per_s`: tokens decoded over the decode phase's seconds (`tokens_decoded /
  decode_s`, the rollout's other phases left out).
* `decode_bound_tokens_per_s`: the most a decode could reach if each decode step read the
  weights once at the chip's memory bandwidth and nothing else: `tokens_decoded / (decode_steps
  · param_bytes / bandwidth)`. The KV cache's reads are left out, so the bound is generous.
* `decode_fraction_of_bound`: the first over the second.
* `update_tokens_per_s` and `update_mfu`: the packed trees' tokens over the update's seconds,
  and `4 · params · tokens/s` over the chip's dense bfloat16 peak: a forward (2 flops per
  parameter and token) and the backward's input gradients (2 more); a LoRA run takes no weight
  gradient of the frozen base (a full fine-tune's 6 would count work not done). Attention's
  flops are left out.
"""

from __future__ import annotations

import json
import sys

# name substring -> (memory bandwidth bytes/s, dense bfloat16 flops/s), the vendors' figures;
# the first substring found in the name wins (the longer names first).
CHIPS = {
    "GH200": (4.0e12, 989e12),
    "H200": (4.8e12, 989e12),
    "H100 PCIe": (2.0e12, 756e12),
    "H100 NVL": (3.9e12, 835e12),
    "H100": (3.35e12, 989e12),
    "A100-SXM4-80GB": (2.039e12, 312e12),
    "A100 80GB PCIe": (1.935e12, 312e12),
    "A100": (1.555e12, 312e12),
    "L40S": (0.864e12, 362e12),
    "L40": (0.864e12, 181e12),
    "L4": (0.3e12, 121e12),
    "A10": (0.6e12, 125e12),
}


def chip_figures(name: str) -> tuple[float, float] | None:
  """(bandwidth, peak flops) of the first `CHIPS` entry whose key is in `name`, or None."""
  for key, figures in CHIPS.items():
    if key.lower() in name.lower():
      return figures
  return None


def estimator_figures(result: dict, chip: tuple[float, float] | None) -> dict:
  """The figures of one estimator's `pretrained_iteration.run_one` result on `chip`."""
  decode_tps = result["tokens_decoded"] / max(result["decode_s"], 1e-9)
  out = {"decode_tokens_per_s": decode_tps, "update_tokens_per_s": result["update_tokens_per_s"],
         "iteration_s": result["iteration_s"],
         "startup_compile_seconds": sum(result["startup_compile_seconds"].values()),
         "compiles_in_timed_iterations": result["compiles_in_timed_iterations"]}
  if chip is None:
    return out
  bandwidth, peak = chip
  step_bound_s = result["param_bytes"] / bandwidth
  bound = result["tokens_decoded"] / max(result["decode_steps"] * step_bound_s, 1e-12)
  params = result["param_bytes"] / 2  # bfloat16 weights
  out.update(decode_bound_tokens_per_s=bound, decode_fraction_of_bound=decode_tps / bound,
             update_mfu=4 * params * result["update_tokens_per_s"] / peak)
  return out


def main(argv):
  if len(argv) != 3:
    sys.exit("usage: device_figures.py RESULT_JSON CHIP_NAME")
  with open(argv[1], encoding="utf-8") as f:
    result = json.load(f)
  chip = chip_figures(argv[2])
  figures = {"chip": argv[2], "chip_known": chip is not None, "preset": result.get("preset")}
  for name in ("bpo", "grpo"):
    if name in result:
      figures[name] = estimator_figures(result[name], chip)
  print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
  main(sys.argv)
