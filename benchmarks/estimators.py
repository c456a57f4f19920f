"""Jitted, vmapped `bpo_advantages` against a plain-Python reference that walks dicts of children.

256 BPO-shaped trees (branches of at most 32 steps) of 128, 512 and 2048 nodes. The reference is
`bpo_jax.testing.random_trees.reference_bpo`, the dict-of-children walk agent-RL code on PyTorch
stacks typically does, run tree by tree; its outputs are checked against the jitted ones. Each of
`--repeats` rounds times both, one after the other, so they share the machine's load: the jitted
batch as the median of 5 calls after one untimed call, then one pass of the reference. The
untimed call is the first after the reference pass has filled the caches with Python objects and
the allocator has returned freed pages; it is reported on its own (`jitted_first_call_*`). The
figures are medians over the rounds and the speedup is the median of the rounds' ratios. The
target ratio is at 512 nodes; times per node show whether the cost grows linearly with the tree.

Both sides run on one core by default (`--cores 1`): the process pins itself to one CPU before
JAX starts, so XLA compiles and runs the jitted batch single-threaded, as the reference runs.
This is the like-for-like comparison, and on a shared machine the steadier one: with more cores
XLA splits every op of 512 KB or more (among them the scatter at each step of the reverse loop)
between threads, which buys little at this size and waits whenever another process holds the
other core. `--cores 0` uses every CPU the process may run on.

  python benchmarks/estimators.py [--json] [--trees 256] [--cores 1]
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from bpo_jax import estimators
from bpo_jax.testing.random_trees import random_bpo_tree, reference_bpo
from bpo_jax.tree import stack_trees


def main():
  p = common.parser(__doc__.splitlines()[0])
  p.add_argument("--trees", type=int, default=256)
  p.add_argument("--cores", type=int, default=1,
                 help="CPUs to run on, the one it starts on first (0: all it may use)")
  args = p.parse_args()
  cores = common.pin_cores(args.cores)
  rng = np.random.default_rng(0)
  bpo = jax.jit(jax.vmap(lambda t: estimators.bpo_advantages(t)))
  figures = {"backend": jax.default_backend(), "num_trees": args.trees, "cpus": cores}
  lines = [f"bpo_advantages over {args.trees} trees, backend {jax.default_backend()}, "
           f"{len(cores)} CPU{'s' if len(cores) > 1 else ''} (medians of {args.repeats})"]
  lines.append(f"{'nodes':>6} {'jitted ms':>10} {'1st call':>9} {'python ms':>10} {'speedup':>8} "
               f"{'jit ns/node':>12} {'py ns/node':>11}")
  for nodes in (128, 512, 2048):
    trees = [random_bpo_tree(rng, nodes) for _ in range(args.trees)]
    batch = jax.tree_util.tree_map(jnp.asarray, stack_trees(trees))
    out = jax.block_until_ready(bpo(batch))

    def python_reference():
      return [reference_bpo(t) for t in trees]

    ref = python_reference()
    err = max(float(np.abs(np.asarray(out.advantages[b]) - r[0]).max())
              for b, r in enumerate(ref))
    if err > 1e-3:
      raise AssertionError(f"jitted and reference advantages differ by {err} at {nodes} nodes")
    # Side by side: each round times the jitted batch (one untimed call, then the median of 5
    # calls) and then one pass of the reference, so both see the same machine load; the ratio is
    # the median of the rounds'.
    jitted_times, first_calls, python_times, ratios = [], [], [], []
    for _ in range(args.repeats):
      first_calls.append(common.median_seconds(lambda: bpo(batch), 1, warmup=0))
      jitted_times.append(common.median_seconds(lambda: bpo(batch), 5, warmup=0))
      python_times.append(common.median_seconds(python_reference, 1, warmup=0))
      ratios.append(python_times[-1] / jitted_times[-1])
    jitted, python = statistics.median(jitted_times), statistics.median(python_times)
    first = figures[f"jitted_first_call_seconds_{nodes}"] = statistics.median(first_calls)
    speedup = statistics.median(ratios)
    per = args.trees * nodes
    figures[f"jitted_seconds_{nodes}"] = jitted
    figures[f"python_reference_seconds_{nodes}"] = python
    figures[f"speedup_{nodes}"] = speedup
    figures[f"jitted_ns_per_node_{nodes}"] = jitted / per * 1e9
    lines.append(f"{nodes:>6} {jitted * 1e3:>10.2f} {first * 1e3:>9.2f} {python * 1e3:>10.1f} "
                 f"{speedup:>7.1f}x "
                 f"{jitted / per * 1e9:>12.1f} {python / per * 1e9:>11.1f}")
  figures["speedup_vs_python_reference"] = figures["speedup_512"]
  lines.append(f"speedup_vs_python_reference (512 nodes): {figures['speedup_512']:.1f}x "
               f"(target >= 100x)")
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
