r"""Each held-out task's outcome at a comparison's kept checkpoints, replayed from the checkpoints.

    python experiments/task_outcomes.py --results=results/rooms_regime

A run's held-out records carry each task's outcome (`task_successes`) since that field exists;
for runs written before, this replays the evaluation at every kept checkpoint the run evaluated
(`runs/EST/seedS/checkpoints/N` with an eval record of iteration N), exactly as the run's loop
evaluated it (the same tasks, key and decoding), and writes
`runs/EST/seedS/task_outcomes.json`: {"outcomes": {"N": "1001…"}} and how it was made
(`cli.provenance`: the commit, whether the code differed from it, the command, the time).

The replay is held to the run's own records: its number of successes must be the logged one,
and where the record has `task_successes`, the same string. A run whose replay differs or
fails (a missing or unreadable checkpoint, say) is reported in one line and gets no file; the
others are still replayed, and the exit status is 1. Runs that have the file are skipped, so
the script resumes. A bad flag, or no finished run under `--results`: one line, exit status 2.

With `--temperature=T` each checkpoint is evaluated as the loop would have with
`eval.temperature = T` (the same tasks and key; T = 1, the rollouts' temperature, gives the
held-out success of the policy the estimators train, where the logged evaluation is greedy),
written to `runs/EST/seedS/task_outcomes_temperature<T>.json` with "temperature": T. Where T is
not the run's own evaluation temperature there is no record to hold the replay to.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from experiments import cli  # noqa: E402

OUTCOMES = "task_outcomes.json"


def logged_evaluations(workdir: str) -> dict[int, dict]:
  """The last held-out record of each iteration in `workdir`'s metrics.jsonl (at iteration 0,
  the one after the warm start rather than the untrained model's)."""
  from bpo_jax.training import metrics  # pylint: disable=g-import-not-at-top
  return {r["iteration"]: r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if r.get("phase") == "eval"}


def outcomes_file(temperature: float | None) -> str:
  """The file a replay writes: `OUTCOMES` at the run's own evaluation temperature (None),
  else task_outcomes_temperature<T>.json (T as `%g` writes it: 1, 0.5)."""
  return OUTCOMES if temperature is None else f"task_outcomes_temperature{temperature:g}.json"


def replay(workdir: str, steps: list[int], temperature: float | None = None) -> dict[int, dict]:
  """The held-out record of each checkpoint `steps` of the run in `workdir` (its configuration
  the one compare.py saved beside it, `workdir`.json), evaluated as the run's loop evaluated it
  (one device), or as it would have at `eval.temperature = temperature`; the experiment is
  built once."""
  from bpo_jax.training import evaluation  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import experiment as experiment_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings as settings_lib  # pylint: disable=g-import-not-at-top
  from experiments import json_config  # pylint: disable=g-import-not-at-top
  config = json_config.get_config(workdir + ".json")
  if temperature is not None:
    config.eval.temperature = temperature
  settings = settings_lib.from_config(config)
  exp, state = experiment_lib.build_experiment(settings, workdir)
  try:
    out = {}
    for step in steps:
      restored, _, _ = loop.restore_checkpoint(exp, state, step)
      out[step] = evaluation.eval_record(exp, exp.sampling_params(restored.params), step)
    return out
  finally:
    exp.close()


def _read_config(workdir: str) -> dict:
  with open(workdir + ".json") as f:
    return json.load(f)


def check(logged: dict, replayed: dict) -> str | None:
  """Why a replayed record is not the logged one (None when it is)."""
  if replayed["successes"] != logged["successes"]:
    return f"{replayed['successes']} successes against the logged {logged['successes']}"
  if "task_successes" in logged and logged["task_successes"] != replayed["task_successes"]:
    return "the same count but other tasks than the logged task_successes"
  return None


def run_dirs(results: str) -> list[str]:
  """The finished runs under `results` (runs/EST/seedS with a summary.json and compare.py's
  seedS.json beside it), in order."""
  found = [p for p in glob.glob(os.path.join(results, "runs", "*", "seed*", "summary.json"))
           if os.path.exists(os.path.dirname(p) + ".json")]
  key = lambda p: (p.split(os.sep)[-3], int(re.sub(r"\D", "", p.split(os.sep)[-2])))
  return [os.path.dirname(p) for p in sorted(found, key=key)]


def main(argv) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.error = cli.fail  # a bad flag: one line, exit status 2
  p.add_argument("--results", required=True, help="a comparison's directory (compare.py --out)")
  p.add_argument("--temperature", type=float, default=None,
                 help="evaluate at this temperature (default: the run's own, held to its record)")
  args = p.parse_args(argv)
  if args.temperature is not None and not 0 <= args.temperature < float("inf"):
    cli.fail(f"--temperature={args.temperature}: must be a number >= 0")
  target = outcomes_file(args.temperature)
  runs = run_dirs(args.results)
  if not runs:
    cli.fail(f"--results={args.results}: no finished run (runs/EST/seedS/summary.json)")
  from bpo_jax.training import gradient_variance  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  made = cli.provenance("task_outcomes.py", argv)
  failed = 0
  for workdir in runs:
    name = os.path.relpath(workdir, args.results)
    if os.path.exists(os.path.join(workdir, target)):
      print(f"{name}: done, skipped")
      continue
    try:
      logged = logged_evaluations(workdir)
      steps = [s for s in gradient_variance.kept_steps(workdir) if s in logged]
      replayed = replay(workdir, steps, args.temperature)
      own = _read_config(workdir)["eval"]["temperature"]
    except Exception as error:  # pylint: disable=broad-except
      failed += 1
      print(f"error: {name}: the replay failed: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}", file=sys.stderr)
      continue
    held = args.temperature is None or args.temperature == own
    problems = [f"checkpoint {s}: {why}" for s in steps
                if held and (why := check(logged[s], replayed[s])) is not None]
    if problems:
      failed += 1
      print(f"error: {name}: the replay is not the run's record: {'; '.join(problems)}",
            file=sys.stderr)
      continue
    at = {} if args.temperature is None else {"temperature": args.temperature}
    try:  # written whole or not at all (a temporary file renamed into place)
      workdir_lib.write_json(os.path.join(workdir, target), {
          **at, "outcomes": {str(s): replayed[s]["task_successes"] for s in steps}, **made})
    except OSError as error:  # a full disk, say: this run gets no file, the others go on
      failed += 1
      print(f"error: {name}: {target} not written: {error}", file=sys.stderr)
      continue
    print(f"{name}: checkpoints {steps} replayed, "
          f"{[replayed[s]['successes'] for s in steps]} successes"
          + (" as logged" if held else f" at temperature {args.temperature:g}"))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
