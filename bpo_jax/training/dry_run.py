"""The pod dry run's command line: fake the pod's devices on CPU, compile the loop's programs for
a configuration and print their memory per device against its chip (docs/DESIGN.md §2; the
programs and the figures are `program_memory.py`'s).

    python -m bpo_jax.training.dry_run --config=experiments/configs/pod_qwen2_5_7b_v5p64.py

(`experiments/run.py --dry_run` does the same.) The number of CPU devices must be set before
JAX starts, so the command line runs in a fresh process. From Python, in a process whose JAX
already has the configuration's devices: `print(dry_run_from_config(config).format())`.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from bpo_jax.training.chips import CHIPS, Chip, get_chip  # noqa: F401  (re-exported)
# The library's names, re-exported: this module is the dry run's Python API as well.
from bpo_jax.training.program_memory import (  # noqa: F401
    DoesNotFitError, DryRunReport, ProgramMemory, Programs, StopTokens, abstract_batch,
    abstract_model, does_not_fit, format_bytes, lower_programs, measure, model_config_for,
    shapes_from_config)


def dry_run_from_config(config, check_fit: bool = True) -> DryRunReport:
  """Checks what the dry run needs of `config`, then compiles the loop's programs over the run's
  devices (the first `scale.num_devices`, or all) and reports their per-device memory against
  `scale.chip` (`program_memory.measure`); raises `DoesNotFitError` when one needs more than
  the chip's HBM."""
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings as settings_lib  # pylint: disable=g-import-not-at-top
  config_lib.validate(config, host_memory=False)  # a pod's sizes, not this host's
  settings = settings_lib.from_config(config)
  if not settings.scale.chip:
    raise config_lib.ConfigError([f"scale.chip: the dry run needs a target chip, one of "
                                  f"{', '.join(sorted(CHIPS))}"])
  if settings.model.lora_rank:
    raise config_lib.ConfigError(["model.lora_rank: the dry run compiles full fine-tuning; "
                                  "set it to 0"])
  report = measure(settings, get_chip(settings.scale.chip))
  if check_fit and not report.fits:
    raise does_not_fit(report)
  return report


def use_fake_cpu_devices(num_devices: int) -> None:
  """Makes JAX start with `num_devices` CPU devices; call it before anything uses JAX.

  Raises:
    RuntimeError: JAX already started with another number of devices (run the dry run in a
      fresh process, e.g. through this module's command line).
  """
  if num_devices < 1:
    raise ValueError(f"num_devices must be >= 1, got {num_devices}")
  if "jax" not in sys.modules:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["JAX_NUM_CPU_DEVICES"] = str(num_devices)
    return
  import jax  # pylint: disable=g-import-not-at-top
  try:  # JAX imported but not started yet: its device count can still be set.
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    started = xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):
    started = True  # unknown on this JAX version: only check what it has
  if not started:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", num_devices)
  if jax.device_count() != num_devices or jax.devices()[0].platform != "cpu":
    raise RuntimeError(
        f"JAX started with {jax.device_count()} {jax.devices()[0].platform} devices before the "
        f"dry run could ask for {num_devices} CPU devices; run it in a fresh process "
        "(python -m bpo_jax.training.dry_run --config=...)")


def run_from_config(config) -> DryRunReport:
  """The command line's work: fake the pod's devices on CPU, dry-run, print the report."""
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings as settings_lib  # pylint: disable=g-import-not-at-top
  config_lib.validate(config, host_memory=False)
  s = settings_lib.from_config(config).scale
  devices = s.num_devices
  if not devices:
    sizes = [s.mesh.data * s.mesh.dcn_data, s.mesh.fsdp, s.mesh.tensor]
    if -1 in sizes:
      raise config_lib.ConfigError(["scale.num_devices: the dry run fakes the pod's devices; "
                                    f"set it (the mesh {dataclasses.asdict(s.mesh)} leaves the "
                                    "count open)"])
    devices = sizes[0] * sizes[1] * sizes[2]
  use_fake_cpu_devices(devices)
  report = dry_run_from_config(config)
  print(report.format())
  return report


def main(argv):
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  try:
    run_from_config(_CONFIG.value)
  except DoesNotFitError as e:
    print(f"dry run failed: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                            lock_config=True)
  app.run(main)
