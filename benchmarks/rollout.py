"""Tokens the policy processes to grow a BPO tree, against the tree's unique tokens and against
independent rollouts with the same number of leaves.

A BPO tree forks the KV cache at a fork instead of replaying the prefix, so the tokens the policy
runs (prefill + decode) should equal the tree's unique tokens (`TreeTokens.num_unique_tokens`;
ideal ratio 1.0, target <= 1.1). Three references, measured in the same run:

* replay: rolling each leaf out on its own, re-running the shared prefix every time, processes
  the sum of the leaf paths' tokens (`TaskRollout.path_tokens`);
* independent rollouts: for each BPO tree, the group topology (the RLOO/GRPO baselines) with N =
  that tree's leaves on the same task, run by the same engine (the prompt is prefilled once and
  forked, nothing else is shared);
* wall time of both, medians over repeats, with the time per phase.

The policy is a tiny random decoder and the world the built-in rooms, so actions are mostly
rejected and branches run to the sandbox's step limit: the figures measure the engine, not the
policy. Forks follow the random rule (`--fork-prob`), which spreads them along the backbone; the
random policy's entropies are all about log V, so the entropy rule would fork at the first
states only.

    python benchmarks/rollout.py [--json] [--repeats 3] [--tasks 8] [--workers 0]

With --json: one object with `tokens_processed_over_unique` (BPO, all trees together),
`max_tree_tokens_processed_over_unique`, `replay_tokens_over_unique`,
`independent_tokens_over_bpo_tokens`, `independent_tokens_over_unique`, `leaves_per_tree`,
`bpo_seconds`, `independent_seconds`, `independent_seconds_over_bpo_seconds`, per-phase
seconds (`bpo_seconds_<phase>`), `device_row_tokens_over_decoded` and the counters.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import common  # noqa: E402
from bpo_jax import rollout  # noqa: E402
from bpo_jax import text  # noqa: E402
from bpo_jax.models import Decoder  # noqa: E402
from bpo_jax.models import ModelConfig  # noqa: E402
from bpo_jax.sandboxes import pool as pool_lib  # noqa: E402
from bpo_jax.sandboxes import registry  # noqa: E402
from bpo_jax.sandboxes import rooms  # noqa: E402


def _policy(vocab_size: int):
  config = ModelConfig.tiny(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                            num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
  graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))
  return config, graphdef, params


def _run(engine, params, tasks, key):
  start = time.perf_counter()
  batch = engine.rollout(params, tasks, key)
  return batch, time.perf_counter() - start


def main(argv=None):
  p = common.parser(__doc__.split("\n\n")[0], repeats=3)
  p.add_argument("--tasks", type=int, default=8, help="tasks (trees) per batch")
  p.add_argument("--workers", type=int, default=0, help="sandbox worker processes (0: in-process)")
  p.add_argument("--siblings", type=int, default=4, help="K, actions tried at a fork")
  p.add_argument("--max-leaves", type=int, default=10, help="leaves per BPO tree")
  p.add_argument("--max-turns", type=int, default=12, help="actions per branch")
  p.add_argument("--fork-prob", type=float, default=0.3, help="the random rule's probability")
  args = p.parse_args(argv)

  tasks = rooms.make_tasks("train", num=args.tasks, seed=0, difficulty=2)
  with tempfile.TemporaryDirectory() as workdir:  # the BPE tokenizer a rooms run trains
    _, fmt = text.build_text("rooms", workdir, tasks, env_options={"difficulty": 2},
                             max_observation_tokens=40)
  config, graphdef, params = _policy(fmt.vocab_size)
  shared = dict(max_turns=args.max_turns, max_action_tokens=8, max_length=1024,
                batch_buckets=(8, 16, 32, 64, 128, 256))
  # The random rule spreads forks along the backbone (a random tiny policy's entropies are all
  # about log V, so the entropy rule would fork at the first states only).
  bpo_config = rollout.RolloutConfig(k=args.siblings, fork_rule="random",
                                     fork_probability=args.fork_prob, max_leaves=args.max_leaves,
                                     max_env_steps=None, max_tree_tokens=None,
                                     budget_accounting="used", **shared)

  pool = pool_lib.SandboxPool(
      functools.partial(registry.make_free_text_sandbox, "rooms"), num_workers=args.workers,
      timeout_s=60.0)
  groups = {}

  def independent(batch, key):
    """Runs, for each tree of `batch`, a group of as many independent rollouts as it has leaves
    (one engine call per distinct leaf count); returns (batches, seconds)."""
    by_leaves = {}
    for task, result in zip(tasks, batch.rollouts):
      by_leaves.setdefault(int(result.leaves().size), []).append(task)
    batches, seconds = [], 0.0
    for n, group_tasks in sorted(by_leaves.items()):
      if n not in groups:
        groups[n] = rollout.RolloutEngine(
            graphdef, config, fmt, pool,
            rollout.RolloutConfig(topology="group", group_size=max(n, 1), **shared))
      out, s = _run(groups[n], params, group_tasks, key)
      batches.append(out)
      seconds += s
    return batches, seconds

  try:
    bpo = rollout.RolloutEngine(graphdef, config, fmt, pool, bpo_config)
    # Warm-up: compile the batch and token buckets both topologies meet.
    for r in range(2):
      warm, _ = _run(bpo, params, tasks, jax.random.key(100 + r))
      independent(warm, jax.random.key(200 + r))
    bpo_runs, group_runs = [], []
    for r in range(args.repeats):
      batch, seconds = _run(bpo, params, tasks, jax.random.key(r))
      bpo_runs.append((batch, seconds))
      group_batches, group_seconds = independent(batch, jax.random.key(1000 + r))
      group_runs.append((group_batches, group_seconds))
  finally:
    pool.shutdown()

  def totals(batches):
    processed = sum(b.compute.tokens_processed for b in batches)
    unique = sum(r.tokens.num_unique_tokens() for b in batches for r in b.rollouts)
    paths = sum(r.path_tokens() for b in batches for r in b.rollouts)
    return processed, unique, paths

  bpo_processed, bpo_unique, bpo_paths = totals([b for b, _ in bpo_runs])
  group_processed, group_unique, _ = totals([b for bs, _ in group_runs for b in bs])
  per_tree = [r.compute.tokens_processed / r.tokens.num_unique_tokens()
              for b, _ in bpo_runs for r in b.rollouts]
  leaves_per_tree = [int(r.leaves().size) for b, _ in bpo_runs for r in b.rollouts]
  group_leaves = [int(r.leaves().size) for bs, _ in group_runs for b in bs for r in b.rollouts]
  bpo_seconds = statistics.median(s for _, s in bpo_runs)
  group_seconds = statistics.median(s for _, s in group_runs)
  phases = {f"bpo_seconds_{k}": statistics.median(b.phase_seconds[k] for b, _ in bpo_runs)
            for k in rollout.PHASES}
  decoded = sum(b.compute.tokens_decoded for b, _ in bpo_runs)
  row_tokens = sum(b.device_row_tokens for b, _ in bpo_runs)
  counters = {f"bpo_{k}": v for k, v in bpo_runs[-1][0].compute.as_dict().items()}

  figures = {
      "tokens_processed_over_unique": bpo_processed / bpo_unique,
      "max_tree_tokens_processed_over_unique": max(per_tree),
      "replay_tokens_over_unique": bpo_paths / bpo_unique,
      "independent_tokens_over_bpo_tokens": group_processed / bpo_processed,
      "independent_tokens_over_unique": group_processed / group_unique,
      "leaves_per_tree": float(np.median(leaves_per_tree)),
      "independent_leaves_per_group": float(np.median(group_leaves)),
      "bpo_tokens_per_tree": bpo_processed / len(per_tree),
      "independent_tokens_per_group": group_processed / len(per_tree),
      "bpo_seconds": bpo_seconds,
      "independent_seconds": group_seconds,
      "independent_seconds_over_bpo_seconds": group_seconds / bpo_seconds,
      "device_row_tokens_over_decoded": row_tokens / max(decoded, 1),
      "tasks": args.tasks,
      "repeats": args.repeats,
      "workers": args.workers,
      "k": args.siblings,
      "fork_probability": args.fork_prob,
      **phases,
      **counters,
  }
  if args.json:
    print(json.dumps(figures, sort_keys=True))
    return
  print(f"rollout benchmark: {args.tasks} rooms tasks (difficulty 2), K={args.siblings}, "
        f"median {figures['leaves_per_tree']:.0f} leaves per tree, {args.workers} sandbox workers, "
        f"medians of {args.repeats}")
  print(f"  BPO tokens processed / unique tokens      {figures['tokens_processed_over_unique']:.3f}"
        f"  (worst tree {figures['max_tree_tokens_processed_over_unique']:.3f}; "
        f"ideal 1.0, target <= 1.1)")
  print(f"  replaying each leaf's prefix / unique       {figures['replay_tokens_over_unique']:.3f}")
  print(f"  independent rollouts, same leaves / BPO     "
        f"{figures['independent_tokens_over_bpo_tokens']:.3f}  "
        f"({figures['independent_tokens_per_group']:.0f} vs "
        f"{figures['bpo_tokens_per_tree']:.0f} tokens per task)")
  print(f"  wall time: BPO {bpo_seconds:.2f} s, independent {group_seconds:.2f} s "
        f"(ratio {figures['independent_seconds_over_bpo_seconds']:.2f})")
  print("  BPO phases: " + ", ".join(f"{k[len('bpo_seconds_'):]} {v:.2f} s"
                                     for k, v in phases.items()))
  print(f"  padded device row-tokens / decoded tokens  "
        f"{figures['device_row_tokens_over_decoded']:.2f}")


if __name__ == "__main__":
  main()
