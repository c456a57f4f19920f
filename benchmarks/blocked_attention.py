"""Memory and time of the packed update's attention by query blocks against dense attention.

`bpo_jax.models.decoder.attend` attends a row longer than `QUERY_BLOCK` (1024) queries a block
at a time, each block recomputed in the backward pass. The reference, compiled side by side in
the same process, is the same function with one block of all the row's queries (the dense
attention every row had before): its float32 scores are B·H·T·S. For each row length (default
2048 and 4096; `--lengths 2048,4096,8192` for more, the dense side then needs gigabytes), the
gradient of a weighted sum of the attention's output with respect to q, k and v under a causal
mask, 4 query heads on 2 key-value heads of 64 dims: XLA's compiled temporary memory
(`memory_analysis().temp_size_in_bytes`, exact and load-independent) and the median of
`--repeats` timed calls after a warm-up, the two sides interleaved. Both sides' gradients must
agree (max difference printed).

  python benchmarks/blocked_attention.py [--json] [--lengths 2048,4096] [--repeats 5]

With `--json` it prints one JSON object: per length `dense_temp_mib`, `blocked_temp_mib`,
`memory_ratio` (dense / blocked), `dense_seconds`, `blocked_seconds`, `time_ratio` (blocked /
dense), and `min_memory_ratio_vs_dense` over the lengths.
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


def gradient_fn(length: int, query_block: int):
  """The jitted gradient of sum(attend(q, k, v) · w) in q, k, v under a causal mask."""
  mask = jnp.tril(jnp.ones((length, length), bool))[None]

  def loss(q, k, v, w):
    return jnp.sum(decoder.attend(q, k, v, mask, jnp.float32, query_block=query_block) * w)

  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def measure(length: int, repeats: int) -> dict:
  rng = np.random.default_rng(0)
  shapes = ((1, KV_HEADS, GROUPS, length, HEAD_DIM), (1, KV_HEADS, HEAD_DIM, length),
            (1, KV_HEADS, length, HEAD_DIM), (1, KV_HEADS, GROUPS, length, HEAD_DIM))
  args = [jnp.asarray(rng.normal(size=s).astype(np.float32)) for s in shapes]
  sides = {"dense": length, "blocked": decoder.QUERY_BLOCK}
  compiled = {name: gradient_fn(length, block).lower(*args).compile()
              for name, block in sides.items()}
  grads = {name: fn(*args) for name, fn in compiled.items()}
  difference = max(float(jnp.max(jnp.abs(a - b)))
                   for a, b in zip(grads["dense"], grads["blocked"]))
  seconds = {name: [] for name in sides}
  for _ in range(repeats):  # interleaved, so that the machine's load drifts on both alike
    for name, fn in compiled.items():
      seconds[name].append(common.median_seconds(lambda fn=fn: fn(*args), repeats=1, warmup=0))
  out = {"length": length, "max_gradient_difference": difference}
  for name, fn in compiled.items():
    out[f"{name}_temp_mib"] = fn.memory_analysis().temp_size_in_bytes / 2**20
    out[f"{name}_seconds"] = float(np.median(seconds[name]))
  out["memory_ratio"] = out["dense_temp_mib"] / out["blocked_temp_mib"]
  out["time_ratio"] = out["blocked_seconds"] / out["dense_seconds"]
  return out


def main():
  parser = common.parser(__doc__, repeats=5)
  parser.add_argument("--lengths", default="2048,4096")
  args = parser.parse_args()
  cases = [measure(int(n), args.repeats) for n in args.lengths.split(",")]
  lines = [f"query block {decoder.QUERY_BLOCK}; gradient of the attention in q, k, v, "
           f"{KV_HEADS * GROUPS} heads of {HEAD_DIM} dims, causal mask"]
  for c in cases:
    lines.append(
        f"row {c['length']:>6}: temporary memory dense {c['dense_temp_mib']:8.1f} MiB, blocked "
        f"{c['blocked_temp_mib']:8.1f} MiB ({c['memory_ratio']:.2f}x less); time dense "
        f"{c['dense_seconds']:.3f} s, blocked {c['blocked_seconds']:.3f} s "
        f"({c['time_ratio']:.2f}x); max gradient difference {c['max_gradient_difference']:.1e}")
  figures = {"query_block": decoder.QUERY_BLOCK, "cases": cases,
             "min_memory_ratio_vs_dense": min(c["memory_ratio"] for c in cases)}
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
