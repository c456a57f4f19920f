"""Multi-host runs: start JAX's distributed runtime, split the batch by process, build global
arrays from each process's rows, and bring sharded results back to every host.

On a pod every host runs the same program. `initialize` connects them (process 0 is the
coordinator); afterwards `jax.devices()` lists every chip of the pod and a mesh built from it
spans all hosts. Each process then works on the rows of the batch that its own devices hold:

    initialize_from_settings(settings.scale.distributed)  # before anything uses JAX
    mesh = sharding.make_mesh(MeshConfig(...))
    row_sh = sharding.batch_sharding(mesh)
    rows = process_rows(row_sh, num_rows)            # e.g. range(0, 32) of 64 on process 0
    local = pack the trees of tasks[rows] ...        # this process's sandboxes only
    batch = global_batch(local, row_sh, num_rows)    # one global [num_rows, L] array per field
    state, metrics = train_step(state, batch)        # the same jitted step on every process
    host_metrics = to_host(metrics)

The training loop (`training/loop.py`) splits an iteration's host work the same way: each
process grows the trees of its contiguous share of the tasks (`process_share`) with its own
sandboxes, then `allgather_objects` gives every process every tree, so the estimator, the packing
and the metrics are computed identically everywhere and each process feeds its rows of the
packed batch to the sharded update.

Arrays every process computes identically (a parameter initialisation from a shared seed) are
placed with `put_global`. Orbax checkpoints are written and restored by all processes together
(`training/checkpoint.py`); each writes the shards it owns.

On CPU (tests, and the two-process localhost check) the processes exchange collectives through
Gloo, which `initialize` selects.
"""

from __future__ import annotations

import pickle
from typing import Any, Sequence

import jax
import numpy as np


def initialize(coordinator_address: str, num_processes: int, process_id: int,
               local_device_ids: Sequence[int] | None = None) -> bool:
  """Connects this process to the others; a no-op (returns False) for a single process.

  Call before anything else uses JAX (the device list changes). On CPU, cross-process
  collectives go through Gloo.
  """
  if num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id must be in [0, {num_processes - 1}], got {process_id}")
  if num_processes == 1:
    return False
  host, _, port = coordinator_address.rpartition(":")
  if not host or not port.isdigit():
    raise ValueError(f"coordinator_address must be 'host:port' of process 0, got "
                     f"{coordinator_address!r}")
  # Harmless on accelerators (it only concerns CPU devices); needed for CPU-only runs.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             local_device_ids=local_device_ids)
  return True


def initialize_from_settings(d) -> bool:
  """`initialize` with the `scale.distributed` section of a run's settings
  (`settings.DistributedSettings`)."""
  return initialize(d.coordinator_address, d.num_processes, d.process_id)


def process_share(num_items: int, process_index: int | None = None,
                  process_count: int | None = None) -> range:
  """This process's contiguous share of `num_items` items (tasks to roll out, say).

  The items are split into `process_count` consecutive blocks whose sizes differ by at most
  one, the larger blocks first. Example: 10 items over 4 processes give `range(0, 3)`,
  `range(3, 6)`, `range(6, 8)` and `range(8, 10)`.
  """
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if num_items < 0:
    raise ValueError(f"num_items must be >= 0, got {num_items}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index must be in [0, {process_count - 1}], got {process_index}")
  size, extra = divmod(num_items, process_count)
  start = process_index * size + min(process_index, extra)
  return range(start, start + size + (process_index < extra))


def is_primary() -> bool:
  """Whether this is process 0, the one that writes files meant once per run."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process has reached the barrier `name` (nothing with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def allgather_objects(obj: Any) -> list[Any]:
  """Every process's `obj` (any picklable value), in process order, on every process.

  The pickled bytes travel as a uint8 array: first every process's length is gathered, then
  the bytes padded to the longest. With one process, `[obj]` as it is.
  """
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int32)))
  lengths = lengths.reshape(-1)
  padded = np.zeros((int(lengths.max()),), np.uint8)
  padded[:data.size] = data
  gathered = np.asarray(multihost_utils.process_allgather(padded))
  return [pickle.loads(gathered[i, :lengths[i]].tobytes()) for i in range(len(lengths))]


def local_copy(tree) -> Any:
  """A pytree of multi-host sharded arrays, whole, on this process's default device: what a
  per-process computation (a rollout's decode loop) takes.

  The copies are uncommitted, like the outputs of an unsharded jit, so a jitted function that
  has seen one of them does not trace and compile again for the other.
  """
  return jax.tree.map(jax.numpy.asarray, to_host(tree))


def local_view(tree, shardings):
  """Global arrays that every process holds whole on its own devices (replicated over the mesh
  axes that span processes; `sharding.process_submesh`), as arrays of `shardings` on this
  process's sub-mesh: the same device buffers, no copy and no traffic between processes.

  Each device's shard of a leaf must be the one its new sharding places there (true for the
  sampling layout on `sharding.process_submesh`); `jax` checks the shapes.
  """

  def view(x, sharding):
    by_device = {shard.device: shard.data for shard in x.addressable_shards}
    devices = sharding.addressable_devices
    missing = [d for d in devices if d not in by_device]
    if missing:
      raise ValueError(f"this process holds no shard on {missing} of the sub-mesh")
    return jax.make_array_from_single_device_arrays(
        x.shape, sharding, [by_device[d] for d in sorted(devices, key=lambda d: d.id)])

  return jax.tree.map(view, tree, shardings)


def process_rows(row_sharding, num_rows: int, process_index: int | None = None) -> range:
  """The rows of a `[num_rows, ...]` batch that `process_index`'s devices hold.

  Every device of one process must hold a contiguous block of rows, and together the blocks
  must be contiguous (true for `sharding.batch_sharding` on meshes built from `jax.devices()`,
  whose devices are ordered by process). The process then grows the trees of those rows' tasks.
  """
  process_index = jax.process_index() if process_index is None else process_index
  indices = row_sharding.devices_indices_map((num_rows,))
  rows: set[int] = set()
  for device, index in indices.items():
    if device.process_index == process_index:
      rows.update(range(num_rows)[index[0]])
  if not rows:
    raise ValueError(f"process {process_index} holds no rows of the batch")
  first, last = min(rows), max(rows)
  if len(rows) != last - first + 1:
    raise ValueError(f"process {process_index} holds rows {sorted(rows)}, not a contiguous "
                     "block; order the mesh's devices by process")
  return range(first, last + 1)


def global_batch(local_batch, row_sharding, num_rows: int):
  """One global array per field from each process's rows (`process_rows`) of the batch.

  Args:
    local_batch: a pytree (e.g. `packing.PackedBatch`) of host arrays `[rows here, ...]`.
    row_sharding: the sharding of the global arrays (rows over the batch axes).
    num_rows: the global number of rows.
  """
  rows = process_rows(row_sharding, num_rows)

  def make(x):
    x = np.asarray(x)
    if x.shape[0] != len(rows):
      raise ValueError(f"process {jax.process_index()} holds {len(rows)} rows "
                       f"({rows.start}..{rows.stop - 1}) but its local batch has {x.shape[0]}")
    return jax.make_array_from_process_local_data(row_sharding, x, (num_rows,) + x.shape[1:])

  return jax.tree.map(make, local_batch)


def put_global(tree, shardings):
  """Places a host pytree that every process holds identically onto global shardings."""

  def put(x, sharding):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, tree, shardings)


def to_host(tree) -> Any:
  """Every leaf of a pytree of (possibly multi-host sharded) arrays as a full NumPy array on
  every process."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)),
                      tree)
