"""Decoding the rows of several processes: one global batch over the whole mesh, against each
process decoding its own rows on its own devices (what the training loop does).

Two processes of `--devices` fake CPU devices each (JAX distributed on localhost, Gloo) hold a
random model in the training layout on the mesh fsdp x tensor over all their devices. Each
process owns `--rows` / processes of the `--rows` rows (prompts of `--prompt` tokens), and both
ways decode `--new_tokens` tokens per row with the same compiled functions
(`sampling.prefill_tokens`, `sampling.generate`, one per-row key each):

  global       the parameters moved to the sampling layout on the whole mesh
               (`sharding.make_reshard`), the rows one global array split over fsdp: one SPMD
               program over every device of every process, the decode loop's stopping test a
               reduction over all of them at every token;
  per process  the same move, then each process's devices seen as its own mesh
               (`sharding.process_submesh`, `distributed.local_view`: no copy), the process's
               rows split over its fsdp devices: no traffic between processes.

The per-device work is the same (rows per fsdp group and the tensor split are equal); what
differs is the coordination. Medians over `--repeats` of the prefill plus decode, and of the
move to the sampling layout; the figures of the slower process are kept. Both ways must give the
same tokens (checked).

  python benchmarks/mesh_decode.py [--json] [--repeats 5] [--rows 32] [--new_tokens 32]

With `--json` it prints one JSON object: both medians in seconds, tokens per second, and
`per_process_speedup_vs_global` (global time over per-process time).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

if __name__ == "__main__" and "--worker" in sys.argv:
  os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # pylint: disable=g-import-not-at-top

# A ~25M-parameter Qwen2-style model (tied embeddings, q/k/v bias) whose heads and MLP split over
# tensor 2 and whose vocabulary is a real tokenizer's size.
MODEL = dict(vocab_size=32000, hidden_size=384, intermediate_size=1024, num_layers=6,
             num_heads=8, num_kv_heads=4, head_dim=48)


def _decode_functions(graphdef, config, max_length, mesh, draw):
  """(prefill, decode) jitted for rows laid out on `mesh`; the cache kept in its layout."""
  from bpo_jax import sampling  # pylint: disable=g-import-not-at-top
  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top

  def prefill(params, tokens, lengths):
    state = sampling.prefill_tokens(graphdef, params, config, max_length, tokens, lengths)
    return jax.lax.with_sharding_constraint(state, sharding.cache_shardings(state, mesh))

  def decode(params, state, keys):
    return sampling.generate(graphdef, params, state, keys, draw, keep_state=False)[1]

  return jax.jit(prefill), jax.jit(decode)


def _rows_on(mesh, local_rows, num_rows):
  """A global [num_rows, ...] array of this process's `local_rows`, rows over the batch axes."""
  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top
  layout = sharding.batch_sharding(mesh, sharding.SAMPLING_RULES)
  if local_rows.ndim == 1:
    layout = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(layout.spec[0]))
  return jax.make_array_from_process_local_data(layout, local_rows,
                                                (num_rows,) + local_rows.shape[1:])


def worker(args) -> dict:
  """One process's figures (run with `--worker`)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from benchmarks import resharding  # pylint: disable=g-import-not-at-top
  from bpo_jax import models  # pylint: disable=g-import-not-at-top
  from bpo_jax import sampling  # pylint: disable=g-import-not-at-top
  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import distributed  # pylint: disable=g-import-not-at-top

  distributed.initialize(f"localhost:{args.port}", args.processes, args.worker)
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=-1, tensor=args.tensor))
  sub_mesh = sharding.process_submesh(mesh)
  config = models.ModelConfig(**MODEL, qkv_bias=True, tie_word_embeddings=True)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: models.Decoder(config,
                                                                       rngs=nnx.Rngs(0))))
  params = resharding.random_params(config, sharding.param_shardings(abstract, mesh))
  move = sharding.make_reshard(sharding.param_shardings(abstract, mesh, sharding.SAMPLING_RULES))
  local_sh = sharding.param_shardings(abstract, sub_mesh, sharding.SAMPLING_RULES)
  draw = sampling.SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
  max_length = sampling.bucket_length(args.prompt + args.new_tokens)

  rng = np.random.default_rng(0)
  tokens = rng.integers(1, config.vocab_size, (args.rows, args.prompt), dtype=np.int32)
  keys = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(1), args.rows)))
  lengths = np.full((args.rows,), args.prompt, np.int32)
  mine = distributed.process_share(args.rows)
  rows = slice(mine.start, mine.stop)
  ways = {"global": (mesh, lambda: move(params)),
          "per_process": (sub_mesh, lambda: distributed.local_view(move(params), local_sh))}
  figures, tokens_out = {}, {}
  for name, (where, to_sampling) in ways.items():
    prefill, decode = _decode_functions(graphdef, config, max_length, where, draw)
    sample_params = to_sampling()
    if name == "global":  # this process's rows of global arrays
      inputs = [_rows_on(mesh, x[rows], args.rows) for x in (tokens, lengths, keys)]
    else:  # this process's rows, split over its own fsdp devices
      inputs = [_rows_on(sub_mesh, x[rows], len(mine)) for x in (tokens, lengths, keys)]
    run = lambda: decode(sample_params, prefill(sample_params, inputs[0], inputs[1]), inputs[2])
    out = run()
    # The global batch's tokens gathered from every process, then this process's rows.
    tokens_out[name] = (np.asarray(distributed.to_host(out.tokens))[rows] if name == "global"
                        else np.asarray(out.tokens))
    figures[f"{name}_decode_s"] = common.median_seconds(run, args.repeats)
    figures[f"{name}_to_sampling_s"] = common.median_seconds(to_sampling, args.repeats)
  figures["same_tokens"] = bool(np.array_equal(tokens_out["global"], tokens_out["per_process"]))
  figures["num_params"] = int(sum(x.size for x in jax.tree.leaves(abstract)))
  figures["mesh"], figures["sub_mesh"] = dict(mesh.shape), dict(sub_mesh.shape)
  return figures


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def main():
  p = common.parser(__doc__.splitlines()[0], repeats=5)
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--devices", type=int, default=4, help="fake CPU devices per process")
  p.add_argument("--tensor", type=int, default=2)
  p.add_argument("--rows", type=int, default=32)
  p.add_argument("--prompt", type=int, default=64)
  p.add_argument("--new_tokens", type=int, default=32)
  p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
  p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker is not None:
    print("FIGURES " + json.dumps(worker(args)), flush=True)
    return
  if args.rows % (args.processes * args.devices // args.tensor):
    p.error(f"--rows must split over the {args.processes * args.devices // args.tensor} "
            "fsdp devices")
  port = _free_port()
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(args.devices), "JAX_PLATFORMS": "cpu"}
  passed = [a for a in sys.argv[1:] if a != "--json"]
  start = time.perf_counter()
  children = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *passed,
                                "--worker", str(i), "--port", str(port)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in range(args.processes)]
  results = []
  for child in children:
    out, err = child.communicate(timeout=1800)
    if child.returncode:
      sys.exit(f"a worker failed (exit {child.returncode}):\n{err[-3000:]}")
    results.append(json.loads(out.split("FIGURES ", 1)[1]))
  slowest = lambda key: max(r[key] for r in results)
  decoded = args.rows * args.new_tokens
  figures = {
      "num_params": results[0]["num_params"], "mesh": results[0]["mesh"],
      "sub_mesh": results[0]["sub_mesh"], "processes": args.processes,
      "devices": f"{args.processes} x {args.devices} cpu", "rows": args.rows,
      "prompt_tokens": args.prompt, "new_tokens": args.new_tokens,
      "global_decode_s": slowest("global_decode_s"),
      "per_process_decode_s": slowest("per_process_decode_s"),
      "global_to_sampling_s": slowest("global_to_sampling_s"),
      "per_process_to_sampling_s": slowest("per_process_to_sampling_s"),
      "same_tokens": all(r["same_tokens"] for r in results), "repeats": args.repeats,
      "wall_s": time.perf_counter() - start}
  figures["global_tokens_per_s"] = decoded / figures["global_decode_s"]
  figures["per_process_tokens_per_s"] = decoded / figures["per_process_decode_s"]
  figures["per_process_speedup_vs_global"] = (figures["global_decode_s"]
                                              / figures["per_process_decode_s"])
  lines = [
      f"parameters {figures['num_params'] / 1e6:.1f}M, mesh {figures['mesh']} over "
      f"{figures['devices']} devices; each process's sub-mesh {figures['sub_mesh']}",
      f"{args.rows} rows x ({args.prompt} prompt + {args.new_tokens} new) tokens, prefill + decode:",
      f"  one global batch over the mesh: {figures['global_decode_s'] * 1e3:.0f} ms "
      f"({figures['global_tokens_per_s']:.0f} tokens/s)",
      f"  each process its own rows:      {figures['per_process_decode_s'] * 1e3:.0f} ms "
      f"({figures['per_process_tokens_per_s']:.0f} tokens/s)",
      f"  to the sampling layout: {figures['global_to_sampling_s'] * 1e3:.1f} ms global, "
      f"{figures['per_process_to_sampling_s'] * 1e3:.1f} ms per process",
      f"per_process_speedup_vs_global: {figures['per_process_speedup_vs_global']:.2f}x "
      f"(medians of {args.repeats}; same tokens: {figures['same_tokens']})"]
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
