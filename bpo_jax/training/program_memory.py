"""The loop's programs compiled on abstract inputs, and their memory per device against a chip.

The library of the pod dry run (docs/DESIGN.md §2; the command line is `dry_run.py`).
`measure(settings, chip)` builds the model with `nnx.eval_shape` (no weights allocated) and
lowers and compiles, for the configured mesh, the functions a training run executes, built by
the builders the run uses:

  * "train step": the update of `loop.make_update` (the optimiser of `translate.rl_optimizer`,
    the placement of `placement.Placement`, `update.make_train_step` with
    `translate.update_config(settings)`), the state donated, on the packed batch of the largest
    row bucket (`translate.row_buckets`) with the loop's padded row count;
  * "sample": the `generate` of the sampler a `rollout.RolloutEngine` builds from
    `translate.rollout_config(settings)`, with its sampling parameters, on `decode_batch` rows
    (padded to the engine's batch bucket) of `model.max_length` cache slots, attending to the
    whole cache, parameters in the sampling layout (`SAMPLING_RULES`) and the KV cache laid out
    by `cache_shardings`;
  * "reshard": the parameters moved from the training to the sampling layout as one program
    (`sharding.make_reshard`, the jitted form of `sharding.reshard`, which
    `Placement.for_sampling` runs every iteration).

With several hosts the loop runs "sample" on each host's own chips (`sharding.process_submesh`)
with its share of the rows: per chip the same parameter shards and, up to the padding of the
batch bucket, the same rows as the global program compiled here. All three are compiled with
`jax.ShapeDtypeStruct` inputs carrying their shardings; the dry run reads
`compiled.memory_analysis()`, which describes one device's share of the SPMD program:

    per-device bytes = arguments + outputs + temporaries + generated code - aliased
                       (donated inputs reused as outputs are counted once)

While sampling or resharding, the training state (parameters in the training layout and the
optimizer state, and the KL term's reference) stays on the device, so those figures are
reported with it added. Each figure is compared with the chip's HBM (`DryRunReport.fits`);
`does_not_fit` is the error naming each program over it, its figures and the chip.

The model is `scale.model_preset`'s, or, with `model.checkpoint`, the one its config.json
describes (the preset then a check of its shape, as in training). The sampler's stop tokens
come from the run's tokenizer; the dry run stands in one stop id (the count changes one
constant of the program).

On a machine without the pod, the mesh is built from fake CPU devices (`dry_run.py`): the CPU
compiler's buffer assignment stands in for the accelerator's. Fusion and scheduling differ, so
the figures are estimates, not byte counts; for bfloat16 models they err on the safe side,
because the CPU compiler computes bfloat16 matmuls and scatters in float32 on converted copies
of their operands (e.g. a float32 copy of each layer's KV cache in the decode loop), which an
accelerator does not need.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from bpo_jax.training.chips import GIB, Chip


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
  code_bytes: int = 0  # the compiled program itself
  resident_bytes: int = 0  # other live buffers while it runs (the training state, sampling)
  compile_seconds: float = 0.0

  @property
  def program_bytes(self) -> int:
    return (self.argument_bytes + self.output_bytes + self.temp_bytes + self.code_bytes
            - self.alias_bytes)

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
               alias_bytes=int(stats.alias_size_in_bytes),
               code_bytes=int(stats.generated_code_size_in_bytes), resident_bytes=resident_bytes,
               compile_seconds=compile_seconds)

  def format(self) -> str:
    f = format_bytes
    resident = (f" + resident {f(self.resident_bytes)}" if self.resident_bytes else "")
    return (f"{self.name:12s} {f(self.total_bytes):>11s}  (arguments {f(self.argument_bytes)} + "
            f"outputs {f(self.output_bytes)} + temporaries {f(self.temp_bytes)} + code "
            f"{f(self.code_bytes)} - aliased {f(self.alias_bytes)}{resident}; compiled in "
            f"{self.compile_seconds:.1f} s)")


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


def _bytes_per_device(tree) -> int:
  """Bytes one device holds of an abstract tree (the largest shard of each leaf; a leaf
  without a sharding whole)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  total = 0
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, "sharding", None)
    shard = leaf.shape if sharding is None else sharding.shard_shape(leaf.shape)
    total += int(np.prod(shard, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
  return total


def _compiled(name: str, lowered, resident_bytes: int = 0) -> ProgramMemory:
  start = time.perf_counter()
  compiled = lowered.compile()
  return ProgramMemory.from_compiled(name, compiled, resident_bytes=resident_bytes,
                                     compile_seconds=time.perf_counter() - start)


class StopTokens:
  """The chat format's one field a `RolloutEngine` reads when it is built: its stop ids (one
  stands in for the tokenizer's; see the module docstring)."""

  stop_token_ids = (0,)


@dataclasses.dataclass(frozen=True)
class Programs:
  """The loop's programs lowered for a configuration (`lower_programs`), not yet compiled."""

  lowered: dict            # name -> jax.stages.Lowered
  resident_bytes: dict     # name -> bytes of other live buffers per device while it runs
  model_config: Any
  mesh_shape: dict
  shapes: dict


def model_config_for(settings):
  """The `ModelConfig` a run of `settings` trains: `model.checkpoint`'s config.json (with the
  overrides the run loads it with), checked against `scale.model_preset`; else the preset."""
  from bpo_jax.models import params as params_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import experiment  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top
  if not settings.model.checkpoint:
    return translate.preset_model_config(settings)
  loaded = params_lib.checkpoint_config(settings.model.checkpoint,
                                        **translate.checkpoint_overrides(settings))
  experiment.check_preset(settings, loaded)
  return loaded


def abstract_model(settings, model_config=None):
  """(graphdef, parameters as `jax.ShapeDtypeStruct`s) of the model a run of `settings` trains
  (`model_config_for`), built with `nnx.eval_shape`: no weights are made."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from bpo_jax.models.decoder import Decoder  # pylint: disable=g-import-not-at-top
  model_config = model_config or model_config_for(settings)
  return nnx.split(nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0))))


def lower_programs(settings) -> Programs:
  """The train step, sampler and reshard of a run of `settings`, lowered on abstract inputs
  over the run's devices (`placement.run_devices`); see the module docstring."""
  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import placement as placement_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top

  model_config = model_config_for(settings)
  graphdef, params = abstract_model(settings, model_config)
  setup = loop.make_update(settings, graphdef, params)
  placement = setup.placement
  state = placement.abstract(setup.local_state)
  ref = state.params if settings.train.kl_coef > 0 else None
  mesh = placement.mesh or sharding.make_mesh(translate.mesh_config(settings),
                                              placement_lib.run_devices(settings))
  shapes = shapes_from_config(settings)
  rows = placement_lib.row_count(shapes["batch_rows"],
                                 settings.train.micro_batches * placement.row_shards)
  batch = abstract_batch(rows, shapes["row_length"], placement.row_sharding)
  train_step = getattr(setup.train_step, "jitted", setup.train_step)
  sample_sh = sharding.param_shardings(params, mesh, sharding.SAMPLING_RULES)
  state_bytes = _bytes_per_device(state) + (_bytes_per_device(ref) if ref is not None else 0)
  # Samplers decode the model with its adapters merged (`Experiment.sampling_params`).
  plain_graphdef, plain_params = abstract_model(settings, model_config.without_lora())
  plain_params = sharding.with_shardings(plain_params, sharding.param_shardings(
      plain_params, mesh, sharding.SAMPLING_RULES))
  sample, decode_batch = _lower_sample(settings, plain_graphdef, model_config, mesh,
                                       plain_params)
  lowered = {
      "train step": train_step.lower(state, batch, ref, None, None),
      "sample": sample,
      "reshard": sharding.make_reshard(sample_sh).lower(state.params)}
  # The KL term's reference is an argument of the train step and resident beside the others.
  resident = {"train step": 0, "sample": state_bytes,
              "reshard": state_bytes - _bytes_per_device(state.params)}
  return Programs(lowered=lowered, resident_bytes=resident, model_config=model_config,
                  mesh_shape=dict(mesh.shape),
                  shapes=dict(batch_rows=rows, row_length=shapes["row_length"],
                              micro_batches=settings.train.micro_batches,
                              decode_batch=decode_batch, cache_length=shapes["cache_length"]))


def abstract_batch(rows: int, row_length: int, row_sharding):
  """`packing.abstract_batch`: a `[rows, row_length]` PackedBatch of abstract arrays."""
  from bpo_jax import packing  # pylint: disable=g-import-not-at-top
  return packing.abstract_batch(rows, row_length, row_sharding)


def _lower_sample(settings, graphdef, model_config, mesh, params):
  """The engine's `generate` lowered on the largest decode batch: (Lowered, padded rows)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bpo_jax import rollout as rollout_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax import sampling  # pylint: disable=g-import-not-at-top
  from bpo_jax import sharding  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top

  engine = rollout_lib.RolloutEngine(graphdef, model_config, StopTokens(), None,
                                     translate.rollout_config(settings))
  rows = engine.config.batch_size(shapes_from_config(settings)["decode_batch"])
  rows_axes = _batch_axes_size(mesh, sharding.SAMPLING_RULES)
  if rows % rows_axes:
    raise ValueError(f"the sampler's batch of {rows} rows does not split over the "
                     f"{rows_axes} devices of the batch axes; set scale.decode_batch to a "
                     f"multiple of {rows_axes}")
  # The dense cache's program (a paged cache lives on one device, not on a mesh).
  decode_state = jax.eval_shape(lambda: sampling.init_decode_state(
      engine.sampler.config, rows, engine.sampler.max_length))
  decode_sh = sharding.cache_shardings(decode_state, mesh)
  rows_sh = decode_sh.cache.lengths
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), rows))
  lowered = engine.sampler.lower_generate(
      params, sharding.with_shardings(decode_state, decode_sh),
      jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=rows_sh), engine.sampling_params,
      jax.ShapeDtypeStruct((rows,), jnp.bool_, sharding=rows_sh))
  return lowered, rows


def _batch_axes_size(mesh, rules) -> int:
  axes = rules["batch"]
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  size = 1
  for a in axes:
    size *= mesh.shape[a]
  return size


def measure(settings, chip: Chip) -> DryRunReport:
  """Compiles the loop's programs for `settings` (`lower_programs`) over the run's devices and
  reports their per-device memory against `chip` (`DryRunReport.fits` says whether they fit)."""
  import jax  # pylint: disable=g-import-not-at-top
  programs = lower_programs(settings)
  memory = tuple(_compiled(name, lowered, programs.resident_bytes[name])
                 for name, lowered in programs.lowered.items())
  m = programs.model_config
  return DryRunReport(
      model=f"{m.architecture} {m.num_layers} layers, hidden {m.hidden_size}, params "
            f"{m.param_dtype}, compute {m.dtype}",
      num_params=m.num_params(), mesh_shape=programs.mesh_shape, chip=chip, programs=memory,
      shapes=programs.shapes, backend=jax.devices()[0].platform)


def does_not_fit(report: DryRunReport) -> DoesNotFitError:
  """The error naming each program over the chip's HBM, its figures, and what to change."""
  chip = report.chip
  over = [p for p in report.programs if p.total_bytes > chip.hbm_bytes]
  f = format_bytes
  reasons = "; ".join(
      f"the {p.name} needs {f(p.total_bytes)} per device (arguments {f(p.argument_bytes)}, "
      f"outputs {f(p.output_bytes)}, temporaries {f(p.temp_bytes)}, code {f(p.code_bytes)}, "
      f"aliased {f(p.alias_bytes)}" + (f", resident {f(p.resident_bytes)}"
                                       if p.resident_bytes else "") + ")" for p in over)
  return DoesNotFitError(
      f"does not fit on {chip.name} ({f(chip.hbm_bytes)} per device) with mesh "
      f"{report.mesh_shape}: {reasons}. Shard more (a larger fsdp or tensor axis), remat the "
      f"layers, use more micro-batches or shorter rows.\n{report.format()}", report)


def shapes_from_config(settings) -> dict:
  """The dry run's shapes from a run's settings (`training/settings.py`).

  One packed tree per row: `batch_rows` = tasks per iteration x trees per task (the loop pads
  them to a multiple of micro-batches x batch-sharded devices), and `row_length` = the longest
  row bucket the update meets (`translate.row_buckets`: the one holding a whole tree of
  `rollout.max_tree_tokens`, or a warm-start path of `model.max_length`). The
  sampler decodes every live branch at once: `decode_batch` = rows x max leaves (a baseline:
  x its episodes per group) unless `scale.decode_batch` is set (the engine pads it to a batch
  bucket), with `model.max_length` cache slots per row.
  """
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import estimator_registry  # pylint: disable=g-import-not-at-top
  from bpo_jax import packing  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top
  r = settings.rollout
  rows = r.tasks_per_iteration * r.trees_per_task
  # A baseline's group decodes its N episodes at once, a BPO tree at most its leaves.
  branches = (config_lib.group_episodes(settings)
              if estimator_registry.get(r.estimator).topology == "group" else r.max_leaves)
  longest = max(r.max_tree_tokens, settings.model.max_length)
  return dict(batch_rows=rows,
              row_length=packing.choose_bucket(longest, translate.row_buckets(settings)),
              decode_batch=settings.scale.decode_batch or rows * branches,
              cache_length=settings.model.max_length)
