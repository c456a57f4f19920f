r"""The warm start alone, seed by seed: success along its steps, to choose where it stops.

    python experiments/warm_start_pilot.py --config=experiments/configs/rooms_regime.py \
        --seeds=10 --steps=140 --from_step=60 --heldout_every=20 --out=results/rooms_regime/warm_start_pilot.jsonl

For each seed the configuration's warm start runs `--steps` steps with no stop (whatever
`warm_start.target_success` says) and, every `warm_start.check_every` steps from
`--from_step`, logs the greedy
success on the warm start's validation tasks (training tasks, `warm_start.validation_positions`)
and, every `--heldout_every` steps, on the first `--heldout_tasks` held-out tasks. One line per
check goes to `--out` (JSON: seed, step, the success rates and their task counts), appended as
it is measured; a seed already in the file is skipped, so the pilot resumes (a last line cut
short by a kill or a full disk is dropped first). A write that fails is one line, exit status
1, and leaves the checks already written. No RL iteration runs, and no
checkpoint is written (the tokenizer goes to a temporary directory).

Bad flags (an unknown key, a step count that is not a multiple of the check interval): one
line, exit status 2.
"""

import json
import os
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from ml_collections import config_flags

from bpo_jax.training import config as config_lib
from experiments import cli

# The flags, defined when run as a command (importing the module for its functions defines none).
_FLAGS = {}


def _define_flags():
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Configuration file.")
  _FLAGS["seeds"] = flags.DEFINE_integer("seeds", 10, "Seeds 0..N-1.")
  _FLAGS["steps"] = flags.DEFINE_integer("steps", 140, "Warm-start steps per seed.")
  _FLAGS["heldout_every"] = flags.DEFINE_integer("heldout_every", 20,
                                                 "Held-out evaluation interval.")
  _FLAGS["heldout_tasks"] = flags.DEFINE_integer("heldout_tasks", 128,
                                                 "Held-out tasks evaluated.")
  _FLAGS["from_step"] = flags.DEFINE_integer(
      "from_step", 0, "No check before this step (success is 0 while the loss is high; the "
      "checks cost time).")
  _FLAGS["out"] = flags.DEFINE_string("out", None, "JSON-lines file the checks are appended to.")


def parse_flags(argv):
  """absl flag parsing that reports a bad flag, config file or override in one line."""
  return cli.parse_config_flags(argv, _FLAGS["config"],
                                example="experiments/configs/rooms_regime.py")


def done_seeds(path: str) -> set[int]:
  """The seeds whose last check (step == their steps) the file holds. A last line cut short (a
  run killed or out of disk while writing it) is dropped from the file, so appends resume on a
  line of their own."""
  if not os.path.exists(path):
    return set()
  with open(path, "rb") as f:
    data = f.read()
  whole = data[:data.rfind(b"\n") + 1]
  if len(whole) < len(data):
    os.truncate(path, len(whole))
  rows = [json.loads(line) for line in whole.decode().splitlines() if line.strip()]
  return {r["seed"] for r in rows if r["step"] == r["steps"]}


def pilot_seed(config, seed: int, out, steps: int, from_step: int, heldout_every: int,
               heldout_tasks: int) -> None:
  """One seed's warm start with its checks written to `out` as they are measured."""
  # JAX and the library's training modules load once the flags are known good.
  import jax  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import evaluation  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import experiment as experiment_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import iteration as iteration_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import placement as placement_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings as settings_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import warm_start as warm_start_lib  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  config.seed = seed
  settings = settings_lib.from_config(config)
  ws = settings.warm_start
  with tempfile.TemporaryDirectory() as workdir:
    exp, state = experiment_lib.build_experiment(settings, workdir)
    placement = placement_lib.Placement()
    validation = loop._validation(exp, placement)  # pylint: disable=protected-access
    heldout = exp.eval_tasks[:heldout_tasks]
    key = jax.random.key(seed + 1)
    check_steps = iter(range(ws.check_every, steps + 1, ws.check_every))

    def check(params) -> float:
      step = next(check_steps)
      if step < from_step:
        return -1.0
      row = {"seed": seed, "step": step, "steps": steps,
             "validation_success": validation(params),
             "validation_tasks": ws.validation_tasks}
      if step % heldout_every == 0:
        policy = iteration_lib.policy_for_sampling(exp, placement, params)
        row["heldout_success"] = evaluation.evaluate_policy(
            exp, policy, heldout, key, settings.eval.confidence)["success_rate"]
        row["heldout_tasks"] = len(heldout)
      out.write(json.dumps(row) + "\n")
      out.flush()
      print(json.dumps(row), flush=True)
      return -1.0  # below any target: the pilot runs every step

    try:
      warm_start_lib.warm_start(exp, placement.place_params(state.params), placement, check)
    finally:
      exp.close()


def main(argv):
  cli.refuse_arguments(argv)
  config = _FLAGS["config"].value
  steps, heldout_every, out_path = (_FLAGS[k].value for k in ("steps", "heldout_every", "out"))
  if out_path is None:
    cli.fail("--out is required, e.g. --out=results/rooms_regime/warm_start_pilot.jsonl")
  config.warm_start.steps = steps
  config.warm_start.target_success = 1.0  # checks on; `check` never reaches it
  every = config.warm_start.check_every
  if steps % every or heldout_every % every:
    cli.fail(f"--steps = {steps} and --heldout_every = {heldout_every}: must be multiples of "
             f"warm_start.check_every = {every}")
  try:
    config_lib.validate(config, "train", None)
  except config_lib.ConfigError as error:
    cli.fail(str(error))
  try:
    done = done_seeds(out_path)
    with open(out_path, "a") as out:
      for seed in range(_FLAGS["seeds"].value):
        if seed not in done:
          pilot_seed(config, seed, out, steps, _FLAGS["from_step"].value, heldout_every,
                     _FLAGS["heldout_tasks"].value)
  except OSError as error:  # a full disk, an unwritable --out: the checks so far stay
    print(f"error: --out={out_path}: {error.strerror or error}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags)
