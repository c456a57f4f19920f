r"""Measures the gradient estimator's variance at fixed parameters over a comparison's finished runs.

    python experiments/compare.py --config=experiments/configs/rooms.py --seeds=3 --estimators=grpo \
        --out=results/rooms_grpo
    python experiments/grad_variance.py --config=experiments/configs/rooms.py --seeds=3 \
        --estimators=grpo --draws=16 --out=results/rooms_grpo

Each finished run of `compare.py`'s OUT (the same `--config`, `--estimators`, `--seeds`,
`--first_seed` and `--out`) is measured (`training.gradient_variance`: `--draws` independent
draws, at least 16 for a measurement) at `--checkpoints` of its kept checkpoints (first, middle,
last; compare.py's runs keep every checkpoint they write), and the result saved as
OUT/runs/EST/seedS/gradient_variance.json with the code's commit and the command, which a later
call with the same draws and checkpoints reuses. OUT's results.json, results.md and plots are
then written again with E||g - mean g||^2 per method, its ratio to GRPO's and RLOO's, and the
env steps per task the draws spent. The runs are measured one after another in this process.

With `--params=EST`, every method of `--estimators` is measured at the checkpoints of EST's run
of the same seed, so the variances compare estimators at identical parameters rather than each
at its own run's: only EST's runs need training (compare.py with `--estimators=EST`), the other
methods' directories hold just their gradient_variance.json (with "params_of": EST), and
results.md gives the claim-2 table of these shared-parameter measurements beside EST's runs.

    python experiments/compare.py --config=experiments/configs/rooms.py --seeds=3 --estimators=bpo \
        --out=results/rooms_bpo_claim2
    python experiments/grad_variance.py --config=experiments/configs/rooms.py --seeds=3 \
        --draws=16 --params=bpo --out=results/rooms_bpo_claim2

With `--params_from=DIR` as well, EST's runs are those of another comparison's directory
(DIR/runs/EST/seedS, finished, each with its saved config), and every method of `--estimators`
is measured at their checkpoints with this call's configuration, e.g. another env-step budget
(`--config.rollout.max_env_steps=24`) at the same parameters. The table's rows are DIR's runs
of EST.

With `--gram`, each checkpoint's result also holds the Gram matrix of its draws' gradients
(`training.gradient_variance`), for a bootstrap over draws as well as seeds
(`regime_report.py`'s claim 2). With `--cross` as well (and `--params`), every method of a
seed is measured in turn holding its draws' gradients, and the products of EST's draws with each
other method's, "cross": {method: [M][M]} per checkpoint of EST's file, let the report test
whether two estimators have one expectation at the same parameters (`analysis.same_expectation`);
a seed whose EST file lacks them is measured again whole (the draws are the same).

Bad flags or configurations, or a run to measure at that is not finished: one line, exit status
2; a measurement that fails is reported, the others are still aggregated, exit status 1.
"""

import json
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from bpo_jax.training import workdir as workdir_lib
from experiments import aggregate
from experiments import cli
from experiments import compare
from experiments import json_config

_FLAGS = {}


def _define_flags():
  compare.define_comparison_flags(_FLAGS)
  _FLAGS["draws"] = flags.DEFINE_integer(
      "draws", 16, "Independent draws per checkpoint (>= 2; >= 16 for a measurement).")
  _FLAGS["checkpoints"] = flags.DEFINE_integer(
      "checkpoints", 3, "Checkpoints per run it is measured at: first, middle, last kept.")
  _FLAGS["params"] = flags.DEFINE_string(
      "params", "", "Measure every method at the checkpoints of this estimator's run of each "
      "seed (the same parameters for all).")
  _FLAGS["gram"] = flags.DEFINE_bool(
      "gram", False, "Also keep the draws' Gram matrix in each file (the bootstrap over draws "
      "of regime_report.py's claim 2; holds draws x the parameters' size in memory).")
  _FLAGS["cross"] = flags.DEFINE_bool(
      "cross", False, "With --gram and --params: also keep the products of that estimator's "
      "draws with every other method's (holds every method's draws of a seed in memory).")
  _FLAGS["params_from"] = flags.DEFINE_string(
      "params_from", "", "With --params: the comparison directory whose finished runs of that "
      "estimator are measured at.")


def parse_flags(argv):
  """absl flag parsing that reports a bad flag, config file or override in one line."""
  return cli.parse_config_flags(argv, _FLAGS["config"], example="experiments/configs/rooms.py")


def source_runs(directory: str, estimator: str, seeds: int, first_seed: int = 0):
  """`estimator`'s finished runs of seeds first_seed..first_seed+seeds-1 in another comparison's
  `directory`, with their saved configurations; exits 2 if one is missing or unfinished."""
  out = []
  for seed in range(first_seed, first_seed + seeds):
    run = compare.Run(estimator, seed, os.path.join(directory, "runs", estimator, f"seed{seed}"))
    if not os.path.exists(run.config_path):
      cli.fail(f"--params_from={directory}: no run {run.config_path}")
    c = json_config.get_config(run.config_path)
    if not compare.finished(run, c.train.iterations):
      cli.fail(f"--params_from={directory}: {run.workdir} is not a finished run")
    out.append((run, c))
  return out


def unfinished(runs, params_of: str | None = None) -> list[str]:
  """The workdirs of `runs` (of `params_of` alone, when given) that are not finished runs."""
  return [r.workdir for r, c in runs if r.estimator == (params_of or r.estimator)
          and not compare.finished(r, c.train.iterations)]


def _reusable(path: str, draws: int, steps: list[int], params_of, params_from,
              gram: bool = False) -> bool:
  """Whether the gradient_variance.json at `path` was measured as this call would measure."""
  if not os.path.exists(path):
    return False
  with open(path, encoding="utf-8") as f:
    saved = json.load(f)
  return (saved["draws"] == draws and [r["step"] for r in saved["checkpoints"]] == steps
          and saved.get("params_of") == params_of and saved.get("params_from") == params_from
          and (not gram or all("gram" in r for r in saved["checkpoints"])))


def _params_path(runs, seed: int, params_of: str) -> str:
  """The gradient_variance.json of `params_of`'s run of `seed` among `runs`."""
  run = next(r for r, _ in runs if r.seed == seed and r.estimator == params_of)
  return os.path.join(run.workdir, aggregate.GRADIENT_VARIANCE_JSON)


def _has_cross(runs, seed: int, params_of: str) -> bool:
  """Whether `params_of`'s file of `seed` holds its draws' products with every other method's
  (a missing or unreadable file does not: the seed is measured again)."""
  others = {r.estimator for r, _ in runs if r.seed == seed} - {params_of}
  try:
    with open(_params_path(runs, seed, params_of), encoding="utf-8") as f:
      saved = json.load(f)
    return all(others <= set(p.get("cross", {})) for p in saved["checkpoints"])
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return False


def _write_cross(runs, seed: int, params_of: str, kept: dict) -> None:
  """Adds to `params_of`'s file of `seed` the products of its draws with each other method's
  (`kept`: method -> [draws matrix per checkpoint])."""
  path = _params_path(runs, seed, params_of)
  with open(path, encoding="utf-8") as f:
    saved = json.load(f)
  for k, point in enumerate(saved["checkpoints"]):
    point["cross"] = {m: (kept[params_of][k] @ d[k].T).tolist() for m, d in kept.items()
                      if m != params_of}
  workdir_lib.write_json(path, saved)


def measure(runs, draws: int, count: int, params_of: str | None = None, sources=None,
            params_from: str | None = None, provenance: dict | None = None,
            gram: bool = False, cross: bool = False) -> list:
  """Each run's gradient variance at `count` of its checkpoints (module docstring), saved
  beside its metrics with `provenance` (`cli.provenance`); with `params_of`, every run's method
  at the checkpoints of `params_of`'s run of the same seed, among `sources` (default `runs`;
  the runs of `params_from` with --params_from); with `cross`, the products of `params_of`'s
  draws with the other methods' added to its file, seed by seed. Returns the runs it failed
  for."""
  from bpo_jax.training import gradient_variance  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings  # pylint: disable=g-import-not-at-top
  sources = {(r.estimator, r.seed): (r, c) for r, c in (sources or runs)}
  seeds = sorted({r.seed for r, _ in runs})
  redo = {s for s in seeds if cross and not _has_cross(runs, s, params_of)}
  failed, kept = [], {}
  for run, c in runs:
    source, _ = sources[(params_of or run.estimator, run.seed)]
    os.makedirs(run.workdir, exist_ok=True)
    path = os.path.join(run.workdir, aggregate.GRADIENT_VARIANCE_JSON)
    start = time.perf_counter()
    try:
      steps = gradient_variance.spread(gradient_variance.kept_steps(source.workdir), count)
      if (run.seed not in redo
          and _reusable(path, draws, steps, params_of, params_from, gram)):
        print(f"{run.estimator} seed {run.seed}: gradient variance measured, skipped")
        continue
      results = gradient_variance.checkpoint_gradient_variance(
          settings.from_config(c), source.workdir, steps, draws, gram, run.seed in redo)
    except Exception as error:  # pylint: disable=broad-except
      failed.append(run)
      redo.discard(run.seed)  # no products for a seed with a method missing
      kept.pop(run.seed, None)
      print(f"error: {run.estimator} seed {run.seed}: gradient variance failed: "
            f"{type(error).__name__}: {' '.join(str(error).split())}", file=sys.stderr)
      continue
    if run.seed in redo:
      kept.setdefault(run.seed, {})[run.estimator] = [r.pop("draws_matrix") for r in results]
    workdir_lib.write_json(path, {"draws": draws, "checkpoints": results,
                                  "params_of": params_of, "params_from": params_from,
                                  "provenance": provenance})
    measured = kept.get(run.seed, {})
    if len(measured) == sum(r.seed == run.seed for r, _ in runs):
      _write_cross(runs, run.seed, params_of, kept.pop(run.seed))
    print(f"{run.estimator} seed {run.seed}: gradient variance at checkpoints {steps} "
          f"({draws} draws) in {time.perf_counter() - start:.0f} s")
    for r in results:
      if r["failed_draws"]:
        print(f"warning: {run.estimator} seed {run.seed}, checkpoint {r['step']}: "
              f"{r['failed_draws']} draws with a failed branch left out, the first "
              f"{r['failure']}", file=sys.stderr)
  return failed


def main(argv):
  cli.refuse_arguments(argv)
  draws, count = _FLAGS["draws"].value, _FLAGS["checkpoints"].value
  if draws < 2:
    cli.fail(f"--draws={draws}: must be >= 2")
  if count < 1:
    cli.fail(f"--checkpoints={count}: must be >= 1")
  estimators = _FLAGS["estimators"].value
  params_of = _FLAGS["params"].value or None
  if params_of and params_of not in estimators:
    cli.fail(f"--params={params_of}: must be one of --estimators ({','.join(estimators)})")
  params_from = _FLAGS["params_from"].value or None
  if params_from and not params_of:
    cli.fail(f"--params_from={params_from}: needs --params")
  if _FLAGS["cross"].value and not (params_of and _FLAGS["gram"].value):
    cli.fail("--cross: needs --params and --gram")
  spec = cli.config_arg(sys.argv)
  out = _FLAGS["out"].value or os.path.join("results", compare.config_name(spec))
  seeds, first_seed = _FLAGS["seeds"].value, _FLAGS["first_seed"].value
  runs = compare.plan(_FLAGS["config"].value, estimators, seeds, out, first_seed)
  if params_from:
    sources = source_runs(params_from, params_of, seeds, first_seed)
  elif missing := unfinished(runs, params_of):
    cli.fail(f"{missing[0]}: not a finished run; train it first (experiments/compare.py)")
  else:
    sources = None
  os.makedirs(out, exist_ok=True)
  failed = measure(runs, draws, count, params_of, sources, params_from,
                   cli.provenance("grad_variance.py", sys.argv[1:]), _FLAGS["gram"].value,
                   _FLAGS["cross"].value)
  compare.write_results(runs, out, spec, params_of, trained=sources)
  if failed:
    sys.exit(1)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags)
