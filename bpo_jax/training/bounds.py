"""Upper bounds on a configuration's sizes: what the model and this host's memory can hold.

`config.validate` calls `check` before any compute, so that a size no run could hold is one
line naming its key and its bound rather than an allocation that fails (or swaps) minutes in.
Each memory bound compares a *floor* of what the run allocates, counted from the configuration
alone, with the host's memory (`host_memory_bytes`: physical memory, or the cgroup's limit
where that is lower). A configuration over a bound cannot run here; one under it may still not
fit (`experiments/run.py --dry_run` reports the compiled programs' memory per device).

  KV cache (model.max_length). The first prefill of an iteration allocates a cache of R rows x
    max_length slots, each slot 2 (keys and values) x layers x KV heads x head_dim values of
    model.dtype: bytes = R · max_length · 2 · L · Hkv · D · itemsize. R is the process's trees
    (tasks_per_iteration x trees_per_task over the processes) or held-out tasks (eval.num_tasks
    over the processes), at least 8, the smallest batch the engine pads to. With
    model.checkpoint the shape is its config.json's. The bound is the host's memory even where
    the cache lives on an accelerator (JAX is not started before validation): there it refuses
    what no host of a comparable size holds, and the dry run gives the device's figure.
    max_length is also below 2^31: positions and cache lengths are int32.
  Tasks (env.num_train_tasks, env.num_eval_tasks). Both splits are made whole at the start and
    held for the run; each task takes at least a pointer in its list (8 bytes), its entry in the
    permutation `experiment.task_order` draws for every position (an int64) and an object with
    its task_id string (`sys.getsizeof(object())` + `sys.getsizeof("")`): `TASK_BYTES_FLOOR`.
    Environments whose tasks are distinct seeds of a fixed range (rooms and the toy-text gym
    worlds: `SEEDS_PER_SPLIT`) cannot make more tasks than the range holds; their task maker
    draws until it has them all, so a larger split would never complete.
  Trees (rollout.max_leaves x env.max_turns). Every tree of an iteration is held as a
    `RolloutTree` of `capacity` nodes (max_leaves · max_turns, a group's episodes · max_turns),
    8 arrays of 23 bytes per node in all.
  Weights (the from-scratch decoder's shape keys). At least the layers' parameters, without the
    embedding (the vocabulary is not known before the tokenizer is trained): per layer
    h·H·D (q) + 2·h·Hkv·D (k, v) + H·D·h (o) + 3·h·I (MLP) + 2·h (norms), of scale.param_dtype.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

# The least memory one task takes while a run holds it (see the module docstring).
TASK_BYTES_FLOOR = 8 + 8 + sys.getsizeof(object()) + sys.getsizeof("")
# Bytes per node of a `RolloutTree`: int32 parent, state_id and depth, float32 reward and
# entropy, bool terminal, truncated and valid.
TREE_NODE_BYTES = 3 * 4 + 2 * 4 + 3 * 1
# The smallest batch of rows the rollout engine pads a prefill to (`RolloutConfig.batch_buckets`).
MIN_DECODE_ROWS = 8
# Positions and cache lengths are int32.
MAX_LENGTH_LIMIT = 2**31 - 1
_ITEMSIZE = {"float32": 4, "bfloat16": 2}
# Environments whose tasks are distinct seeds of a fixed range, and the module stating it.
_SEEDED = {"rooms": "bpo_jax.sandboxes.rooms",
           **{name: "bpo_jax.sandboxes.gym_text"
              for name in ("frozenlake", "taxi", "cliffwalking", "blackjack")}}


def host_memory_bytes() -> int | None:
  """This host's memory in bytes: physical memory (`os.sysconf`), or the cgroup v2 limit of
  this process's group where that is lower; None where the platform says neither."""
  try:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError):
    total = None
  total = total if total and total > 0 else None
  try:
    with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
      limit = f.read().strip()
  except OSError:
    limit = "max"
  if limit.isdigit() and int(limit) > 0:
    total = int(limit) if total is None else min(total, int(limit))
  return total


def _size(n: float) -> str:
  """Bytes in words: 1536 -> '1.5 KiB'."""
  for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
    if n < 1024 or unit == "PiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  return f"{n} B"


def kv_shape(config) -> tuple[int, int, int] | None:
  """(layers, KV heads, head_dim) of the run's model: model.checkpoint's config.json when set
  (None if it cannot be read: the loader names that problem), else the model keys."""
  m = config.model
  if not m.checkpoint:
    return m.num_layers, m.num_kv_heads, m.head_dim
  try:
    with open(os.path.join(m.checkpoint, "config.json"), encoding="utf-8") as f:
      hf = json.load(f)
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    return int(hf["num_hidden_layers"]), int(hf.get("num_key_value_heads") or heads), head_dim
  except (OSError, ValueError, TypeError, KeyError, ZeroDivisionError, AttributeError):
    return None


def decode_rows(config) -> int:
  """The rows of one process's first prefill (training or evaluation), at least
  `MIN_DECODE_ROWS`.

  Example: 16 tasks x 1 tree, eval.num_tasks 64, one process -> 64.
  """
  processes = config.scale.distributed.num_processes
  r = config.rollout
  trees = -(-r.tasks_per_iteration * r.trees_per_task // processes)
  held_out = -(-config.eval.num_tasks // processes)
  return max(MIN_DECODE_ROWS, trees, held_out)


def kv_slot_bytes(layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
  """Bytes of one cache slot of one row: 2 (keys, values) x layers x KV heads x head_dim values.

  Example: 3 layers, 2 KV heads, head_dim 32, float32 -> 2·3·2·32·4 = 1536.
  """
  return 2 * layers * kv_heads * head_dim * _ITEMSIZE[dtype]


def _check_kv_cache(config, memory: int | None, problems: list[str]) -> None:
  max_length = config.model.max_length
  if max_length > MAX_LENGTH_LIMIT:
    problems.append(f"model.max_length = {max_length}: must be <= {MAX_LENGTH_LIMIT} "
                    "(positions and cache lengths are int32)")
    return
  shape = kv_shape(config)
  if memory is None or shape is None or min(shape) < 1:
    return
  rows, slot = decode_rows(config), kv_slot_bytes(*shape, config.model.dtype)
  if rows * max_length * slot > memory:
    problems.append(
        f"model.max_length = {max_length}: a KV cache of {rows} rows x {max_length} slots x "
        f"{slot} bytes ({shape[0]} layers, {shape[1]} KV heads, head_dim {shape[2]}, keys and "
        f"values, {config.model.dtype}) takes {_size(rows * max_length * slot)}, more than this "
        f"host's {_size(memory)} of memory; must be <= {memory // (rows * slot)} here")


def seeds_per_split(name: str) -> int | None:
  """How many distinct tasks a split of environment `name` can hold, where the environment
  states it (tasks that are distinct seeds of a fixed range); None otherwise."""
  module = _SEEDED.get(name)
  return None if module is None else importlib.import_module(module).SEEDS_PER_SPLIT


def _check_tasks(config, memory: int | None, problems: list[str]) -> None:
  env = config.env
  limit = seeds_per_split(env.name)
  for key in ("num_train_tasks", "num_eval_tasks"):
    if limit is not None and env[key] > limit:
      problems.append(f"env.{key} = {env[key]}: must be <= {limit} (the distinct task seeds a "
                      f"{env.name} split holds)")
  total = env.num_train_tasks + env.num_eval_tasks
  if memory is not None and total * TASK_BYTES_FLOOR > memory:
    problems.append(
        f"env.num_train_tasks + env.num_eval_tasks = {total}: the run holds every task (at "
        f"least {TASK_BYTES_FLOOR} bytes each), {_size(total * TASK_BYTES_FLOOR)}, more than "
        f"this host's {_size(memory)} of memory; must be <= {memory // TASK_BYTES_FLOOR} here")


def _check_trees(config, memory: int | None, problems: list[str], group: int | None) -> None:
  """`group`: a baseline's episodes per group (None for trees)."""
  r = config.rollout
  branches = r.max_leaves if group is None else group
  nodes = r.tasks_per_iteration * r.trees_per_task * branches * config.env.max_turns
  if memory is not None and nodes * TREE_NODE_BYTES > memory:
    what = "rollout.max_leaves" if group is None else "episodes per group"
    problems.append(
        f"{what} x env.max_turns = {branches} x {config.env.max_turns}: the iteration's "
        f"{r.tasks_per_iteration * r.trees_per_task} trees of that many nodes take "
        f"{_size(nodes * TREE_NODE_BYTES)}, more than this host's {_size(memory)} of memory")


def layer_params(config) -> int:
  """Parameters of the from-scratch decoder's layers and final norm (no embedding).

  Biases (Qwen2's q/k/v) are not counted: a floor.

  Example: h 128, I 384, 3 layers, 4 heads, 2 KV heads, D 32 ->
  3·(128·128 + 2·128·64 + 128·128 + 3·128·384 + 2·128) + 128 = 590,720.
  """
  m = config.model
  h, qd, kvd = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
  per_layer = h * qd + 2 * h * kvd + qd * h + 3 * h * m.intermediate_size + 2 * h
  return m.num_layers * per_layer + h


def _check_weights(config, memory: int | None, problems: list[str]) -> None:
  if config.model.checkpoint or memory is None:
    return  # a checkpoint's weights are its files': the loader reads them one at a time
  weights = layer_params(config) * _ITEMSIZE[config.scale.param_dtype]
  if weights > memory:
    m = config.model
    problems.append(
        f"model: a decoder of {m.num_layers} layers, hidden_size {m.hidden_size}, "
        f"intermediate_size {m.intermediate_size}, {m.num_heads} heads of head_dim "
        f"{m.head_dim} has {layer_params(config)} parameters besides its embedding, "
        f"{_size(weights)} as {config.scale.param_dtype}, more than this host's "
        f"{_size(memory)} of memory")


def check(config, problems: list[str], memory: int | None = None,
          group: int | None = None) -> None:
  """Appends a line to `problems` for every size over its bound (see the module docstring).

  `memory`: the host's memory in bytes (`host_memory_bytes()`; None skips the memory bounds).
  `group`: a baseline's episodes per group, None for a tree estimator.
  """
  _check_kv_cache(config, memory, problems)
  _check_tasks(config, memory, problems)
  _check_trees(config, memory, problems, group)
  _check_weights(config, memory, problems)
