"""What the sampler's decode loop costs to compile at a checkpoint's depth: layers scanned
against the layer loop (the reference), with the dense cache and with a paged one.

The program is `sampling.generate` (the rollout's decode loop, one `lax.while_loop` over
tokens) lowered and compiled for `--rows` rows of `--max-length` slots at a `ModelConfig`
preset's shape (default `qwen2_5_0_5b`: 24 layers, vocabulary 151,936, bfloat16), with nothing
but shapes: no weights are made. For each cache (dense; paged with pages of `--page-size`) and
each layer stack (`scan_layers` on and off) it reports the seconds to lower and to compile
(medians over `--repeats`, each compile from scratch: no persistent cache), the program's
lines of StableHLO and its `dot_general`s. With the layers scanned the program holds one layer
body whatever the depth; with the loop it holds one per layer.

    python benchmarks/decode_compile.py [--json] [--repeats 3] [--preset qwen2_5_0_5b]
        [--layers N] [--rows 8] [--max-length 2048] [--page-size 16]

With --json: one object with `compile_s`, `lower_s`, `hlo_lines` and `dot_generals`, each
keyed by `dense_scan`, `dense_loop`, `paged_scan` and `paged_loop`, and
`compile_seconds_ratio_scan_over_loop` for `dense` and `paged`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import common  # noqa: E402
from bpo_jax import sampling  # noqa: E402
from bpo_jax.models import Decoder  # noqa: E402
from bpo_jax.models import ModelConfig  # noqa: E402

VARIANTS = ("dense_scan", "dense_loop", "paged_scan", "paged_loop")


def lowered_decode(config: ModelConfig, rows: int, max_length: int, page_size: int):
  """`generate`'s program for `rows` rows of `max_length` slots (a paged cache of
  `page_size`-slot pages, or the dense cache for 0), lowered on abstract weights."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))
  sampler = sampling.Sampler(graphdef, config, max_length, page_size=page_size)
  if page_size:  # as a compiled call takes it: the host's bookkeeping left out
    ds = sampler.init_state(rows)
    ds = jax.eval_shape(lambda: ds.replace(cache=ds.cache.without_book()))
  else:
    ds = jax.eval_shape(lambda: sampling.init_decode_state(config, rows, max_length))
  return sampler.lower_generate(state, ds, jax.random.key(0),
                                sampling.SamplingParams(max_new_tokens=32),
                                jnp.ones((rows,), bool))


def measure(config: ModelConfig, rows: int, max_length: int, page_size: int,
            repeats: int) -> dict:
  """Median lower and compile seconds of one variant, and its program's size."""
  lower_s, compile_s = [], []
  for _ in range(repeats):
    jax.clear_caches()  # else a repeat reuses the executable of the first
    start = time.perf_counter()
    lowered = lowered_decode(config, rows, max_length, page_size)
    lower_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    lowered.compile()
    compile_s.append(time.perf_counter() - start)
  text = lowered.as_text()
  return dict(lower_s=statistics.median(lower_s), compile_s=statistics.median(compile_s),
              hlo_lines=len(text.splitlines()), dot_generals=text.count("dot_general"))


def main():
  p = common.parser(__doc__.split("\n")[0], repeats=3)
  p.add_argument("--preset", default="qwen2_5_0_5b", help="a ModelConfig preset (classmethod)")
  p.add_argument("--layers", type=int, default=0, help="num_layers (0: the preset's)")
  p.add_argument("--rows", type=int, default=8)
  p.add_argument("--max-length", type=int, default=2048)
  p.add_argument("--page-size", type=int, default=16)
  args = p.parse_args()
  preset = getattr(ModelConfig, args.preset.replace("-", "_").replace(".", "_"), None)
  if not callable(preset) or args.preset.startswith("_"):
    p.error(f"--preset={args.preset}: not a ModelConfig preset (e.g. qwen2_5_0_5b)")
  for name in ("repeats", "rows", "max_length", "page_size"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
  if args.layers < 0:
    p.error(f"--layers={args.layers}: must be >= 0")
  # The compile cache off: every compile is from scratch.
  jax.config.update("jax_enable_compilation_cache", False)
  base = preset()
  if args.layers:
    base = base.replace(num_layers=args.layers)
  results = {}
  for variant in VARIANTS:
    cache, stack = variant.split("_")
    config = base.replace(scan_layers=stack == "scan")
    results[variant] = measure(config, args.rows, args.max_length,
                               args.page_size if cache == "paged" else 0, args.repeats)
  figures = {key: {v: results[v][key] for v in VARIANTS}
             for key in ("compile_s", "lower_s", "hlo_lines", "dot_generals")}
  figures["compile_seconds_ratio_scan_over_loop"] = {
      cache: results[f"{cache}_scan"]["compile_s"] / results[f"{cache}_loop"]["compile_s"]
      for cache in ("dense", "paged")}
  figures.update(preset=args.preset, num_layers=base.num_layers, rows=args.rows,
                 max_length=args.max_length, page_size=args.page_size,
                 device=str(jax.devices()[0].device_kind))
  lines = [f"generate at {args.preset} ({base.num_layers} layers), {args.rows} rows of "
           f"{args.max_length} slots, on {figures['device']}; medians of {args.repeats}:"]
  for v in VARIANTS:
    r = results[v]
    lines.append(f"  {v:10s} compile {r['compile_s']:6.1f} s, lower {r['lower_s']:5.1f} s, "
                 f"{r['hlo_lines']:6d} lines, {r['dot_generals']:4d} dot_generals")
  for cache, ratio in figures["compile_seconds_ratio_scan_over_loop"].items():
    lines.append(f"  {cache}: scanned over the layer loop, compile seconds {ratio:.2f}")
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
