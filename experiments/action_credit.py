r"""Which actions training credits: each class of action in the batches a run's checkpoints grow.

    python experiments/action_credit.py --run=W --out=credit.json --checkpoints=4,8 \
        --estimators=bpo,rloo

For each kept checkpoint N of the run in workdir W (`--checkpoints`, default all; the run's
record, W/config.json, gives the settings) and each estimator of `--estimators` (default the
run's own), the batch of training's iteration N + 1 is grown as the loop grows it (its tasks,
its key, the fork threshold stored with the checkpoint) and given training's advantages A and
weights w (`display.training_credit`). Another estimator grows its own topology at the same
parameters and key, a group one as many whole episodes as fit the budget
(`rollout.group_size=0`). Each valid step is put in a class by its action's text:

* "empty": nothing but white space (the world answers it as an invalid action);
* "parsed": the world's `parse_action` reads a command from it;
* "unparsed": anything else.

Per class the file holds the steps, the steps with a sibling (a fork's branches; a group's
first steps), Σ w·A over them and over those with a sibling (`credit_by_class`). The update
ascends Σ w A ∇log π(action), so a class with a positive sum is made more likely. For the run's
own estimator the batch's nodes and success are held to the run's logged record of iteration
N + 1 ("as_logged"): a batch that differs is not the one training took.

The file (written whole, with `cli.provenance`) is {"run_estimator": ..., "checkpoints":
[{"checkpoint": N, "estimator": E, "nodes", "success", "as_logged", "classes": {class: {...}}},
...]}. A bad flag, a workdir without its record, a checkpoint it does not keep or an --out in
no directory: one line, exit status 2, before any compute; a file that cannot be written (a
full disk): one line, exit status 1, and no file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Callable, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from experiments import cli  # noqa: E402

CLASSES = ("empty", "parsed", "unparsed")


def classify(text: str, parse_action: Callable[[str], str | None]) -> str:
  """The class of an action's text: "empty" (white space only), "parsed" (`parse_action` reads
  a command), else "unparsed". Example: "  " → "empty"; with FrozenLake's parser "down" →
  "parsed", "xyz" → "unparsed"."""
  if not text.strip():
    return "empty"
  return "parsed" if parse_action(text) is not None else "unparsed"


def credit_by_class(classes: Sequence[Sequence[str | None]], parents: Sequence[Sequence[int]],
                    advantages: np.ndarray, weights: np.ndarray) -> dict:
  """Per class: steps, steps with a sibling, Σ w·A and Σ w·A over the steps with a sibling.

  Args:
    classes: per tree, per node, its class, None for a node that is not a valid step.
    parents: per tree, per node, its parent (-1: a child of the root state).
    advantages, weights: float[T, N] (N at least each tree's node count).

  Two valid nodes are siblings when they share a parent. Example: parents [-1, 0, 0], classes
  ["parsed", "empty", "parsed"], A [0, 1, -1], w [1, .5, .5] give "empty": 1 step, 1 with a
  sibling, Σ w·A = 0.5 = the same with a sibling; "parsed": 2 steps, 1 with a sibling, −0.5.
  """
  out = {c: {"steps": 0, "with_sibling": 0, "credit": 0.0, "credit_with_sibling": 0.0}
         for c in CLASSES}
  for t, (kinds, parent) in enumerate(zip(classes, parents)):
    valid_parents = [p for p, k in zip(parent, kinds) if k is not None]
    for n, kind in enumerate(kinds):
      if kind is None:
        continue
      credit = float(weights[t, n] * advantages[t, n])
      sibling = valid_parents.count(parent[n]) > 1
      entry = out[kind]
      entry["steps"] += 1
      entry["credit"] += credit
      entry["with_sibling"] += int(sibling)
      entry["credit_with_sibling"] += credit if sibling else 0.0
  return out


def _checkpoints(text: str | None, kept: list[int], run: str) -> list[int]:
  if text is None:
    if not kept:
      cli.fail(f"--run={run}: keeps no checkpoint")
    return kept
  try:
    wanted = [int(x) for x in text.split(",")]
  except ValueError:
    cli.fail(f"--checkpoints={text}: must be comma-separated integers")
  missing = [s for s in wanted if s not in kept]
  if missing:
    cli.fail(f"--checkpoints={text}: {run} keeps no checkpoint {missing[0]} (it keeps "
             f"{', '.join(map(str, kept)) or 'none'})")
  return wanted


def _estimators(text: str | None, own: str) -> list[str]:
  from bpo_jax.training import estimator_registry  # pylint: disable=g-import-not-at-top
  names = [own] if text is None else text.split(",")
  for name in names:
    try:
      estimator_registry.get(name)
    except (KeyError, ValueError):
      cli.fail(f"--estimators={text}: unknown estimator {name!r}")
  return names


def _settings(config, estimator: str):
  """The run's settings with `estimator` (a group estimator: `rollout.group_size=0`)."""
  from bpo_jax.training import estimator_registry  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings as settings_lib  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  if estimator != config.rollout.estimator:
    config.rollout.estimator = estimator
    if estimator_registry.get(estimator).topology == "group":
      config.rollout.group_size = 0
  return settings_lib.from_config(config)


def measure(config, run: str, steps: list[int], estimators: list[str]) -> list[dict]:
  """`credit_by_class` of each checkpoint's next batch for each estimator (module docstring)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bpo_jax import rollout as rollout_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.sandboxes import registry  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import display  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import experiment as experiment_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import iteration as iteration_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import metrics  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top
  own = config.rollout.estimator
  variants = {e: _settings(config, e) for e in estimators}
  logged = {r["iteration"]: r for r in metrics.read_jsonl(os.path.join(run, "metrics.jsonl"))
            if r.get("phase") == "train"}
  exp, state = experiment_lib.build_experiment(_settings(config, own), run)
  parse = registry.get_action_syntax(exp.settings.env.name).parse_action
  try:
    engines = {e: rollout_lib.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt,
                                            exp.pool, translate.rollout_config(s))
               for e, s in variants.items()}
    root = jax.random.key(exp.settings.seed)
    out = []
    for step in steps:
      restored, _, saved = loop.restore_checkpoint(exp, state, step)
      threshold = float(saved["fork_threshold"]["threshold"])
      params = exp.sampling_params(restored.params)
      for name, settings in variants.items():
        drawn, rows, _ = iteration_lib.grow_rounds(
            dataclasses.replace(exp, settings=settings), engines[name], params, step + 1,
            jax.random.fold_in(root, step + 1), threshold)
        stats = iteration_lib.rollout_stats(drawn)
        batch = drawn.select(rows)
        advantages, weights = display.training_credit(settings, batch)
        classes = [[classify(r.action_texts[n], parse) if r.tokens.valid[n] else None
                    for n in range(r.num_nodes)] for r in batch.rollouts]
        record = logged.get(step + 1) if name == own else None
        out.append({
            "checkpoint": step, "estimator": name, "nodes": stats["nodes"],
            "success": stats["success"],
            "as_logged": None if record is None else (record["nodes"] == stats["nodes"]
                                                      and record["success"] == stats["success"]),
            "classes": credit_by_class(classes, [r.tokens.parent for r in batch.rollouts],
                                       advantages, weights)})
        print(f"checkpoint {step}, {name}: " + ", ".join(
            f"{c} {v['steps']} steps, Σ w·A {v['credit']:+.3f}"
            for c, v in out[-1]["classes"].items()), flush=True)
    return out
  finally:
    exp.close()


def main(argv) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.error = cli.fail  # a bad flag: one line, exit status 2
  p.add_argument("--run", required=True, help="a run's workdir (with its config.json)")
  p.add_argument("--out", required=True, help="the JSON file to write")
  p.add_argument("--checkpoints", default=None, help="comma-separated (default: every kept one)")
  p.add_argument("--estimators", default=None, help="comma-separated (default: the run's own)")
  args = p.parse_args(argv)
  record = os.path.join(args.run, "config.json")
  if not os.path.isfile(record):
    cli.fail(f"--run={args.run}: no run's record there (config.json)")
  if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
    cli.fail(f"--out={args.out}: no such directory")
  from bpo_jax.training import gradient_variance  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from experiments import json_config  # pylint: disable=g-import-not-at-top
  config = json_config.get_config(record)
  estimators = _estimators(args.estimators, config.rollout.estimator)
  kept = gradient_variance.kept_steps(args.run) if workdir_lib.has_checkpoints(args.run) else []
  steps = _checkpoints(args.checkpoints, kept, args.run)
  made = cli.provenance("action_credit.py", argv)
  result = measure(config, args.run, steps, estimators)
  try:  # written whole or not at all (a temporary file renamed into place)
    workdir_lib.write_json(args.out, {"run_estimator": config.rollout.estimator,
                                      "checkpoints": result, **made})
  except OSError as error:  # a full disk, say
    print(f"error: {args.out} not written: {error}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
