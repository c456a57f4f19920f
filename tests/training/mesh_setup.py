"""The small quickstart the mesh test (test_mesh_loop.py) trains, its warm-started checkpoint,
and the roundings by which a mesh may differ from one device.

    python tests/training/mesh_setup.py ROOT  # builds ROOT/hf, the warm-started checkpoint

The checkpoint is `small_config`'s warm start on one device, exported as a Hugging Face directory
(`warm_started_checkpoint`); a run from it continues its warm start for a few steps
(`from_checkpoint`) before the iterations.
"""

import fcntl
import os
import subprocess
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bpo_jax.testing import model_rounding  # pylint: disable=g-import-not-at-top
from bpo_jax.training import loop

ITERATIONS = 2


def small_config():
  """The tiny quickstart with a model whose matrices the mesh axes divide (embed 32 over fsdp;
  4 heads, 2 KV heads and an MLP of 1024 over tensor), large enough beside the embedding (whose
  vocabulary, the tokenizer's, is odd, so it is not split over tensor) for the state to shard
  close to 1/(fsdp x tensor), and a warm start (300 steps of 4 episodes) long enough for some
  of the 8 trees of each iteration to succeed (so the update moves the parameters): 3 of 8
  trees at the first iteration on one x86-64 processor, none at 200 steps there (the last
  roundings of the warm start differ between processors)."""
  from experiments.configs import base  # pylint: disable=g-import-not-at-top
  config = base.tiny(base.rooms("bpo"), iterations=ITERATIONS)
  m = config.model
  m.hidden_size, m.intermediate_size, m.num_layers = 32, 1024, 2
  m.num_heads, m.num_kv_heads, m.head_dim = 4, 2, 8
  config.warm_start.steps = 300
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
      # unoptimised (tests/conftest.py), which costs more than it saves over 300 steps.
      done = subprocess.run([sys.executable, os.path.abspath(__file__), root],
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


if __name__ == "__main__":
  _warm_start(sys.argv[1])
