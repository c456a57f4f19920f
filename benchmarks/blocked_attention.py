"""Memory and time of the packed update's attention by query blocks against dense attention.

`bpo_jax.models.decoder.attend` attends a row longer than `QUERY_BLOCK` (512) queries a block
at a time, each block recomputed in the backward pass; in the cache-free forward (`causal`) a
block reads only the keys up to its last query, and a block that is padding in every row is
skipped. The reference, compiled side by side in the same process, is the same function with
one block of all the row's queries (the dense attention): its float32 scores are B·H·T·S. Three
sides: dense, blocked (query blocks over every key, the path of a forward with a cache) and
causal (the update's path). For each row length (default 2048 and 4096; `--lengths
2048,4096,8192` for more, the dense side then needs gigabytes) and each share of the row that
is real tokens (`--real 1,0.4`: the rest is a packed batch's padding, each padding query
attending only itself), the gradient of a weighted sum of the attention's output with respect to
q, k and v under a causal mask, 4 query heads on 2 key-value heads of 64 dims: XLA's compiled
temporary memory (`memory_analysis().temp_size_in_bytes`, exact and load-independent) and the
median of `--repeats` timed calls after a warm-up, the sides interleaved. Every side's gradient
must agree with the dense one's (max difference printed).

  python benchmarks/blocked_attention.py [--json] [--lengths 2048,4096] [--real 1,0.4]

With `--json` it prints one JSON object: per case (`length`, `real`) `<side>_temp_mib`,
`<side>_seconds`, `memory_ratio` (dense / blocked), `time_ratio` (blocked / dense),
`causal_time_ratio` (causal / dense), and `min_memory_ratio_vs_dense` over the cases.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402
from bpo_jax.models import decoder  # pylint: disable=g-import-not-at-top

KV_HEADS, GROUPS, HEAD_DIM = 2, 2, 64


def packed_mask(length: int, real: int) -> jax.Array:
  """[1, L, L]: causal over the first `real` tokens; each later (padding) query sees itself."""
  idx = np.arange(length)
  causal = (idx[:, None] >= idx[None, :]) & (idx[None, :] < real)
  return jnp.asarray((causal & (idx[:, None] < real)) | np.eye(length, dtype=bool))[None]


def gradient_fn(mask: jax.Array, query_block: int, causal: bool):
  """The jitted gradient of sum(attend(q, k, v) · w) in q, k, v under `mask`."""

  def loss(q, k, v, w):
    return jnp.sum(decoder.attend(q, k, v, mask, jnp.float32, query_block=query_block,
                                  causal=causal) * w)

  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def measure(length: int, real: float, repeats: int) -> dict:
  rng = np.random.default_rng(0)
  shapes = ((1, KV_HEADS, GROUPS, length, HEAD_DIM), (1, KV_HEADS, HEAD_DIM, length),
            (1, KV_HEADS, length, HEAD_DIM), (1, KV_HEADS, GROUPS, length, HEAD_DIM))
  args = [jnp.asarray(rng.normal(size=s).astype(np.float32)) for s in shapes]
  mask = packed_mask(length, int(round(real * length)))
  sides = {"dense": (length, False), "blocked": (decoder.QUERY_BLOCK, False),
           "causal": (decoder.QUERY_BLOCK, True)}
  compiled = {name: gradient_fn(mask, block, causal).lower(*args).compile()
              for name, (block, causal) in sides.items()}
  grads = {name: fn(*args) for name, fn in compiled.items()}
  difference = max(float(jnp.max(jnp.abs(a - b))) for name in ("blocked", "causal")
                   for a, b in zip(grads["dense"], grads[name]))
  seconds = {name: [] for name in sides}
  for _ in range(repeats):  # interleaved, so that the machine's load drifts on all alike
    for name, fn in compiled.items():
      seconds[name].append(common.median_seconds(lambda fn=fn: fn(*args), repeats=1, warmup=0))
  out = {"length": length, "real": real, "max_gradient_difference": difference}
  for name, fn in compiled.items():
    out[f"{name}_temp_mib"] = fn.memory_analysis().temp_size_in_bytes / 2**20
    out[f"{name}_seconds"] = float(np.median(seconds[name]))
  out["memory_ratio"] = out["dense_temp_mib"] / out["blocked_temp_mib"]
  out["time_ratio"] = out["blocked_seconds"] / out["dense_seconds"]
  out["causal_time_ratio"] = out["causal_seconds"] / out["dense_seconds"]
  return out


def main():
  parser = common.parser(__doc__, repeats=5)
  parser.add_argument("--lengths", default="2048,4096")
  parser.add_argument("--real", default="1,0.4")
  args = parser.parse_args()
  cases = [measure(int(n), float(r), args.repeats) for n in args.lengths.split(",")
           for r in args.real.split(",")]
  lines = [f"query block {decoder.QUERY_BLOCK}; gradient of the attention in q, k, v, "
           f"{KV_HEADS * GROUPS} heads of {HEAD_DIM} dims, causal mask"]
  for c in cases:
    lines.append(
        f"row {c['length']:>6}, {c['real']:.0%} real: temporary memory dense "
        f"{c['dense_temp_mib']:8.1f} MiB, blocked {c['blocked_temp_mib']:8.1f} MiB "
        f"({c['memory_ratio']:.2f}x less); time dense {c['dense_seconds']:.3f} s, blocked "
        f"{c['blocked_seconds']:.3f} s ({c['time_ratio']:.2f}x), causal "
        f"{c['causal_seconds']:.3f} s ({c['causal_time_ratio']:.2f}x, "
        f"{c['causal_temp_mib']:.1f} MiB); max gradient difference "
        f"{c['max_gradient_difference']:.1e}")
  figures = {"query_block": decoder.QUERY_BLOCK, "cases": cases,
             "min_memory_ratio_vs_dense": min(c["memory_ratio"] for c in cases)}
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
