"""A training run in a process of its own that counts its XLA backend compiles.

    python -m tests.training.compile_worker SPEC_JSON

SPEC_JSON: {"workdir", "cache_dir" ("none" for no persistent cache), "estimator",
"iterations", "checkpoint" (an HF directory, or "" for the world's tiny model), "lora_rank",
"eval_every", optionally "startup_compile" (`scale.startup_compile`), "max_length",
"kv_page_size" and "mesh" ({"fsdp", "tensor"}: the run on a mesh of that many fake CPU
devices)}. Prints one JSON line: the compile counts (`compile_cache.CompileCounter`) at the
start of every iteration and at the end of the run ("at_iteration" [{"requests",
"cache_hits", "compiles"}, ...], "at_end"), so the compiles of iteration i and the evaluation
after it are the difference of consecutive entries.
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def tiny_config(spec: dict):
  from experiments.configs import base  # pylint: disable=g-import-not-at-top
  config = base.tiny(base.rooms(spec["estimator"]), iterations=spec["iterations"])
  config.log.tensorboard = False
  config.eval.every = spec.get("eval_every", 0)
  config.eval.num_tasks = 2
  config.scale.compile_cache_dir = spec["cache_dir"]
  config.scale.startup_compile = spec.get("startup_compile", "auto")
  if spec.get("max_length"):
    config.model.max_length = spec["max_length"]
  config.model.kv_page_size = spec.get("kv_page_size", 0)
  if spec.get("mesh"):  # {"fsdp": f, "tensor": t}: a mesh of f x t devices
    config.scale.num_devices = spec["mesh"]["fsdp"] * spec["mesh"]["tensor"]
    config.scale.mesh.fsdp, config.scale.mesh.tensor = spec["mesh"]["fsdp"], spec["mesh"]["tensor"]
  if spec.get("checkpoint"):
    config.model.checkpoint = spec["checkpoint"]
    config.model.max_length = 640  # the chat template takes more tokens per path
    config.warm_start.num_trajectories = 0
  if spec.get("lora_rank"):
    config.model.lora_rank = spec["lora_rank"]
    config.model.lora_alpha = float(2 * spec["lora_rank"])
  return config


def main(spec: dict) -> dict:
  from bpo_jax.training import compile_cache  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import iteration as iteration_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  counter = compile_cache.CompileCounter()
  at_iteration = []
  run_iteration = iteration_lib.run_iteration

  def counted(*args, **kwargs):
    at_iteration.append(counter.snapshot())
    return run_iteration(*args, **kwargs)

  iteration_lib.run_iteration = counted
  loop.train(tiny_config(spec), spec["workdir"])
  return {"at_iteration": at_iteration, "at_end": counter.snapshot(),
          "log": counter.log}


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  SPEC = json.loads(sys.argv[1])
  if SPEC.get("mesh"):  # before JAX starts
    os.environ["JAX_NUM_CPU_DEVICES"] = str(SPEC["mesh"]["fsdp"] * SPEC["mesh"]["tensor"])
  print(json.dumps(main(SPEC)))
