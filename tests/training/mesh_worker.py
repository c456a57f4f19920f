"""One process of eight CPU devices trains on several meshes (run by test_mesh_loop.py).

    JAX_NUM_CPU_DEVICES=8 python tests/training/mesh_worker.py WORKDIR OUT.npz CHECKPOINT
    python tests/training/mesh_worker.py --warm-start ROOT  # builds ROOT/hf (CHECKPOINT)

CHECKPOINT is a small quickstart's warm start on one device, exported as a Hugging Face
directory (`warm_started_checkpoint`, which the two-process test starts from too). From it, a
few more warm-start steps run on one device (`from_checkpoint`), and then, from that same
state, two iterations on each mesh of `MESHES` with the loop's own placement and update
(`loop.build_update`, `iteration.run_iteration`). OUT.npz holds, per mesh, the final train
state (gathered to the host), the iterations' metrics records and trees (JSON), and the bytes
of the train state, whole and on the device that holds the most of it.
"""

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import time

if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np

from bpo_jax import rollout as rollout_lib
from bpo_jax.testing import model_rounding
from bpo_jax.training import config as config_lib
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import iteration as iteration_lib
from bpo_jax.training import loop
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib
from bpo_jax.training import warm_start as warm_start_lib
from bpo_jax.training.settings import from_config

# name -> (scale.mesh data, fsdp, tensor; scale.num_devices). "one": the unsharded reference.
# (fsdp 4 x tensor 2 is the two-process test's mesh, over two processes' devices.)
MESHES = {"one": (1, -1, 1, 1), "data2_fsdp2_tensor2": (2, 2, 2, 0)}
ITERATIONS = 2


def small_config():
  """The tiny quickstart with a model whose matrices the mesh axes divide (embed 32 over fsdp;
  4 heads, 2 KV heads and an MLP of 1024 over tensor), large enough beside the embedding (whose
  vocabulary, the tokenizer's, is odd, so it is not split over tensor) for the state to shard
  close to 1/(fsdp x tensor), and a warm start (200 steps of 4 episodes) long enough for some
  of the 8 trees of each iteration to succeed (so the update moves the parameters)."""
  from experiments.configs import base  # pylint: disable=g-import-not-at-top
  config = base.tiny(base.rooms("bpo"), iterations=ITERATIONS)
  m = config.model
  m.hidden_size, m.intermediate_size, m.num_layers = 32, 1024, 2
  m.num_heads, m.num_kv_heads, m.head_dim = 4, 2, 8
  config.warm_start.steps = 200
  config.warm_start.learning_rate = 1e-2
  config.warm_start.num_trajectories = 16
  config.warm_start.batch_size = 4
  config.rollout.tasks_per_iteration = 8
  config.log.tensorboard = False
  return config


def optimised_environment() -> dict:
  """This process's environment for a child on one CPU device with XLA's optimisations on
  (without the tests' `--xla_backend_optimization_level`): for a child that runs many steps."""
  flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                   if not f.startswith("--xla_backend_optimization_level"))
  return {**os.environ, "XLA_FLAGS": flags, "JAX_NUM_CPU_DEVICES": "1"}


def warm_started_checkpoint(root: str) -> str:
  """`small_config`'s warm start on one device (`loop.train` with no iterations), exported as a
  Hugging Face directory `root/hf` that `model.checkpoint` loads. Made once per `root`: the first
  caller builds it under a file lock, later ones (other test processes) wait and reuse it."""
  hf = os.path.join(root, "hf")
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "lock"), "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.isdir(hf):
      # In a process of its own with XLA's optimisations on: the tests' processes compile
      # unoptimised (tests/conftest.py), which costs more than it saves over 200 steps.
      done = subprocess.run([sys.executable, os.path.abspath(__file__), "--warm-start", root],
                            env=optimised_environment(),
                            capture_output=True, text=True, timeout=900, check=False)
      if done.returncode != 0:
        raise RuntimeError(f"the warm start failed:\n{done.stderr[-4000:]}")
  return hf


def _warm_start(root: str):
  config = small_config()
  config.train.iterations = 0
  config.scale.num_devices = 1
  run = os.path.join(root, "run")
  loop.train(config, run)
  loop.export(config, run, os.path.join(root, "hf"))


# The warm start a run from `warm_started_checkpoint` continues with: a few steps at a low
# learning rate (a fresh Adam's first steps move every parameter by about the learning rate),
# which give the policy-gradient steps Adam moments to continue, as in a run of its own.
CONTINUED_WARM_START = {"steps": 8, "learning_rate": 1e-3}
# Elementwise roundings of one clipped AdamW step per parameter: the clipping's scale (square,
# square root, division, product), each moment's decay and increment (3 + 4), the two bias
# corrections, the square root and epsilon of the denominator, the division, the weight decay,
# the learning rate's product and the addition to the parameter.
ADAM_ROUNDINGS = 20


def step_roundings(model_config, row_length: int, positions: int) -> int:
  """Roundings (`testing.tolerance`, in units of the magnitude compared) by which one update
  step may differ between two placements from equal parameters: the loss's forward over rows of
  `row_length` (`model_rounding.forward_roundings`, with the log-probabilities), the backward
  (each reduction transposed: as many again), each gradient element's sum over the batch's
  `positions`, the clipping's global norm over the model's parameters, and `ADAM_ROUNDINGS`."""
  forward = model_rounding.forward_roundings(model_config, attended_slots=row_length,
                                             logprobs=True)
  return (2 * forward + model_rounding.sum_roundings(positions)
          + model_rounding.sum_roundings(model_config.num_params()) + ADAM_ROUNDINGS)


def update_roundings(model_config, records) -> int:
  """Roundings by which the iterations of `records` may differ between two placements: each
  iteration's `step_roundings` at its row length and distinct tokens, added up (an iteration
  starts from the parameters the one before left, already that far apart). The fork threshold
  and the states' entropies (forwards of those parameters) are within the same count."""
  return sum(step_roundings(model_config, r["row_length"], r["unique_tokens"]) for r in records)


def from_checkpoint(config, checkpoint: str):
  """`config` starting from `checkpoint` (its shape from the checkpoint's config.json) and
  continuing its warm start for `CONTINUED_WARM_START`."""
  config.model.checkpoint = checkpoint
  config.warm_start.update(CONTINUED_WARM_START)
  return config


def tree_record(batch) -> list:
  """What decides the trees: their parents, rewards, validity and distinct tokens."""
  trees = batch.stacked_trees()
  return [np.asarray(x).tolist() for x in (trees.parent, trees.reward, trees.valid)] + [
      [r.tokens.num_unique_tokens() for r in batch.rollouts]]


def warm_started(exp, params, tx) -> update_lib.TrainState:
  """The train state after the warm start, as `loop` builds it (Adam moments continued)."""
  params, sft_opt_state, _ = warm_start_lib.warm_start(exp, params)
  opt_state = tx.init(params)
  if jax.tree.structure(sft_opt_state) == jax.tree.structure(opt_state):
    opt_state = sft_opt_state
  return update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)


def with_mesh(config, data: int, fsdp: int, tensor: int, num_devices: int):
  config = config.copy_and_resolve_references()
  config.scale.mesh.data, config.scale.mesh.fsdp, config.scale.mesh.tensor = data, fsdp, tensor
  config.scale.num_devices = num_devices
  return config


def main(workdir: str, out_path: str, checkpoint: str):
  clock = time.perf_counter()
  config = from_checkpoint(small_config(), checkpoint)
  config_lib.validate(config, "train", workdir)
  exp, state = experiment_lib.build_experiment(from_config(config), workdir)
  engine = rollout_lib.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt, exp.pool,
                                     translate.rollout_config(from_config(config)))
  out = {}
  try:
    start = warm_started(exp, state.params, translate.rl_optimizer(from_config(config)))
    start = jax.tree.map(np.asarray, start)
    print(f"warm start done at {time.perf_counter() - clock:.1f} s", file=sys.stderr)
    out.update({f"start/leaf{j}": leaf for j, leaf in enumerate(jax.tree.leaves(start))})
    for name, sizes in MESHES.items():
      mesh_exp = dataclasses.replace(exp, settings=from_config(with_mesh(config, *sizes)))
      setup = loop.build_update(mesh_exp, start.params)
      state = setup.placement.place(start)
      threshold = iteration_lib.initial_fork_threshold(from_config(config))
      records, trees = [], []
      for i in range(1, ITERATIONS + 1):
        state, record, batch, threshold = iteration_lib.run_iteration(
            mesh_exp, engine, setup.train_step, state, i, jax.random.key(config.seed),
            threshold, setup.placement)
        records.append({k: v for k, v in record.items() if not k.startswith("time/")})
        trees.append(tree_record(batch))
      for j, leaf in enumerate(jax.tree.leaves(setup.placement.host(state))):
        out[f"{name}/leaf{j}"] = np.asarray(leaf)
      print(f"{name} done at {time.perf_counter() - clock:.1f} s", file=sys.stderr)
      out[f"{name}/records"] = np.asarray(json.dumps(records))
      out[f"{name}/trees"] = np.asarray(json.dumps(trees))
      out[f"{name}/roundings"] = np.asarray(update_roundings(exp.model_config, records))
      out[f"{name}/mesh"] = np.asarray(json.dumps(
          None if setup.placement.mesh is None else dict(setup.placement.mesh.shape)))
  finally:
    exp.close()
  np.savez(out_path, **out)


if __name__ == "__main__":
  if sys.argv[1] == "--warm-start":
    _warm_start(sys.argv[2])
  else:
    main(sys.argv[1], sys.argv[2], sys.argv[3])
