"""The estimator-level testbed: BPO, GRPO, RLOO and GiGPO on tabular chain worlds, many seeds.

  python experiments/testbed.py --out=results/testbed

For each world (`--weights`: the early decision's weight w, which sets the share of the return's
variance that the prefix explains, `worlds.prefix_share`) and each method, at one env-step
budget per task (`--episodes` whole episodes of H steps plus H − 1, the slack BPO's trees use):

1. the learning rate, chosen per world and method on `--tune_seeds` seeds of their own (seeds
   1,000,000 and up) from `--lrs`: the highest mean success over the learning curve;
2. `--seeds` seeds (0..seeds−1) trained with it: the exact expected success after each update;
3. claim 2: at BPO's parameters at the updates in `--checkpoints`, `--draws` independent
   iterations' gradients per seed and method, for the same tasks.

Results are small JSON files under `--out`/w<w>/ (world.json, tune.json, <method>.json,
variance.json), each with the code commit, the command and the settings. The run resumes: a
file already there with the same settings is kept, one with other settings stops the run (one
line, exit status 2) before anything is computed. experiments/testbed_report.py makes the
table and the plot from them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

def parse(argv) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default="results/testbed")
  p.add_argument("--weights", default="0,0.25,0.5,0.75,0.9,1")
  p.add_argument("--methods", default="bpo,grpo,rloo,gigpo")
  p.add_argument("--horizon", type=int, default=5)
  p.add_argument("--actions", type=int, default=6)
  p.add_argument("--num_tasks", type=int, default=16)
  p.add_argument("--episodes", type=int, default=4)
  p.add_argument("--tasks", type=int, default=2, help="tasks per iteration")
  p.add_argument("--iterations", type=int, default=30)
  p.add_argument("--seeds", type=int, default=256)
  p.add_argument("--tune_seeds", type=int, default=64)
  p.add_argument("--lrs", default="0.5,1,2,4,8,16,32,64,128")
  p.add_argument("--draws", type=int, default=64)
  p.add_argument("--checkpoints", default="0,10,20,30")
  return p.parse_args(argv)


def validate(args) -> str | None:
  """The first thing wrong with the arguments, in one line, or None."""
  from bpo_jax.training import estimator_registry
  try:
    weights = [float(w) for w in args.weights.split(",")]
    lrs = [float(x) for x in args.lrs.split(",")]
    checkpoints = [int(c) for c in args.checkpoints.split(",")]
  except ValueError as e:
    return f"--weights, --lrs and --checkpoints take comma-separated numbers ({e})"
  if any(not 0.0 <= w <= 1.0 for w in weights):
    return f"--weights must lie in [0, 1], got {args.weights}"
  if any(not (np.isfinite(x) and x > 0) for x in lrs):
    return f"--lrs must be positive and finite, got {args.lrs}"
  if any(not 0 <= c <= args.iterations for c in checkpoints):
    return f"--checkpoints must lie in [0, --iterations={args.iterations}], got {args.checkpoints}"
  methods = args.methods.split(",")
  unknown = [m for m in methods if m not in estimator_registry.names()]
  if unknown or "bpo" not in methods or len(methods) < 2:
    return f"--methods must name bpo and at least one baseline among registered estimators, got {args.methods}"
  for name in ("horizon", "actions", "episodes", "seeds", "tune_seeds", "draws", "tasks",
               "iterations", "num_tasks"):
    if getattr(args, name) < 2 and not (name in ("tasks", "num_tasks") and getattr(args, name) == 1):
      return f"--{name} must be at least 2 (1 for --tasks, --num_tasks), got {getattr(args, name)}"
  return None


def settings(args) -> dict:
  """What the results depend on (the command's arguments, parsed), recorded in every file."""
  return dict(weights=[float(w) for w in args.weights.split(",")],
              methods=args.methods.split(","), horizon=args.horizon, actions=args.actions,
              num_tasks=args.num_tasks, episodes=args.episodes,
              max_env_steps=args.episodes * args.horizon + args.horizon - 1,
              tasks_per_iteration=args.tasks, iterations=args.iterations, seeds=args.seeds,
              tune_seeds=args.tune_seeds, lrs=[float(x) for x in args.lrs.split(",")],
              draws=args.draws, checkpoints=[int(c) for c in args.checkpoints.split(",")])


def world_dir(out: str, weight: float) -> str:
  return os.path.join(out, f"w{weight:g}")


def planned_files(s: dict, out: str) -> list[str]:
  names = ["world", "tune", *s["methods"], "variance"]
  return [os.path.join(world_dir(out, w), f"{n}.json") for w in s["weights"] for n in names]


def check_existing(s: dict, out: str) -> str | None:
  """A file under `out` that was made with other settings, in one line, or None."""
  for path in planned_files(s, out):
    if os.path.exists(path):
      try:
        with open(path) as f:
          recorded = json.load(f)["settings"]
      except (OSError, ValueError, KeyError) as e:
        return f"{path}: not a testbed result file ({e}); move it away to recompute"
      if recorded != s:
        return f"{path} was made with other settings; use another --out or move it away"
  return None


def main(argv) -> int:
  args = parse(argv)
  problem = validate(args)
  s = settings(args) if problem is None else None
  problem = problem or check_existing(s, args.out)
  if problem:
    print(f"testbed.py: {problem}", file=sys.stderr)
    return 2
  from experiments import cli
  from experiments import testbed_runs
  record = dict(settings=s, provenance=cli.provenance("testbed.py", argv))
  for weight in s["weights"]:
    testbed_runs.run_world(s, weight, world_dir(args.out, weight), record)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
