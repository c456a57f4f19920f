"""The computations of experiments/testbed.py for one world, each written to its own file.

A file already there is kept (the caller checked its settings); the BPO run's parameters, which
the variance draws are taken at, are recomputed when only variance.json is missing (the run is a
pure function of its seeds).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax.testbed import learn
from bpo_jax.testbed import worlds
from bpo_jax.training import workdir

TUNE_OFFSET = 1_000_000  # tuning seeds never overlap the reported ones
VARIANCE_FOLD = 1_000_000  # the variance draws' keys: fold_in(key(seed), this + checkpoint)
CHUNK = 64  # seeds per compiled call: every call has this shape, so each program compiles once


def _chunked(fn, first_seed: int, count: int, *per_seed):
  """fn(keys[CHUNK], *arrays[CHUNK]) over seeds first_seed.., padded to whole chunks (the
  padding's results dropped), outputs concatenated along the seed axis."""
  padded = -(-count // CHUNK) * CHUNK
  keys = _keys(first_seed, padded)
  per_seed = [np.concatenate([a, np.repeat(a[-1:], padded - count, 0)]) for a in per_seed]
  outs = [fn(keys[i:i + CHUNK], *(a[i:i + CHUNK] for a in per_seed))
          for i in range(0, padded, CHUNK)]
  return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs)[:count], *outs)


def _keys(first: int, count: int):
  return jax.vmap(jax.random.key)(jnp.arange(first, first + count))


def _write(path: str, record: dict, **payload) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  workdir.write_json(path, dict(record, **payload))
  print(f"wrote {path}", flush=True)


def _train(s, world, name, lr, first_seed, count):
  m = learn.method(name, s["max_env_steps"])
  return _chunked(lambda keys: learn.train_seeds(
      world, m, keys, iterations=s["iterations"], tasks_per_iteration=s["tasks_per_iteration"],
      lr=lr), first_seed, count)


def world_record(s: dict, world: worlds.ChainWorld) -> dict:
  """The world's exact figures at the uniform policy: the prefix's share at each depth, J."""
  return dict(early_weight=world.early_weight,
              prefix_share=[worlds.prefix_share(world, depth=d)
                            for d in range(1, world.horizon)],
              initial_success=float(worlds.expected_success(learn.initial_logits(world), world)))


def tune(s: dict, world) -> dict:
  """Per method: mean success over the curve at each learning rate (tuning seeds), the best."""
  out = {}
  for name in s["methods"]:
    scores = [float(np.asarray(_train(s, world, name, lr, TUNE_OFFSET, s["tune_seeds"])[0]).mean())
              for lr in s["lrs"]]
    out[name] = dict(mean_success=scores, lr=s["lrs"][int(np.argmax(scores))])
  return out


def variance(s: dict, world, bpo_params) -> dict:
  """Per checkpoint and method, per seed: Σ_d ‖g_d − ḡ‖², ‖ḡ‖² and Σ_d ‖g_d − ḡ‖² on the root
  state's row (the first decision's logits) over `draws` gradients at BPO's parameters, for
  tasks drawn from the seed's key (the same for every method)."""
  out = {}
  for c in s["checkpoints"]:
    out[str(c)] = {}
    for name in s["methods"]:
      m = learn.method(name, s["max_env_steps"])
      sq_dev, sq_norm, sq_dev_root = _chunked(lambda keys, theta: learn.gradient_moments(
          world, m, theta, jax.vmap(lambda k: jax.random.fold_in(k, VARIANCE_FOLD + c))(keys),
          draws=s["draws"], tasks_per_iteration=s["tasks_per_iteration"]),
          0, s["seeds"], np.asarray(bpo_params[:, c]))
      out[str(c)][name] = dict(sum_sq_dev=np.asarray(sq_dev, np.float64).tolist(),
                               mean_sq_norm=np.asarray(sq_norm, np.float64).tolist(),
                               sum_sq_dev_root_row=np.asarray(sq_dev_root, np.float64).tolist())
  return out


def run_world(s: dict, weight: float, directory: str, record: dict) -> None:
  world = worlds.ChainWorld(weight, horizon=s["horizon"], num_actions=s["actions"],
                            num_tasks=s["num_tasks"])
  path = lambda name: os.path.join(directory, f"{name}.json")
  if not os.path.exists(path("world")):
    _write(path("world"), record, world=world_record(s, world))
  if not os.path.exists(path("tune")):
    _write(path("tune"), record, tune=tune(s, world))
  lrs = {m: v["lr"] for m, v in workdir_json(path("tune"))["tune"].items()}
  bpo_params = None
  for name in s["methods"]:
    if os.path.exists(path(name)) and (name != "bpo" or os.path.exists(path("variance"))):
      continue
    success, steps, params = _train(s, world, name, lrs[name], 0, s["seeds"])
    if name == "bpo":
      bpo_params = params
    if not os.path.exists(path(name)):
      _write(path(name), record, method=name, lr=lrs[name],
             env_steps_per_task=float(np.asarray(steps).mean()),
             success=np.round(np.asarray(success, np.float64), 6).tolist())
  if not os.path.exists(path("variance")):
    _write(path("variance"), record, variance=variance(s, world, bpo_params))


def workdir_json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)
