"""One process of the multi-process training check (run by test_distributed.py).

    python tests/training/distributed_worker.py PROCESS_ID NUM_PROCESSES PORT WORKDIR OUT.npz

Every process builds the same tiny decoder from a shared seed, takes the rows of each batch that
its devices hold, trains three sharded steps on global arrays, writes and restores an Orbax
checkpoint together with the other processes, and saves the gathered parameters to OUT.npz.
`train_and_checkpoint` is also what the test runs in one process for the reference.
"""

import os
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from flax import nnx  # pylint: disable=g-import-not-at-top
import jax
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np
import optax

from bpo_jax import packing
from bpo_jax import sharding
from bpo_jax.models import Decoder, ModelConfig
from bpo_jax.training import checkpoint
from bpo_jax.training import distributed
from bpo_jax.training import update

CONFIG = ModelConfig.tiny(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=4, num_kv_heads=2, head_dim=8)
ROWS = 8
STEPS = 3


def _batch(rng):
  trees, advantages, weights = [], [], []
  for _ in range(ROWS):
    trees.append(packing.TreeTokens(
        prompt=rng.integers(0, 64, 5), parent=[-1, -1, 0, 0],
        action_tokens=[rng.integers(0, 64, 3) for _ in range(4)],
        action_logprobs=[np.full(3, -4.0) for _ in range(4)],
        observation_tokens=[rng.integers(0, 64, 2) for _ in range(4)]))
    advantages.append(rng.normal(size=4))
    weights.append(np.array([0.5, 0.5, 0.25, 0.25]))
  return packing.pack_trees(trees, advantages, weights, buckets=(32,))


def train_and_checkpoint(devices, workdir: str) -> dict:
  """Trains STEPS sharded steps on a (1, 2, 2) mesh of `devices`; returns host arrays."""
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, tensor=2), devices)
  # SGD with momentum: the parameters are linear in the gradients, so float reassociation across
  # processes stays at rounding level (Adam would magnify it in near-zero gradient entries).
  tx = optax.sgd(0.1, momentum=0.9)
  graphdef, state = update.create_train_state(Decoder(CONFIG, rngs=nnx.Rngs(1)), tx)
  param_sh = sharding.param_shardings(state.params, mesh)
  state_sh = update.TrainState(
      step=NamedSharding(mesh, PartitionSpec()), params=param_sh,
      opt_state=sharding.optimizer_shardings(state.opt_state, state.params, param_sh, mesh))
  state = distributed.put_global(state, state_sh)
  row_sh = sharding.batch_sharding(mesh)
  step = update.make_train_step(graphdef, tx, update.UpdateConfig(num_micro_batches=2),
                                state_sharding=state_sh, batch_sharding=row_sh)
  rows = distributed.process_rows(row_sh, ROWS)
  rng = np.random.default_rng(0)
  losses = []
  for _ in range(STEPS):
    full = _batch(rng)  # every process draws the same batch and keeps its own rows
    local = jax.tree.map(lambda x: x[rows.start:rows.stop], full)
    state, metrics = step(state, distributed.global_batch(local, row_sh, ROWS))
    losses.append(float(distributed.to_host(metrics["loss"])))
  checkpointer = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"))
  checkpointer.save(STEPS, state, {"iteration": STEPS})
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state)
  restored, loop = checkpointer.restore(STEPS, abstract)
  checkpointer.close()
  host = distributed.to_host(state)
  restored_host = distributed.to_host(restored)
  restored_equal = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(host),
                                                            jax.tree.leaves(restored_host)))
  layouts_kept = all(r.sharding.is_equivalent_to(s.sharding, r.ndim)
                     for r, s in zip(jax.tree.leaves(restored), jax.tree.leaves(state)))
  params = {jax.tree_util.keystr(path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(host.params)}
  return dict(params=params, losses=np.asarray(losses), rows=np.asarray([rows.start, rows.stop]),
              restored_equal=restored_equal and loop["iteration"] == STEPS,
              layouts_kept=layouts_kept)


def main(argv):
  process_id, num_processes, port, workdir, out = argv[1:]
  distributed.initialize(f"localhost:{port}", int(num_processes), int(process_id))
  result = train_and_checkpoint(jax.devices(), workdir)
  np.savez(out, losses=result["losses"], rows=result["rows"],
           restored_equal=result["restored_equal"], layouts_kept=result["layouts_kept"],
           process_count=jax.process_count(), device_count=jax.device_count(),
           **{"param" + name: value for name, value in result["params"].items()})


if __name__ == "__main__":
  main(sys.argv)
