r"""Runs an experiment: train (default), evaluate or export a configuration's workdir, or dry-run it.

    python experiments/run.py --config=experiments/configs/quickstart.py --workdir=workdirs/qs
    python experiments/run.py --config=experiments/configs/rooms.py --workdir=workdirs/g \
        --config.rollout.estimator=grpo --config.train.iterations=20 --config.rollout.group_size=8
    python experiments/run.py --config=experiments/configs/quickstart.py --workdir=workdirs/qs \
        --mode=eval
    python experiments/run.py --config=experiments/configs/quickstart.py --workdir=workdirs/qs \
        --mode=export --export_dir=exports/qs     # an HF directory transformers loads as is
    python experiments/run.py --config=experiments/configs/pod_qwen2_5_7b_v5p64.py --dry_run

`--config.model.checkpoint=DIR` starts from an HF checkpoint (its config.json decides the
model's shape; `scale.model_preset` is then a check of that shape), `--config.model.lora_rank=R`
trains low-rank adapters over the frozen base, `--config.train.kl_coef=B` adds the k3 KL term
toward the parameters the policy gradient starts from.

A workdir is its run's record (`bpo_jax/training/workdir.py`): a resume, `--mode=eval` and
`--mode=export` take the values of the keys the training's command line set (e.g.
`--config.model.checkpoint`) from its config.json, so those flags need not be repeated; a flag
or config file that contradicts the record is refused naming the keys, except, for eval and
export, the evaluation's settings and the devices (`loop.EVAL_CHANGES`). One run at a time uses
a workdir: a second is refused while the first holds its lock.

Training resumes from the workdir's latest checkpoint that restores (a corrupt one is named and
set aside). Several processes (one
per host of a pod, or two on one machine) run the same command with their own
`--config.scale.distributed.process_id` and the same `num_processes` and `coordinator_address`
(process 0's "host:port"); they share the workdir, and process 0 prints the results:

    python experiments/run.py --config=experiments/configs/quickstart.py --workdir=workdirs/qs2 \
        --config.scale.distributed.num_processes=2 --config.scale.distributed.process_id=0 \
        --config.scale.distributed.coordinator_address=localhost:12355   # and process_id=1

`--dry_run` compiles the loop's own train step, sampler and reshard for the configuration's mesh
on fake CPU devices and reports their per-device memory (`bpo_jax.training.dry_run`).

An invalid configuration (unknown key, wrong type, a NaN or Inf, a value outside the allowed
ones, budgets that cannot hold one tree, a size this host's memory cannot hold, a workdir that
cannot be written, a missing checkpoint directory for `--mode=eval` or `export`) is reported,
naming the key, before any compute, and the command exits with status 2; so is a checkpoint
the run cannot use (`models.CheckpointError`: no config.json, an unreadable safetensors file, a
missing shard, a tensor of the wrong shape or with NaN or Inf values, an unsupported
model_type, a LoRA rank the model cannot take), a workdir in use or without its record, or a
run none of whose checkpoints restores, in one line. A run whose updates keep being skipped
for a non-finite loss or gradient (`train.max_skipped_updates` in a row) stops with one line
and exit status 1. So does a file of the run that cannot be written (a full disk); what was
written before stays whole and the run resumes once there is space.
"""

import os
import sys

# The repository root, so that config files can import `experiments.configs.base` and the
# library runs from a checkout without installation.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
from ml_collections import config_flags

from bpo_jax import text
from bpo_jax.sandboxes import base as sandbox_base
from bpo_jax.training import config as config_lib
from bpo_jax.training import workdir as workdir_lib
from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment configuration file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
_MODE = flags.DEFINE_enum("mode", "train", list(config_lib.MODES),
                          "train: train (resuming if possible); eval: score the latest "
                          "checkpoint on held-out tasks; export: write the latest checkpoint "
                          "as an HF directory at --export_dir.")
_EXPORT_DIR = flags.DEFINE_string("export_dir", None,
                                  "Where --mode=export writes the HF directory (new or empty).")
_STOP_AFTER = flags.DEFINE_integer("stop_after", None,
                                   "Stop training after this iteration (resumable).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False,
                             "Compile the loop's train step, sampler and reshard for the "
                             "configuration's mesh (`scale.*`) on fake CPU devices and report "
                             "their per-device memory "
                             "instead of training (bpo_jax.training.dry_run).")

_fail = cli.fail


def parse_flags(argv):
  """absl flag parsing that reports a bad config file, override or flag in one line."""
  rest = cli.parse_config_flags(argv, _CONFIG, example="experiments/configs/quickstart.py")
  if not _WORKDIR.value and not _DRY_RUN.value:
    _fail("--workdir is required")
  if _MODE.value == "export" and not _EXPORT_DIR.value:
    _fail("--mode=export needs --export_dir")
  return rest


def _refuse_unwired_scale_settings(config):
  """Settings of the `scale` section that the dry run uses but the training loop does not yet
  (it does read scale.mesh, num_devices, param_dtype, master_weights, remat, scan_layers and
  distributed); a mesh the run's devices cannot form is refused by the loop, naming the key."""
  scale = config.scale
  if scale.model_preset and not config.model.checkpoint:  # with one: a check of its shape
    _fail(f"scale.model_preset = {scale.model_preset!r}: training a preset needs its pretrained "
          "checkpoint and tokenizer (--config.model.checkpoint=DIR); without one, use --dry_run "
          "to check the pod layout")


def _dry_run(config):
  from bpo_jax.training import dry_run  # pylint: disable=g-import-not-at-top
  try:
    dry_run.run_from_config(config)
  except dry_run.DoesNotFitError as error:
    print(f"dry run failed: {error}", file=sys.stderr)
    sys.exit(1)
  except _input_errors() as error:  # e.g. no target chip, a checkpoint of another shape
    _fail(_first_line(error))


def _evaluate(loop, config, workdir: str, primary: bool):
  result = loop.evaluate(config, workdir)
  if primary:
    print(f"held-out success {result['success_rate']:.3f} "
          f"[{result['success_low']:.3f}, {result['success_high']:.3f}] "
          f"({result['successes']}/{result['num_tasks']} tasks, "
          f"{result['confidence']:.0%} Wilson interval), checkpoint of iteration "
          f"{result['iteration']}")


def _input_errors() -> tuple[type, ...]:
  """Errors that mean bad input (a configuration, checkpoint or tokenizer the run cannot use)."""
  from bpo_jax.models import params  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import checkpoint  # pylint: disable=g-import-not-at-top
  return (config_lib.ConfigError, params.CheckpointError, text.TokenizerError,
          sandbox_base.TaskInputError, workdir_lib.WorkdirError,
          checkpoint.UnrestorableCheckpointError)


def _first_line(error: Exception) -> str:
  if isinstance(error, config_lib.ConfigError):
    return str(error)
  return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _export(loop, config, workdir: str, primary: bool):
  path = loop.export(config, workdir, _EXPORT_DIR.value)
  if primary:
    print(f"exported the latest checkpoint of {workdir} to {path}")


def _train(loop, config, workdir: str, primary: bool):
  summary = loop.train(config, workdir, stop_after=_STOP_AFTER.value,
                       keys_set=workdir_lib.flag_keys(sys.argv))
  if not primary:
    return
  labels = {"init": "untrained model", "start": "after the warm start (iteration 0)",
            "end": f"after iteration {summary['iterations']}"}
  if summary.get("eval_start", {}).get("stage") != "warm_start":
    labels.pop("start")  # no warm start: the untrained model's evaluation is the start
  for name, label in labels.items():
    if f"eval_{name}" in summary:
      e = summary[f"eval_{name}"]
      print(f"held-out success, {label}: {e['success_rate']:.3f} "
            f"[{e['success_low']:.3f}, {e['success_high']:.3f}] over {e['num_tasks']} tasks")


def main(argv):
  cli.refuse_arguments(argv)
  config, workdir, mode = _CONFIG.value, _WORKDIR.value, _MODE.value
  try:
    if _DRY_RUN.value:  # writes nothing, and checks a pod's sizes rather than this host's
      config_lib.validate(config, "train", host_memory=False)
    else:  # the run's record decides what the flags leave out
      config = workdir_lib.apply_record(config, workdir, workdir_lib.flag_keys(sys.argv))
      config_lib.validate(config, mode, workdir)
  except (config_lib.ConfigError, workdir_lib.WorkdirError) as error:
    _fail(str(error))
  if _DRY_RUN.value:
    _dry_run(config)
    return
  _refuse_unwired_scale_settings(config)
  # A workdir another run holds is refused before JAX loads (by process 0, the lock's taker).
  busy = workdir_lib.in_use(workdir) if config.scale.distributed.process_id == 0 else None
  if busy:
    _fail(busy)
  # Before anything computes with JAX: connects the processes of a multi-process run.
  from bpo_jax.training import distributed  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings  # pylint: disable=g-import-not-at-top
  distributed.initialize_from_settings(settings.from_config(config).scale.distributed)
  # Orbax reports every save step at INFO; keep the console to the run's own progress.
  logging.get_absl_handler().addFilter(lambda record: "orbax" not in record.pathname)
  # The loop pulls in JAX, Flax and Orbax: imported only once the configuration is known good.
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import iteration  # pylint: disable=g-import-not-at-top
  run = {"eval": _evaluate, "export": _export, "train": _train}[mode]
  try:
    run(loop, config, workdir, distributed.is_primary())
  except _input_errors() as error:  # e.g. a workdir of another experiment, a bad checkpoint
    _fail(_first_line(error))
  except iteration.NonFiniteUpdates as error:  # the run diverged: not bad input, a failed run
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  except workdir_lib.WriteError as error:  # e.g. a full disk: what was written stays whole
    print(f"error: {error.strerror}", file=sys.stderr)
    sys.exit(1)
  except sandbox_base.EnvironmentFailure as error:  # e.g. tests that cannot start on this host
    print(f"error: the {config.env.name} environment cannot run here: {_first_line(error)}",
          file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
