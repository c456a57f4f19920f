r"""Runs estimators x seeds of one configuration and writes the comparison: table, JSON, plots.

    python experiments/compare.py --config=experiments/configs/rooms.py --seeds=5
    python experiments/compare.py --config=experiments/configs/rooms.py:tiny --seeds=2 \
        --estimators=bpo,grpo --out=results/rooms_tiny --config.train.iterations=4

`--config=FILE[:ARG]` is one method's configuration (and `--config.a.b=v` overrides it, as in
run.py); each estimator of `--estimators` gets it through `configs/base.with_estimator` (a
baseline rolls as many whole episodes as fit in the env-step budget BPO's tree grows in), and
each seed 0..N-1 of `--seeds=N` (S..S+N-1 with `--first_seed=S`; the table covers this call's
seeds) sets `seed`. Every (estimator, seed) is a normal training run,

    python experiments/run.py --config=experiments/json_config.py:OUT/runs/EST/seedS.json \
        --workdir=OUT/runs/EST/seedS

in a subprocess, `--jobs` at a time (default: as many as the machine has cores, at most the
runs left; on one accelerator use --jobs=1). Its output goes to OUT/runs/EST/seedS.log. Runs are
resumable: a finished one (summary.json holding all of its iterations) is skipped, an unfinished
one resumes from its latest checkpoint; a finished one whose saved config differs is an error.
Each run's provenance.json records the code commit and this command as it starts (and, under
"resumed", every later command that resumed it).

With `--share_warm_start`, a seed's warm start is trained once, by its first estimator's run,
and the seed's other runs start from that run's checkpoint 0 (parameters, Adam moments, the
iteration-0 evaluations) and tokenizer, each as soon as it is written; the warm start does not
read the estimator, so every run computes what it would have alone, bit for bit (the test), in
a fraction of the time when the warm start is most of a run. A run whose first run finished
earlier and kept no checkpoint 0 (records are committed, checkpoints are not) trains its own.

Then OUT (default results/<config name>, e.g. results/rooms_tiny) receives results.json
(per method over seeds, `aggregate.aggregate`), results.md (the table and claim 3) and the
plots of `aggregate.plots`.

`experiments/grad_variance.py` measures the finished runs' gradient variance and adds it to
these files.

Bad flags or configurations (an --out that is a file): one line, exit status 2; a run that
fails is reported with its log's last line (the error), the others are still aggregated and
results.md names the runs left out, exit status 1; with no finished run no results or plots
are written. Every results file is written whole (a temporary file renamed into place).
"""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import ml_collections
from ml_collections import config_flags

from bpo_jax.training import config as config_lib
from bpo_jax.training import estimator_registry
from bpo_jax.training import settings as settings_lib
from bpo_jax.training import workdir as workdir_lib
from experiments import aggregate
from experiments import cli
from experiments.configs import base

# The flags, defined when run as a command (importing the module for its functions defines none).
_FLAGS = {}


def define_comparison_flags(into: dict):
  """The flags compare.py and grad_variance.py share, into `into`: the configuration, the
  estimators, the seeds and the output directory."""
  into["config"] = config_flags.DEFINE_config_file(
      "config", None, "One method's configuration file.", lock_config=True)
  into["estimators"] = flags.DEFINE_list("estimators", ["bpo", "grpo", "rloo", "gigpo"],
                                         "Estimators to compare (registered names).")
  into["seeds"] = flags.DEFINE_integer("seeds", 5, "Seeds 0..N-1 per estimator.")
  into["first_seed"] = flags.DEFINE_integer(
      "first_seed", 0, "With --seeds=N, the seeds S..S+N-1: e.g. one more seed of a sweep, or "
      "measurements at one seed's runs.")
  into["out"] = flags.DEFINE_string("out", None,
                                    "Output directory (default results/<config name>).")


def _define_flags():
  define_comparison_flags(_FLAGS)
  _FLAGS["jobs"] = flags.DEFINE_integer("jobs", 0, "Runs at once; 0 = the machine's cores.")
  _FLAGS["share_warm_start"] = flags.DEFINE_bool(
      "share_warm_start", False, "Train each seed's warm start once, in the first estimator's "
      "run; the seed's other runs start from its checkpoint 0 and tokenizer.")


RUN_PY = os.path.join(_ROOT, "experiments", "run.py")
JSON_CONFIG_PY = os.path.join(_ROOT, "experiments", "json_config.py")

@dataclasses.dataclass(frozen=True)
class Run:
  estimator: str
  seed: int
  workdir: str

  @property
  def config_path(self) -> str:
    return self.workdir + ".json"

  @property
  def log_path(self) -> str:
    return self.workdir + ".log"


_fail = cli.fail


def parse_flags(argv):
  """absl flag parsing that reports a bad flag, config file or override in one line."""
  return cli.parse_config_flags(argv, _FLAGS["config"], example="experiments/configs/rooms.py")


def config_name(spec: str) -> str:
  """`experiments/configs/rooms.py:tiny` → `rooms_tiny`."""
  path, _, arg = spec.partition(":")
  stem = os.path.splitext(os.path.basename(path))[0]
  return f"{stem}_{arg}" if arg else stem


def run_config(config, estimator: str, seed: int) -> ml_collections.ConfigDict:
  """`config` for `estimator` (`base.with_estimator`: a baseline rolls as many whole episodes
  as fit in the config's env-step budget, the budget BPO's tree grows in) and `seed`."""
  config = ml_collections.ConfigDict(config_lib.to_plain(config))
  config = base.with_estimator(config, estimator)
  config.seed = seed
  return config


def plain(config) -> dict:
  """The configuration as its JSON file holds it (tuples become lists)."""
  return json.loads(json.dumps(config_lib.to_plain(config)))


def checkpoints_written(config) -> int:
  """Checkpoints a run writes: iteration 0, every `checkpoint.every`-th and the last."""
  return 1 + -(-config.train.iterations // config.checkpoint.every)


def finished(run: Run, iterations: int) -> bool:
  path = os.path.join(run.workdir, "summary.json")
  if not os.path.exists(path):
    return False
  with open(path, encoding="utf-8") as f:
    return json.load(f).get("iterations", 0) >= iterations


def _saved_differences(run: Run, config) -> list[str]:
  """Keys whose values differ between `config` and a finished run's saved config.json."""
  with open(os.path.join(run.workdir, "config.json"), encoding="utf-8") as f:
    saved = json.load(f)
  saved.pop("env_protections", None)
  saved.pop(workdir_lib.FLAG_KEYS, None)
  # How many checkpoints a run keeps does not change its numbers (a resumed run may change it).
  return list(config_lib.saved_differences(saved, plain(config), ignore=("checkpoint.keep",)))


def plan(config, estimators, seeds: int, out: str,
         first_seed: int = 0) -> list[tuple[Run, ml_collections.ConfigDict]]:
  """Every (estimator, seed) run of seeds first_seed..first_seed+seeds-1 with its configuration,
  validated; exits 2 on a problem."""
  unknown = [e for e in estimators if e not in estimator_registry.names()]
  if unknown or not estimators:
    _fail(f"--estimators={','.join(estimators)}: each must be one of "
          f"{', '.join(estimator_registry.names())}")
  if seeds < 1:
    _fail(f"--seeds={seeds}: must be >= 1")
  if first_seed < 0:
    _fail(f"--first_seed={first_seed}: must be >= 0")
  runs = []
  # Seed by seed: the first seeds of every method finish first, and a method's later seeds
  # find its programs in the persistent compilation cache when one is set.
  for seed in range(first_seed, first_seed + seeds):
    for estimator in estimators:
      run = Run(estimator, seed, os.path.join(out, "runs", estimator, f"seed{seed}"))
      c = run_config(config, estimator, seed)
      c.checkpoint.keep = max(c.checkpoint.keep, checkpoints_written(c))
      try:
        config_lib.validate(c)
      except config_lib.ConfigError as error:
        _fail(f"{estimator}, seed {seed}: invalid configuration: {'; '.join(error.problems)}")
      if finished(run, c.train.iterations) and (diff := _saved_differences(run, c)):
        _fail(f"{run.workdir} holds a finished run with other settings ({', '.join(diff)}); "
              "use another --out")
      runs.append((run, c))
  return runs


def train(run: Run, config, env: dict) -> tuple[Run, int, float]:
  """Trains one run with run.py in a subprocess: (run, exit status, seconds)."""
  os.makedirs(os.path.dirname(run.workdir), exist_ok=True)
  workdir_lib.write_json(run.config_path, plain(config))
  command = [sys.executable, RUN_PY, f"--config={JSON_CONFIG_PY}:{run.config_path}",
             f"--workdir={run.workdir}"]
  start = time.perf_counter()
  with open(run.log_path, "a", encoding="utf-8") as log:
    status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                            check=False).returncode
  return run, status, time.perf_counter() - start


PROVENANCE = "provenance.json"


def record_provenance(run: Run, made: dict) -> None:
  """Writes `run`'s provenance.json as its training starts: the code commit, whether the code
  differed from it, and the command (`made`, `cli.provenance("compare.py", ...)`, as
  {"commit", "code_changes", "commands": {"train": ...}, "created"}). A run resumed by a later
  command keeps its first record and adds each later one under "resumed" (its commit, changes,
  command and time), so a run trained across commits says so. A record that does not read (not
  JSON, or not a record) is replaced by this one, which says so ("earlier": "unreadable")."""
  path = os.path.join(run.workdir, PROVENANCE)
  entry = {k: made[k] for k in ("commit", "code_changes", "created")}
  first = dict(entry, commands={"train": made["command"]})
  if not os.path.exists(path):
    workdir_lib.write_json(path, first)
    return
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    record.setdefault("resumed", []).append(dict(entry, command=made["command"]))
  except (ValueError, AttributeError):
    print(f"{run.estimator} seed {run.seed}: {path} does not read; written anew", flush=True)
    record = dict(first, earlier="unreadable")
  workdir_lib.write_json(path, record)


def exit_reason(status: int) -> str:
  """A run's exit status in words; a SIGKILL (status -9) is most often the kernel's
  out-of-memory killer, which fewer runs at once (`--jobs`) avoid.

  >>> exit_reason(-9)
  'killed by SIGKILL, most often for want of memory: try fewer --jobs'
  """
  if status == -signal.SIGKILL:
    return "killed by SIGKILL, most often for want of memory: try fewer --jobs"
  if status < 0:
    return f"killed by {signal.Signals(-status).name}"
  return f"exit {status}"


def _last_line(path: str) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = [line.strip() for line in f if line.strip()]
  return lines[-1] if lines else "(no output)"


def default_jobs(pending: int) -> int:
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return max(1, min(pending, cores or 1))


def warm_start_leads(runs) -> dict:
  """`--share_warm_start`: run -> the run whose warm start it starts from, the first run of its
  seed (in `--estimators` order) for every other run of that seed."""
  first, leads = {}, {}
  for run, _ in runs:
    lead = first.setdefault(run.seed, run)
    if lead is not run:
      leads[run] = lead
  return leads


def lost_leads(leads: dict, pending) -> list:
  """The runs of `leads` whose lead is not `pending` (it finished earlier) and whose checkpoint
  0 is not on disk, as in a fresh checkout of a sweep whose records are kept but not its
  checkpoints: each of them trains its own warm start, which gives the same checkpoint 0."""
  return [run for run, lead in leads.items()
          if run in pending and lead not in pending and not os.path.isdir(_checkpoint_zero(lead))]


def _checkpoint_zero(run: Run) -> str:
  # Orbax writes a checkpoint under a temporary name and renames it into place when complete.
  return os.path.join(run.workdir, "checkpoints", "0")


def start_from_lead(run: Run, lead: Run, config) -> None:
  """Gives `run` the parameters, Adam moments and loop state (the iteration-0 evaluations and
  the warm start's records) of `lead`'s checkpoint 0, and its tokenizer, so that run.py
  resumes from there. The warm start does not read the estimator: with the same seed and
  settings each run would compute the same checkpoint 0 (tests/training/test_compare.py checks
  this bit for bit), so the run's record (config.json) is its own `config`'s. Nothing is
  copied into a run that already has checkpoints."""
  if os.path.isdir(os.path.join(run.workdir, "checkpoints")):
    return
  os.makedirs(run.workdir, exist_ok=True)
  workdir_lib.write_json(os.path.join(run.workdir, workdir_lib.CONFIG),
                         {**workdir_lib.config_record(settings_lib.from_config(config)),
                          workdir_lib.FLAG_KEYS: []})
  tokenizer = os.path.join(lead.workdir, "tokenizer")
  if os.path.isdir(tokenizer):
    shutil.copytree(tokenizer, os.path.join(run.workdir, "tokenizer"), dirs_exist_ok=True)
  staging = os.path.join(run.workdir, "checkpoints.partial")
  shutil.rmtree(staging, ignore_errors=True)
  shutil.copytree(_checkpoint_zero(lead), os.path.join(staging, "0"))
  os.replace(staging, os.path.join(run.workdir, "checkpoints"))


def pick(ready: list[bool], lead: list[bool], jobs: int) -> int | None:
  """The index of the pending run to start next, None if none is ready: the first ready one in
  plan order (seed by seed), except that while fewer than `jobs` other ready runs wait, the first
  lead (a run others wait on for its checkpoint 0) goes first, so that its warm start is done
  before the lanes run dry.

  Example: pick([True, False, True], [False, False, True], 2) == 2 (one other ready run, two
  lanes); pick([True, True, True], [False, False, True], 2) == 0.
  """
  ready_at = [i for i, r in enumerate(ready) if r]
  if not ready_at:
    return None
  others = [i for i in ready_at if not lead[i]]
  leads_ready = [i for i in ready_at if lead[i]]
  if len(others) < jobs and leads_ready:
    return leads_ready[0]
  return ready_at[0]


def train_all(runs, jobs: int, leads: dict | None = None,
              provenance: dict | None = None) -> list[Run]:
  """Trains the unfinished runs, `jobs` at a time; returns the runs that failed. Each run
  started records `provenance` in its workdir (`record_provenance`), where given. With `leads`
  (`warm_start_leads`), a run waits until its lead has written checkpoint 0 and starts from it
  (`start_from_lead`); meanwhile the others go first, in the order of `pick`. A run whose lead
  fails before writing checkpoint 0 fails; one whose lead finished earlier and left no
  checkpoint 0 trains its own warm start (`lost_leads`)."""
  leads = leads or {}
  pending = []
  for r, c in runs:
    if finished(r, c.train.iterations):
      print(f"{r.estimator} seed {r.seed}: finished, skipped")
    else:
      pending.append((r, c))
  jobs = jobs or default_jobs(len(pending))
  leads = dict(leads)
  for run in lost_leads(leads, {r for r, _ in pending}):
    lead = leads.pop(run)
    print(f"{run.estimator} seed {run.seed}: trains its own warm start (the checkpoint 0 of "
          f"{lead.estimator} seed {lead.seed}, finished, is not on disk)")
  env = dict(os.environ)
  if jobs > 1:  # several runs share the accelerator's memory
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  failed, lock = [], threading.Condition()

  def next_run():
    """The pending run to start next (`pick`), None when none is left; waits while none can."""
    with lock:
      while pending:
        for i, (run, _) in enumerate(pending):
          lead = leads.get(run)
          if (lead in failed and not os.path.isdir(_checkpoint_zero(lead))
              and not os.path.isdir(os.path.join(run.workdir, "checkpoints"))):
            del pending[i]
            failed.append(run)
            print(f"error: {run.estimator} seed {run.seed} not started: the run of its warm "
                  f"start ({lead.estimator} seed {lead.seed}) failed", file=sys.stderr)
            break
        else:
          waiting = {leads[r] for r, _ in pending if r in leads}
          ready = [r not in leads or os.path.isdir(_checkpoint_zero(leads[r]))
                   or os.path.isdir(os.path.join(r.workdir, "checkpoints")) for r, _ in pending]
          i = pick(ready, [r in waiting for r, _ in pending], jobs)
          if i is not None:
            return pending.pop(i)
          lock.wait(timeout=2.0)  # a lead's checkpoint 0 appears on disk while it runs
      return None

  def worker():
    while (item := next_run()) is not None:
      run, config = item
      if run in leads:
        start_from_lead(run, leads[run], config)
      if provenance is not None:
        os.makedirs(run.workdir, exist_ok=True)
        record_provenance(run, provenance)
      run, status, seconds = train(run, config, env)
      with lock:
        if status == 0:
          print(f"{run.estimator} seed {run.seed}: trained in {seconds:.0f} s", flush=True)
        else:
          failed.append(run)
          print(f"error: {run.estimator} seed {run.seed} failed ({exit_reason(status)}): "
                f"{_last_line(run.log_path)}", file=sys.stderr, flush=True)
        lock.notify_all()

  threads = [threading.Thread(target=worker) for _ in range(min(jobs, len(pending)))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return failed


def write_results(runs, out: str, spec: str, params_of: str | None = None,
                  trained=None, failed=()) -> dict | None:
  """Aggregates the finished runs of `trained` (default `runs`) into OUT/results.json,
  results.md and the plots, each file written whole; with `params_of`, claim 2 from the
  shared-parameter measurements of `runs` (`results["claim_2_shared"]`). A method without a
  finished run is left out, the `failed` runs are named in both files, and with no finished run
  nothing is written (returns None)."""
  per_method: dict[str, list[dict]] = {}
  shared: dict[str, list[dict]] = {}
  for run, c in trained or runs:
    if finished(run, c.train.iterations):
      per_method.setdefault(run.estimator, []).append(
          aggregate.run_metrics(aggregate.read_run(run.workdir)))
  if not per_method:
    print(f"error: no run finished: nothing written to {out}", file=sys.stderr)
    return None
  for run, _ in runs:
    path = os.path.join(run.workdir, aggregate.GRADIENT_VARIANCE_JSON)
    if params_of and os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        measured = json.load(f)
      if measured.get("params_of") == params_of:
        shared.setdefault(run.estimator, []).append(measured)
  if params_of:  # the methods' own rows hold no variance measured at their own parameters
    for summaries in per_method.values():
      for m in summaries:
        m["gradient_variance"] = None
  results = aggregate.aggregate(per_method)
  results["config"] = spec
  table = aggregate.markdown(results)
  if params_of:
    results["claim_2_shared"] = aggregate.shared_variance(shared, params_of)
    table += "\n".join(aggregate.claim_two_lines(results["claim_2_shared"])) + "\n"
  if failed:
    results["failed"] = [f"{r.estimator} seed {r.seed}" for r in failed]
    table += (f"\nLeft out, failed: {', '.join(results['failed'])} (their logs: "
              "runs/EST/seedS.log).\n")
  workdir_lib.write_json(os.path.join(out, "results.json"), results)
  workdir_lib.write_text(os.path.join(out, "results.md"), f"# {spec}\n\n{table}")
  results["plots"] = aggregate.plots(results, out)
  print(table, end="")
  return results


def main(argv):
  cli.refuse_arguments(argv)
  jobs = _FLAGS["jobs"].value
  if jobs < 0:
    _fail(f"--jobs={jobs}: must be >= 0 (0 = the machine's cores)")
  spec = cli.config_arg(sys.argv)
  out = _FLAGS["out"].value or os.path.join("results", config_name(spec))
  if os.path.exists(out) and not os.path.isdir(out):
    _fail(f"--out={out}: exists and is not a directory")
  runs = plan(_FLAGS["config"].value, _FLAGS["estimators"].value, _FLAGS["seeds"].value, out,
              _FLAGS["first_seed"].value)
  os.makedirs(out, exist_ok=True)
  leads = warm_start_leads(runs) if _FLAGS["share_warm_start"].value else None
  failed = train_all(runs, jobs, leads, cli.provenance("compare.py", sys.argv[1:]))
  if write_results(runs, out, spec, failed=failed) is None or failed:
    sys.exit(1)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags)
