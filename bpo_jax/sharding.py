"""Meshes and partitioning rules for the policy, its optimizer state, KV cache and batches.

The mesh has three named axes:

  * "data"   — pure data parallelism (replicated parameters), usually across slices (DCN);
  * "fsdp"   — data parallelism with parameters and optimizer state sharded (ZeRO-3 style);
  * "tensor" — tensor (Megatron) parallelism over heads, MLP width and vocabulary.

Every array dimension has a *logical* name ("batch", "embed", "heads", ...); `rules` map logical
names to mesh axes. A parameter's logical axes come from its name in the model
(`PARAM_LOGICAL_AXES`), so the rules, not the model code, decide the layout:

    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    param_sh = param_shardings(params, mesh)           # NamedSharding per parameter
    opt_sh = optimizer_shardings(opt_state, params, param_sh, mesh)
    batch_sh = batch_sharding(mesh)                     # rows over ("data", "fsdp")

A dimension that the mesh axes do not divide is replicated instead (`logical_to_spec` says which
in `explain`), so e.g. 4 KV heads on an 8-way tensor axis still compile.

Sampling and training can use different layouts (decode wants tensor parallelism and a batch
spread over "data" and "fsdp" with parameters gathered; the update wants FSDP): `reshard` moves a
pytree between them with one `jax.device_put`, `make_reshard` as one compiled program. With
several processes each decodes its own rows on its own devices (`process_submesh`): in the
sampling layout the parameters are split over "tensor" alone, so every process's devices hold
them whole when each tensor group lies within one process.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
import numpy as np

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axes of each parameter, keyed by the parameter's own name (the last name in its path).
PARAM_LOGICAL_AXES: Mapping[str, tuple[str | None, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "q_kernel": ("embed", "heads", "head_dim"),
    "k_kernel": ("embed", "kv_heads", "head_dim"),
    "v_kernel": ("embed", "kv_heads", "head_dim"),
    "o_kernel": ("heads", "head_dim", "embed"),
    "q_bias": ("heads", "head_dim"),
    "k_bias": ("kv_heads", "head_dim"),
    "v_bias": ("kv_heads", "head_dim"),
    "gate_kernel": ("embed", "mlp"),
    "up_kernel": ("embed", "mlp"),
    "down_kernel": ("mlp", "embed"),
    "weight": ("norm",),
    # LoRA adapters (`models.lora`): A takes its kernel's input axes, B its output axes; the
    # rank axis (None) is replicated.
    "q_lora_a": ("embed", None), "q_lora_b": (None, "heads", "head_dim"),
    "k_lora_a": ("embed", None), "k_lora_b": (None, "kv_heads", "head_dim"),
    "v_lora_a": ("embed", None), "v_lora_b": (None, "kv_heads", "head_dim"),
    "o_lora_a": ("heads", "head_dim", None), "o_lora_b": (None, "embed"),
    "gate_lora_a": ("embed", None), "gate_lora_b": (None, "mlp"),
    "up_lora_a": ("embed", None), "up_lora_b": (None, "mlp"),
    "down_lora_a": ("mlp", None), "down_lora_b": (None, "embed"),
}

# Logical name -> mesh axes (a tuple shards over several axes; None replicates).
TRAINING_RULES: Mapping[str, Any] = {
    "batch": ("data", "fsdp"),
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "cache_length": None,
}
# Decoding: parameters gathered over "fsdp" (every step reads all weights; gathering them each
# token would dominate), heads and MLP still split over "tensor".
SAMPLING_RULES: Mapping[str, Any] = {**TRAINING_RULES, "embed": None}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh axis sizes. One size may be -1: it takes the devices left over.

  `dcn_data` > 1 builds a multi-slice mesh: the "data" axis spans `dcn_data` slices over the
  data-centre network and the other axes stay inside a slice (ICI).
  """

  data: int = 1
  fsdp: int = -1
  tensor: int = 1
  dcn_data: int = 1

  def resolve(self, num_devices: int) -> tuple[int, int, int]:
    sizes = [self.data * self.dcn_data, self.fsdp, self.tensor]
    names = ("data", "fsdp", "tensor")
    if sum(s == -1 for s in sizes) > 1:
      raise ValueError(f"at most one mesh axis may be -1, got data={self.data}, "
                       f"fsdp={self.fsdp}, tensor={self.tensor}")
    for name, s in zip(names, sizes):
      if s == 0 or s < -1:
        raise ValueError(f"mesh axis {name} must be positive or -1, got {s}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % known:
        raise ValueError(f"{num_devices} devices do not divide by the fixed axes "
                         f"({dict(zip(names, sizes))})")
      sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
      raise ValueError(f"mesh {dict(zip(names, sizes))} needs {math.prod(sizes)} devices, "
                       f"have {num_devices}")
    return tuple(sizes)


def make_mesh(config: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None
              ) -> Mesh:
  """A ("data", "fsdp", "tensor") mesh with Auto axis types (sharding by propagation)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = config.resolve(len(devices))
  axis_types = (AxisType.Auto,) * 3
  if config.dcn_data > 1:
    if all(hasattr(d, "slice_index") for d in devices):
      from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
      ici = (config.data, shape[1], shape[2])
      dcn = (config.dcn_data, 1, 1)
      grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices,
                                                  allow_split_physical_axes=True)
    else:
      # No slice topology (CPU devices, e.g. a dry run): consecutive blocks of devices stand in
      # for the slices, in the same layout: "data" = slice-major (slice, data within slice).
      grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES, axis_types=axis_types)
  if devices == list(jax.devices()):
    return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=axis_types)


def process_submesh(mesh: Mesh, process_index: int | None = None) -> Mesh:
  """The devices of `mesh` that one process (default: this one) owns, as a mesh of the same
  axes (`process_grid`): where that process decodes its rows. A mesh of one process is returned
  as it is. Raises ValueError when a tensor group spans processes."""
  process_index = jax.process_index() if process_index is None else process_index
  grid = process_grid(np.asarray(mesh.devices), process_index)
  if grid.size == mesh.size:
    return mesh
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def process_grid(devices: np.ndarray, process_index: int) -> np.ndarray:
  """The devices of a [data, fsdp, tensor] grid that process `process_index` owns, as a
  [1, n / tensor, tensor] grid (the whole grid when they are all its own).

  The devices keep the grid's order and their place on the "tensor" axis, so an array laid out
  by `SAMPLING_RULES` on the grid's mesh (split over "tensor" only) has on each of them the
  shard it has on the sub-mesh: each process's devices hold the parameters whole. Example:
  devices 0..7 of processes 0 0 0 0 1 1 1 1 in a (1, 4, 2) grid give process 1 the grid
  [[[4, 5], [6, 7]]]. Raises ValueError when a tensor group (a row of the last axis) holds
  devices of several processes, or none of the grid's devices is the process's.
  """
  if all(d.process_index == process_index for d in devices.flat):
    return devices
  tensor = devices.shape[-1]
  groups = devices.reshape(-1, tensor)
  owners = [{d.process_index for d in group} for group in groups]
  if any(len(o) > 1 for o in owners):
    raise ValueError(f"the tensor axis ({tensor} devices) spans processes; sampling runs on "
                     "each process's devices, so it must divide them")
  mine = [group for group, o in zip(groups, owners) if o == {process_index}]
  if not mine:
    raise ValueError(f"process {process_index} holds no device of the mesh")
  return np.asarray(mine).reshape(1, len(mine), tensor)


def _axis_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(mesh.shape[a] for a in axes)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Mapping[str, Any] = TRAINING_RULES, explain: list | None = None
                    ) -> PartitionSpec:
  """PartitionSpec for an array with the given logical axes and shape.

  A dimension is replicated when its rule names no axis, when those mesh axes do not divide it,
  or when an earlier dimension already used one of them (each mesh axis shards one dimension).
  Reasons for replication are appended to `explain` when given.
  """
  if len(logical) != len(shape):
    raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
  used: set[str] = set()
  spec = []
  for name, dim in zip(logical, shape):
    if name is not None and name not in rules:
      raise ValueError(f"no sharding rule for logical axis {name!r}; rules: {sorted(rules)}")
    axes = None if name is None else rules[name]
    if axes is not None:
      tup = (axes,) if isinstance(axes, str) else tuple(axes)
      tup = tuple(a for a in tup if mesh.shape.get(a, 1) > 1)
      if any(a not in mesh.shape for a in ((axes,) if isinstance(axes, str) else axes)):
        raise ValueError(f"rule {name!r} -> {axes!r} names an axis not in the mesh "
                         f"{tuple(mesh.shape)}")
      if used.intersection(tup):
        if explain is not None:
          explain.append(f"{name}: mesh axes {tup} already used")
        tup = ()
      elif tup and dim % _axis_size(mesh, tup):
        if explain is not None:
          explain.append(f"{name}: size {dim} not divisible by {_axis_size(mesh, tup)} ({tup})")
        tup = ()
      used.update(tup)
      axes = None if not tup else (tup[0] if len(tup) == 1 else tup)
    spec.append(axes)
  return PartitionSpec(*spec)


def _param_name(path) -> str:
  """The parameter's own name: the last dictionary key in its path (an nnx.State path)."""
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  if not names:
    raise ValueError(f"cannot name the parameter at {jax.tree_util.keystr(path)}")
  return str(names[-1])


def param_logical_axes(path, shape) -> tuple[str, ...]:
  name = _param_name(path)
  if name not in PARAM_LOGICAL_AXES:
    raise ValueError(f"no logical axes for parameter {jax.tree_util.keystr(path)}; add "
                     f"{name!r} to PARAM_LOGICAL_AXES")
  axes = PARAM_LOGICAL_AXES[name]
  if len(axes) != len(shape):
    raise ValueError(f"parameter {jax.tree_util.keystr(path)} has shape {tuple(shape)} but "
                     f"logical axes {axes}")
  return axes


def param_specs(params, mesh: Mesh, rules: Mapping[str, Any] = TRAINING_RULES):
  """PartitionSpec for every parameter (same tree structure as `params`)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: logical_to_spec(param_logical_axes(path, x.shape), x.shape, mesh, rules),
      params)


def param_shardings(params, mesh: Mesh, rules: Mapping[str, Any] = TRAINING_RULES):
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(params, mesh, rules),
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def optimizer_shardings(opt_state, params, param_sh, mesh: Mesh):
  """Shardings for an optax state: any leaf inside a copy of the parameter tree (Adam's moments,
  for instance) takes its parameter's sharding; everything else (step counts) is replicated.

  The match is by path suffix and shape, so it works for any optax chain.
  """
  by_path = {}
  for (path, leaf), sh in zip(jax.tree_util.tree_leaves_with_path(params),
                              jax.tree.leaves(param_sh)):
    by_path[tuple(path)] = (tuple(leaf.shape), sh)
  replicated = NamedSharding(mesh, PartitionSpec())

  def pick(path, leaf):
    path = tuple(path)
    for start in range(len(path)):
      hit = by_path.get(path[start:])
      if hit is not None and hit[0] == tuple(np.shape(leaf)):
        return hit[1]
    return replicated

  return jax.tree_util.tree_map_with_path(pick, opt_state)


def batch_sharding(mesh: Mesh, rules: Mapping[str, Any] = TRAINING_RULES) -> NamedSharding:
  """Rows over the batch axes, tokens replicated: for every [B, L] field of a PackedBatch."""
  axes = rules["batch"]
  axes = tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if mesh.shape[a] > 1)
  return NamedSharding(mesh, PartitionSpec(axes if axes else None, None))


# The decoder's KV cache layout (models/decoder.py): values [B, Hkv, S, D], keys transposed to
# [B, Hkv, D, S].
KV_CACHE_LOGICAL_AXES = ("batch", "kv_heads", "cache_length", "head_dim")
KV_CACHE_KEY_LOGICAL_AXES = ("batch", "kv_heads", "head_dim", "cache_length")


def cache_shardings(cache, mesh: Mesh, rules: Mapping[str, Any] = SAMPLING_RULES):
  """KV cache: values by `KV_CACHE_LOGICAL_AXES`, keys by `KV_CACHE_KEY_LOGICAL_AXES`; per-row
  arrays ([B], [B, V] next-token logits) by batch; anything else replicated."""

  def pick(path, x):
    shape = np.shape(x)
    if len(shape) == 4:
      is_key = any(getattr(entry, "name", None) == "keys" for entry in path)
      logical = KV_CACHE_KEY_LOGICAL_AXES if is_key else KV_CACHE_LOGICAL_AXES
    elif len(shape) >= 1:
      logical = ("batch",) + (None,) * (len(shape) - 1)
    else:
      return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, logical_to_spec(logical, shape, mesh, rules))

  return jax.tree_util.tree_map_with_path(pick, cache)


def with_shardings(tree, shardings):
  """Each leaf of `tree` as a `jax.ShapeDtypeStruct` on its sharding (None: unsharded): the
  abstract inputs a program is lowered on."""
  if shardings is None:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def reshard(tree, shardings):
  """Moves a pytree onto new shardings (e.g. from the training to the sampling layout)."""
  return jax.device_put(tree, shardings)


def make_reshard(shardings):
  """`reshard` onto `shardings` as one jitted program: `make_reshard(sample_sh)(params)` has
  `reshard(params, sample_sh)`'s values and layout, its all-gathers compiled together (the form
  whose memory the dry run reads; `benchmarks/resharding.py` times both)."""
  return jax.jit(lambda tree: tree, out_shardings=shardings)


def describe(params, mesh: Mesh, rules: Mapping[str, Any] = TRAINING_RULES) -> list[str]:
  """One line per parameter kind: its logical axes, spec and replication reasons."""
  lines, seen = [], set()
  for path, x in jax.tree_util.tree_leaves_with_path(params):
    name = _param_name(path)
    if name in seen:
      continue
    seen.add(name)
    why: list[str] = []
    spec = logical_to_spec(param_logical_axes(path, x.shape), x.shape, mesh, rules, why)
    lines.append(f"{name:12s} {tuple(x.shape)!s:24s} {spec}" + (f"  ({'; '.join(why)})" if why
                                                                 else ""))
  return lines
