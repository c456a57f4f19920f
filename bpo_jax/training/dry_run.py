"""Dry run of a pod layout: compile the train and decode steps abstractly and check memory.

`dry_run(...)` builds the model with `nnx.eval_shape` (no weights allocated), derives every
sharding from `bpo_jax.sharding`, lowers and compiles

  * the train step (`update.make_train_step`: micro-batched gradient accumulation and one
    optimizer step, the state donated), on a `[batch_rows, row_length]` packed batch, and
  * one decode step of the sampler (`sampling.append_tokens` with one token per row: the body
    of `sampling.generate`'s loop) on a `[decode_batch, cache_length]` KV cache, parameters in
    the sampling layout (`SAMPLING_RULES`),

for the configured mesh with `jax.ShapeDtypeStruct` inputs carrying their shardings, and reads
`compiled.memory_analysis()`, which describes one device's share of the SPMD program:

    per-device bytes = arguments + outputs + temporaries - aliased (donated inputs reused as
                       outputs are counted once)

While sampling, the training state (parameters in the training layout and optimizer state)
stays on the device, so the decode step's figure is reported with it added. Each figure is
compared with the chip's HBM (`CHIPS`); a program that does not fit raises `DoesNotFitError`
naming the program, the figures and the chip.

On a machine without the pod, the mesh is built from fake CPU devices: the CPU compiler's buffer
assignment stands in for the accelerator's. Fusion and scheduling differ, so the figures are
estimates, not byte counts; for bfloat16 models they err on the safe side, because the CPU
compiler computes bfloat16 matmuls and scatters in float32 on converted copies of their operands
(e.g. a float32 copy of each layer's KV cache in the decode step), which an accelerator does not
need. The number of CPU devices must be set before JAX starts; the command line entry does that:

    python -m bpo_jax.training.dry_run --config=experiments/configs/pod_qwen2_5_7b_v5p64.py

(`experiments/run.py --dry_run` does the same.) From Python, in a process whose JAX already
has enough devices:

    report = dry_run(ModelConfig.qwen2_5_7b(), MeshConfig(fsdp=8, tensor=4),
                     UpdateConfig(num_micro_batches=8), batch_rows=64, row_length=2048,
                     decode_batch=256, cache_length=2048, chip="v5p")
    print(report.format())
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Sequence

from bpo_jax.training.chips import CHIPS, GIB, Chip, get_chip  # noqa: F401  (re-exported)


def format_bytes(n: int) -> str:
  """Bytes in the largest binary unit that keeps the figure >= 1: `format_bytes(3 << 20)` is
  "3.00 MiB"."""
  for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if abs(n) >= size:
      return f"{n / size:.2f} {unit}"
  return f"{n} B"


class DoesNotFitError(ValueError):
  """A compiled program needs more memory per device than the chip has."""

  def __init__(self, message: str, report: "DryRunReport"):
    super().__init__(message)
    self.report = report


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
  """Per-device memory of one compiled program, from `compiled.memory_analysis()`."""

  name: str
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  resident_bytes: int = 0  # other live buffers while it runs (the training state, for decode)
  compile_seconds: float = 0.0

  @property
  def program_bytes(self) -> int:
    return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

  @property
  def total_bytes(self) -> int:
    return self.program_bytes + self.resident_bytes

  @classmethod
  def from_compiled(cls, name: str, compiled, resident_bytes: int = 0,
                    compile_seconds: float = 0.0) -> "ProgramMemory":
    stats = compiled.memory_analysis()
    if stats is None:
      raise RuntimeError(f"the backend gives no memory analysis for the {name} program")
    return cls(name=name, argument_bytes=int(stats.argument_size_in_bytes),
               output_bytes=int(stats.output_size_in_bytes),
               temp_bytes=int(stats.temp_size_in_bytes),
               alias_bytes=int(stats.alias_size_in_bytes), resident_bytes=resident_bytes,
               compile_seconds=compile_seconds)

  def format(self) -> str:
    f = format_bytes
    resident = (f" + resident training state {f(self.resident_bytes)}" if self.resident_bytes
                else "")
    return (f"{self.name:12s} {f(self.total_bytes):>11s}  (arguments {f(self.argument_bytes)} + "
            f"outputs {f(self.output_bytes)} + temporaries {f(self.temp_bytes)} - aliased "
            f"{f(self.alias_bytes)}{resident}; compiled in {self.compile_seconds:.1f} s)")


@dataclasses.dataclass(frozen=True)
class DryRunReport:
  """What a dry run compiled and how much memory each program needs per device."""

  model: str
  num_params: int
  mesh_shape: dict
  chip: Chip
  programs: tuple[ProgramMemory, ...]
  shapes: dict
  backend: str

  @property
  def fits(self) -> bool:
    return all(p.total_bytes <= self.chip.hbm_bytes for p in self.programs)

  def program(self, name: str) -> ProgramMemory:
    for p in self.programs:
      if p.name == name:
        return p
    raise KeyError(name)

  def format(self) -> str:
    devices = 1
    for size in self.mesh_shape.values():
      devices *= size
    lines = [
        f"model {self.model}: {self.num_params / 1e9:.2f}B parameters",
        f"mesh {self.mesh_shape} ({devices} devices, compiled on {self.backend}); target "
        f"{self.chip.name} with {format_bytes(self.chip.hbm_bytes)} per device",
        "shapes " + ", ".join(f"{k}={v}" for k, v in self.shapes.items()),
        "per-device memory:",
    ]
    for p in self.programs:
      verdict = "fits" if p.total_bytes <= self.chip.hbm_bytes else "DOES NOT FIT"
      lines.append(f"  {p.format()}  {100 * p.total_bytes / self.chip.hbm_bytes:.0f}% of HBM, "
                   f"{verdict}")
    return "\n".join(lines)


def _with_shardings(tree, shardings):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def _bytes_per_device(tree) -> int:
  """Bytes one device holds of an abstract sharded tree (the largest shard of each leaf)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape)
    total += int(np.prod(shard, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
  return total


def _batch_axes_size(mesh, rules) -> int:
  axes = rules["batch"]
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  size = 1
  for a in axes:
    size *= mesh.shape[a]
  return size


def _check_shapes(batch_rows, row_length, decode_batch, cache_length, num_micro_batches,
                  batch_axes: int):
  problems = []
  for name, value in (("batch_rows", batch_rows), ("row_length", row_length),
                      ("decode_batch", decode_batch), ("cache_length", cache_length)):
    if not isinstance(value, int) or value <= 0:
      problems.append(f"{name} must be a positive int, got {value!r}")
  if problems:
    raise ValueError("; ".join(problems))
  if batch_rows % (num_micro_batches * batch_axes):
    problems.append(f"batch_rows = {batch_rows} must be a multiple of num_micro_batches "
                    f"({num_micro_batches}) x the batch-sharded mesh axes ({batch_axes}) = "
                    f"{num_micro_batches * batch_axes}, so that every micro-batch spreads evenly")
  if decode_batch % batch_axes:
    problems.append(f"decode_batch = {decode_batch} must be a multiple of the batch-sharded "
                    f"mesh axes ({batch_axes})")
  if problems:
    raise ValueError("; ".join(problems))


def dry_run(model_config, mesh_config, update_config, batch_rows: int, row_length: int,
            decode_batch: int, cache_length: int, chip: str | Chip, *,
            optimizer_config=None, float32_master_weights: bool = True,
            devices: Sequence[Any] | None = None, check_fit: bool = True) -> DryRunReport:
  """Compiles the train and decode steps for the mesh; per-device memory against the chip.

  Args:
    model_config: `models.ModelConfig` (its `param_dtype` is the stored parameters' dtype; its
      `remat` and `scan_layers` choose the layer loop).
    mesh_config: `sharding.MeshConfig`; it must use exactly the given (or all) devices.
    update_config: `update.UpdateConfig` (micro-batches, loss settings).
    batch_rows: packed rows per update (one tree per row).
    row_length: tokens per packed row (the largest sequence bucket: memory's worst case).
    decode_batch: rows the sampler decodes at once.
    cache_length: KV cache slots per row.
    chip: a name from `CHIPS` or a `Chip`.
    optimizer_config: `update.OptimizerConfig` (AdamW defaults when None).
    float32_master_weights: with non-float32 parameters, keep a float32 master copy and float32
      moments in the optimizer state (`precision.with_float32_master_weights`).
    devices: the devices of the mesh (default: all).
    check_fit: raise `DoesNotFitError` when a program needs more than the chip's HBM.

  Returns:
    A `DryRunReport` (`.format()` prints it).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top

  chip = get_chip(chip)
  mesh = sharding.make_mesh(mesh_config, devices)
  _check_shapes(batch_rows, row_length, decode_batch, cache_length,
                update_config.num_micro_batches, _batch_axes_size(mesh, sharding.TRAINING_RULES))
  graphdef, params, tx, state, state_sh = _abstract_train_state(
      model_config, mesh, optimizer_config, float32_master_weights)
  train_memory = _train_step_memory(graphdef, tx, update_config, state, state_sh, mesh,
                                    batch_rows, row_length)
  decode_memory = _decode_step_memory(graphdef, params, model_config, mesh, decode_batch,
                                      cache_length, resident_bytes=_bytes_per_device(state))
  report = DryRunReport(
      model=f"{model_config.architecture} {model_config.num_layers} layers, hidden "
            f"{model_config.hidden_size}, params {model_config.param_dtype}, compute "
            f"{model_config.dtype}",
      num_params=model_config.num_params(), mesh_shape=dict(mesh.shape), chip=chip,
      programs=(train_memory, decode_memory),
      shapes=dict(batch_rows=batch_rows, row_length=row_length,
                  micro_batches=update_config.num_micro_batches, decode_batch=decode_batch,
                  cache_length=cache_length),
      backend=jax.devices()[0].platform)
  if check_fit and not report.fits:
    raise _does_not_fit(report)
  return report


def _abstract_train_state(model_config, mesh, optimizer_config, float32_master_weights: bool):
  """The model built shape-first, its optimiser, and the abstract train state laid out by the
  training rules: (graphdef, params, tx, state, state shardings)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top
  from bpo_jax.models.decoder import Decoder  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import precision  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import update  # pylint: disable=g-import-not-at-top

  model = nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0)))
  graphdef, params = nnx.split(model)
  tx = update.make_optimizer(optimizer_config or update.OptimizerConfig())
  if float32_master_weights and model_config.param_dtype != "float32":
    tx = precision.with_float32_master_weights(tx)
  opt_state = jax.eval_shape(tx.init, params)
  param_sh = sharding.param_shardings(params, mesh)
  replicated = NamedSharding(mesh, PartitionSpec())
  state_sh = update.TrainState(
      step=replicated, params=param_sh,
      opt_state=sharding.optimizer_shardings(opt_state, params, param_sh, mesh))
  state = _with_shardings(update.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32),
                                            params=params, opt_state=opt_state), state_sh)
  return graphdef, params, tx, state, state_sh


def _train_step_memory(graphdef, tx, update_config, state, state_sh, mesh, batch_rows: int,
                       row_length: int) -> ProgramMemory:
  """The train step compiled on a `[batch_rows, row_length]` packed batch, training layout."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from bpo_jax import packing  # pylint: disable=g-import-not-at-top
  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import update  # pylint: disable=g-import-not-at-top

  batch_sh = sharding.batch_sharding(mesh)
  dtypes = dict(tokens=jnp.int32, positions=jnp.int32, predecessor=jnp.int32,
                segment_start=jnp.int32, segment_end=jnp.int32, loss_mask=jnp.bool_,
                advantage=jnp.float32, weight=jnp.float32, old_logprob=jnp.float32)
  batch = packing.PackedBatch(**{
      name: jax.ShapeDtypeStruct((batch_rows, row_length), dtype, sharding=batch_sh)
      for name, dtype in dtypes.items()})
  train_step = update.make_train_step(graphdef, tx, update_config, state_sharding=state_sh,
                                      batch_sharding=batch_sh)
  start = time.perf_counter()
  compiled = train_step.jitted.lower(state, batch, None, None, None).compile()
  return ProgramMemory.from_compiled("train step", compiled,
                                     compile_seconds=time.perf_counter() - start)


def _decode_step_memory(graphdef, params, model_config, mesh, decode_batch: int,
                        cache_length: int, resident_bytes: int) -> ProgramMemory:
  """One decode step compiled on a `[decode_batch, cache_length]` KV cache, parameters in the
  sampling layout, with `resident_bytes` (the training state) counted alongside."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top

  from bpo_jax import sampling  # pylint: disable=g-import-not-at-top
  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top

  sample_param_sh = sharding.param_shardings(params, mesh, sharding.SAMPLING_RULES)
  decode_state = jax.eval_shape(
      lambda: sampling.init_decode_state(model_config, decode_batch, cache_length))
  decode_sh = sharding.cache_shardings(decode_state, mesh)
  rows_sh = decode_sh.cache.lengths
  token_sh = NamedSharding(mesh, PartitionSpec(*rows_sh.spec, None))
  decode_step = jax.jit(sampling.append_tokens, static_argnums=(0,), donate_argnums=(2,),
                        out_shardings=decode_sh)
  start = time.perf_counter()
  compiled = decode_step.lower(
      graphdef, _with_shardings(params, sample_param_sh),
      _with_shardings(decode_state, decode_sh),
      jax.ShapeDtypeStruct((decode_batch, 1), jnp.int32, sharding=token_sh),
      jax.ShapeDtypeStruct((decode_batch,), jnp.int32, sharding=rows_sh)).compile()
  return ProgramMemory.from_compiled("decode step", compiled, resident_bytes=resident_bytes,
                                     compile_seconds=time.perf_counter() - start)


def _does_not_fit(report: DryRunReport) -> DoesNotFitError:
  """The error naming each program over the chip's HBM, its figures, and what to change."""
  chip = report.chip
  over = [p for p in report.programs if p.total_bytes > chip.hbm_bytes]
  f = format_bytes
  reasons = "; ".join(
      f"the {p.name} needs {f(p.total_bytes)} per device (arguments {f(p.argument_bytes)}, "
      f"outputs {f(p.output_bytes)}, temporaries {f(p.temp_bytes)}, aliased "
      f"{f(p.alias_bytes)}" + (f", resident training state {f(p.resident_bytes)}"
                               if p.resident_bytes else "") + ")" for p in over)
  return DoesNotFitError(
      f"does not fit on {chip.name} ({f(chip.hbm_bytes)} per device) with mesh "
      f"{report.mesh_shape}: {reasons}. Shard more (a larger fsdp or tensor axis), remat the "
      f"layers, use more micro-batches or shorter rows.\n{report.format()}", report)


# ----------------------------------------------------------------------------- from a config


def shapes_from_config(config) -> dict:
  """The dry run's shapes from an experiment configuration (`training/config.py`).

  One packed tree per row: `batch_rows` = tasks per iteration x trees per task, padded up to a
  multiple of micro-batches x batch-sharded devices, and `row_length` = the per-tree token
  budget. The sampler decodes every live branch at once: `decode_batch` = rows x max leaves
  (a baseline: x its episodes per group) unless `scale.decode_batch` is set, with `model.max_length` cache slots per row.
  """
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import estimator_registry  # pylint: disable=g-import-not-at-top
  r = config.rollout
  rows = r.tasks_per_iteration * r.trees_per_task
  # A baseline's group decodes its N episodes at once, a BPO tree at most its leaves.
  branches = (config_lib.group_episodes(config)
              if estimator_registry.get(r.estimator).topology == "group" else r.max_leaves)
  return dict(batch_rows=rows, row_length=r.max_tree_tokens,
              decode_batch=config.scale.decode_batch or rows * branches,
              cache_length=config.model.max_length)


def dry_run_from_config(config, devices=None, check_fit: bool = True) -> DryRunReport:
  """`dry_run` for an experiment configuration; the mesh spans `devices` (default: all).

  The model, update, optimiser and mesh are the ones the training loop builds
  (`training/translate.py`), the model from `scale.model_preset`.
  """
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top
  config_lib.validate(config)
  s = config.scale
  if not s.chip:
    raise ValueError(f"scale.chip: the dry run needs a target chip, one of "
                     f"{', '.join(sorted(CHIPS))}")
  update_config = translate.update_config(config)
  if update_config.kl_coef > 0:
    raise NotImplementedError("the dry run does not compile the KL-to-reference step yet (it "
                              "needs a second, frozen parameter copy); set train.kl_coef = 0")
  return dry_run(translate.preset_model_config(config), translate.mesh_config(config),
                 update_config, chip=s.chip, optimizer_config=translate.optimizer_config(config),
                 float32_master_weights=s.master_weights, devices=devices, check_fit=check_fit,
                 **shapes_from_config(config))


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
  s = config.scale
  devices = s.num_devices
  if not devices:
    sizes = [s.mesh.data * s.mesh.dcn_data, s.mesh.fsdp, s.mesh.tensor]
    if -1 in sizes:
      raise ValueError("scale.num_devices: the dry run fakes the pod's devices; set it (the "
                       f"mesh {dict(s.mesh)} leaves the count open)")
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
