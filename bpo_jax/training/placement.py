"""Where the train state lives and how the update's batch is fed (one process or several).

One rule for any number of processes: the run's devices (every device of every process, or the
first `scale.num_devices` of one process) form the `scale.mesh` mesh (data x fsdp x tensor),
the train state is laid out on it by the partition rules of `bpo_jax.sharding`, and the rows of
the packed batch are split over its batch axes, each process feeding the rows its devices hold.
A mesh of one device is the unsharded case: the state is committed to this process's first
device (`on_first_device`), as every compiled update returns it, so each program sees one
placement of its inputs from the first call on.

Rollouts and evaluations sample on the same devices (`Placement.for_sampling`): once per
iteration the parameters are moved from the training layout to the sampling layout
(`sharding.SAMPLING_RULES`: gathered over "fsdp", split over "tensor") by one compiled program,
device to device, and each process decodes its rows on its own devices
(`sharding.process_submesh`), which then hold the parameters whole.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import packing
from bpo_jax import sharding
from bpo_jax.training import config as config_lib
from bpo_jax.training import distributed
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib


def row_count(num_rows: int, multiple: int) -> int:
  """Rows padded up to a multiple of `multiple` (the micro-batches, times the devices the rows
  are split over)."""
  return -(-num_rows // multiple) * multiple


def abstract_on_first_device(state):
  """Shape and dtype of each leaf, on this process's first device: a checkpoint written by
  several processes (another topology) then restores here too."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)


def on_first_device(tree):
  """`tree`'s arrays committed to this process's first device (no copy for arrays already
  there).

  A jitted program's cache tells committed arrays from uncommitted ones (those made by
  `jnp.asarray`, `jnp.zeros`, optax's step counts): the same program called on both compiles
  twice. An executable of the start-up set (`precompiled.ProgramSet`) returns committed arrays
  whatever it was given, and a jitted one returns them as soon as one input is committed; so
  the unsharded train state is committed, every leaf, from its start, and the update's output
  matches its input.
  """
  return jax.device_put(tree, jax.local_devices()[0])


def run_devices(settings) -> list:
  """The devices a run trains on: all of them, or the first `scale.num_devices` of a single
  process. Raises `config_lib.ConfigError` naming the key when the configured mesh does not fit
  them, or when a paged KV cache (one device only) would decode on several."""
  available = jax.device_count()
  wanted = settings.scale.num_devices or available
  if wanted > available:
    raise config_lib.ConfigError([f"scale.num_devices = {wanted}: this run has {available} "
                                  "device(s)"])
  if jax.process_count() > 1 and wanted != available:
    raise config_lib.ConfigError([
        f"scale.num_devices = {wanted}: several processes train on all {available} devices "
        "(set 0)"])
  devices = jax.devices()[:wanted]
  try:
    translate.mesh_config(settings).resolve(len(devices))
  except ValueError as error:
    raise config_lib.ConfigError([f"scale.mesh: {error}"]) from None
  if settings.model.kv_page_size and len(devices) > 1:
    raise config_lib.ConfigError([
        f"model.kv_page_size = {settings.model.kv_page_size}: a paged KV cache decodes on one "
        f"device, this run's mesh has {len(devices)} (set scale.num_devices=1, or 0 for the "
        "dense cache)"])
  return devices


def state_bytes(state) -> tuple[int, int]:
  """(bytes of the whole state, the most bytes any one device of this process holds of it)."""
  whole, per_device = 0, {}
  for leaf in jax.tree.leaves(state):
    whole += leaf.size * leaf.dtype.itemsize
    shards = getattr(leaf, "addressable_shards", None)
    if shards is None:  # a host array: it would sit whole on one device
      per_device[None] = per_device.get(None, 0) + leaf.nbytes
      continue
    for shard in shards:
      per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
  return int(whole), int(max(per_device.values(), default=0))


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where the train state lives and how the update's batch is fed.

  A mesh of several devices (one process or many): the `scale.mesh` mesh over the run's
  devices (`run_devices`), the state laid out by the sharding rules (`state_sharding`), and each
  process feeding its rows of the packed batch (`row_sharding`). One device of one process:
  nothing is sharded (`mesh` None); the state is committed to the first device and the packed
  batch goes in whole.
  """

  mesh: Any = None
  state_sharding: Any = None
  row_sharding: Any = None
  # By the parameters' tree structure: the compiled move to the sampling layout on the whole
  # mesh, and that layout on this process's sub-mesh (None when the sub-mesh is the mesh).
  _to_sampling: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @classmethod
  def create(cls, settings, state) -> "Placement":
    """The placement for this run's processes; `state` gives the train state's structure."""
    devices = run_devices(settings)
    if len(devices) == 1 and jax.process_count() == 1:
      return cls()
    mesh = sharding.make_mesh(translate.mesh_config(settings), devices)
    try:
      sharding.process_submesh(mesh)  # each process samples on its own devices
    except ValueError as error:
      raise config_lib.ConfigError([f"scale.mesh.tensor = {settings.scale.mesh.tensor}: "
                                    f"{error}"]) from None
    placement = cls(mesh=mesh, row_sharding=sharding.batch_sharding(mesh))
    return dataclasses.replace(placement, state_sharding=placement.shardings_of(state))

  def shardings_of(self, state):
    """The layout of a train state of `state`'s structure (any optimiser's state: the warm
    start's or the update's) by the partition rules; None unsharded."""
    if self.mesh is None:
      return None
    param_sh = (self.state_sharding.params if self.state_sharding is not None
                else sharding.param_shardings(state.params, self.mesh))
    return update_lib.TrainState(
        step=jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec()),
        params=param_sh,
        opt_state=sharding.optimizer_shardings(state.opt_state, state.params, param_sh,
                                               self.mesh))

  def init_state(self, tx, params):
    """A step-0 train state of `params` (laid out by this placement; sharded, their buffers are
    donated) and `tx`'s fresh optimiser state, made on the devices that hold it."""

    def init(p):
      return update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p))

    if self.mesh is None:
      return on_first_device(init(params))
    out = self.shardings_of(jax.eval_shape(init, params))
    return jax.jit(init, out_shardings=out, donate_argnums=(0,))(params)

  @property
  def row_shards(self) -> int:
    """Devices the rows of a batch are split over (1 unsharded)."""
    if self.row_sharding is None:
      return 1
    axes = self.row_sharding.spec[0] if len(self.row_sharding.spec) else None
    axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    return int(np.prod([self.mesh.shape[a] for a in axes]))

  def place(self, state):
    """A train state every process holds alike (host or local arrays), laid out globally."""
    if self.mesh is None:
      return on_first_device(state)
    return distributed.put_global(jax.tree.map(np.asarray, state), self.state_sharding)

  def place_params(self, params):
    """Parameters every process holds alike, laid out as the train state's (unsharded:
    committed to the first device, `on_first_device`)."""
    if self.mesh is None:
      return on_first_device(params)
    return distributed.put_global(jax.tree.map(np.asarray, params), self.state_sharding.params)

  def place_frozen(self, frozen):
    """A LoRA run's frozen base (every process builds it alike from its source) laid out by the
    partition rules like trainable parameters, so the update and the warm start read it from
    the devices that hold its shards instead of taking a whole copy on every device at every
    step; None (no frozen base) and the unsharded case are returned as they are."""
    if self.mesh is None or frozen is None:
      return frozen
    return distributed.put_global(jax.tree.map(np.asarray, frozen),
                                  sharding.param_shardings(frozen, self.mesh))

  def abstract(self, state):
    """Shape, dtype (and, sharded, the layout) of each leaf: what a checkpoint restores into."""
    if self.mesh is None:
      return abstract_on_first_device(state)
    return sharding.with_shardings(state, self.state_sharding)

  def local(self, tree):
    """The arrays whole on this process's first device (a restored checkpoint's, for export)."""
    return tree if self.mesh is None else distributed.local_copy(tree)

  @property
  def sample_mesh(self):
    """Where this process samples: its devices of the mesh (`sharding.process_submesh`);
    None unsharded."""
    return None if self.mesh is None else sharding.process_submesh(self.mesh)

  def for_sampling(self, params):
    """The policy's parameters (all of them: a LoRA run's adapters merged into the base,
    `Experiment.sampling_params`) in the sampling layout on this process's devices, for
    rollouts and evaluations.

    Laid out on the mesh, they are moved to `sharding.SAMPLING_RULES` on the whole mesh by one
    compiled program (`sharding.make_reshard`, the dry run's "reshard"), device to device, and
    with several processes seen as arrays of this process's sub-mesh (`distributed.local_view`:
    the same buffers). Unsharded they are returned as they are.
    """
    if self.mesh is None:
      return params
    structure = jax.tree.structure(params)
    if structure not in self._to_sampling:
      shardings = sharding.param_shardings(params, self.mesh, sharding.SAMPLING_RULES)
      sub_mesh = self.sample_mesh
      local = (None if sub_mesh is self.mesh
               else sharding.param_shardings(params, sub_mesh, sharding.SAMPLING_RULES))
      self._to_sampling[structure] = (sharding.make_reshard(shardings), local)
    move, local = self._to_sampling[structure]
    moved = move(params)
    return moved if local is None else distributed.local_view(moved, local)

  def abstract_for_sampling(self, params):
    """Abstract parameters (`jax.eval_shape` of `Experiment.sampling_params`) laid out as
    `for_sampling` lays them out: `sharding.SAMPLING_RULES` on this process's devices; as they
    are unsharded."""
    if self.mesh is None:
      return params
    return sharding.with_shardings(
        params, sharding.param_shardings(params, self.sample_mesh, sharding.SAMPLING_RULES))

  def feed(self, packed: packing.PackedBatch):
    """The update's batch: the packed global batch whole, or this process's rows of it."""
    if self.mesh is None:  # a transfer: `jnp.asarray` would compile a program per row length
      return jax.device_put(packed)
    num_rows = packed.tokens.shape[0]
    rows = distributed.process_rows(self.row_sharding, num_rows)
    local = jax.tree.map(lambda x: np.asarray(x)[rows.start:rows.stop], packed)
    return distributed.global_batch(local, self.row_sharding, num_rows)

  def host(self, tree):
    """Every leaf (a scalar metric, say) as a NumPy value on every process."""
    return distributed.to_host(tree) if self.mesh is not None else jax.tree.map(np.asarray,
                                                                                  tree)

