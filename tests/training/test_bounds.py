"""training/bounds.py: the floors of a run's memory, counted by hand, and each bound's edge.

`check` is given the memory size, so each bound is tried exactly at its edge: the largest size
that fits is accepted and one more is refused, in one line naming the key.
"""

import os
import sys

import pytest

from bpo_jax.models import config as model_config_lib
from bpo_jax.sandboxes import rooms
from bpo_jax.sandboxes import gym_text
from bpo_jax.training import bounds
from bpo_jax.training import config as config_lib


def _check(config, memory, group=None) -> list[str]:
  problems = []
  bounds.check(config, problems, memory, group)
  return problems


def _one(check, config, memory, *args) -> list[str]:
  """One bound's problems (the others may fail at a memory this small)."""
  problems = []
  check(config, memory, problems, *args)
  return problems


def test_kv_slot_and_rows_by_hand():
  # 2 (keys, values) x 3 layers x 2 KV heads x 32 dims x 4 bytes.
  assert bounds.kv_slot_bytes(3, 2, 32, "float32") == 1536
  assert bounds.kv_slot_bytes(3, 2, 32, "bfloat16") == 768
  config = config_lib.default_config()  # 16 tasks x 1 tree, 64 held-out tasks
  assert bounds.decode_rows(config) == 64
  config.eval.num_tasks = 4
  assert bounds.decode_rows(config) == 16
  config.rollout.tasks_per_iteration = 3
  assert bounds.decode_rows(config) == 8  # the engine's smallest batch
  config.rollout.tasks_per_iteration, config.rollout.trees_per_task = 15, 2
  config.scale.distributed.num_processes = 4
  assert bounds.decode_rows(config) == 8  # ceil(30 / 4) = 8
  config.rollout.tasks_per_iteration = 17
  assert bounds.decode_rows(config) == 9  # ceil(34 / 4)


def test_kv_cache_bound_at_its_edge():
  config = config_lib.default_config()
  per_slot_row = 64 * 1536
  memory = 1000 * per_slot_row + 5
  config.model.max_length = 1000
  assert _check(config, memory) == []
  config.model.max_length = 1001
  assert _check(config, memory) == [
      "model.max_length = 1001: a KV cache of 64 rows x 1001 slots x 1536 bytes (3 layers, 2 KV "
      "heads, head_dim 32, keys and values, float32) takes 93.8 MiB, more than this host's "
      "93.8 MiB of memory; must be <= 1000 here"]


def test_kv_shape_comes_from_the_checkpoint(tmp_path):
  (tmp_path / "config.json").write_text(
      '{"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, '
      '"hidden_size": 896}')
  config = config_lib.default_config()
  config.model.checkpoint = str(tmp_path)
  assert bounds.kv_shape(config) == (24, 2, 64)  # Qwen2.5-0.5B: head_dim 896 / 14
  (tmp_path / "config.json").write_text('{"num_hidden_layers": 2}')
  assert bounds.kv_shape(config) is None  # the loader names what is missing


def test_task_bound_at_its_edge():
  assert bounds.TASK_BYTES_FLOOR == 16 + sys.getsizeof(object()) + sys.getsizeof("")
  config = config_lib.default_config()
  config.env.name = "webshop"  # no seed range: the memory bound alone
  config.env.options = {}
  memory = 1000 * bounds.TASK_BYTES_FLOOR
  config.env.num_train_tasks, config.env.num_eval_tasks = 936, 64
  tasks = bounds._check_tasks  # pylint: disable=protected-access
  assert _one(tasks, config, memory) == []
  config.env.num_train_tasks = 937
  assert _one(tasks, config, memory) == [
      f"env.num_train_tasks + env.num_eval_tasks = 1001: the run holds every task (at least "
      f"{bounds.TASK_BYTES_FLOOR} bytes each), {bounds._size(1001 * bounds.TASK_BYTES_FLOOR)}, "  # pylint: disable=protected-access
      f"more than this host's {bounds._size(memory)} of memory; must be <= 1000 here"]  # pylint: disable=protected-access


@pytest.mark.parametrize("name", ["rooms", "frozenlake"])
def test_seeded_environments_hold_their_seed_range(name):
  assert bounds.seeds_per_split(name) == 2**30
  assert rooms.SEEDS_PER_SPLIT == gym_text.SEEDS_PER_SPLIT == 2**30
  config = config_lib.default_config()
  config.env.name = name
  config.env.num_eval_tasks = 2**30 + 1
  assert _check(config, None) == [
      f"env.num_eval_tasks = {2**30 + 1}: must be <= {2**30} (the distinct task seeds a {name} "
      "split holds)"]
  # The task makers refuse it too, rather than drawing seeds for ever.
  with pytest.raises(ValueError, match=r"num must be in \[0, 1073741824\]"):
    rooms.make_tasks("train", num=2**30 + 1, seed=0)
  from bpo_jax.sandboxes.gym_text import taxi  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"num must be in \[0, 1073741824\]"):
    taxi.make_tasks("train", num=2**30 + 1, seed=0)


def test_tree_bound_at_its_edge():
  config = config_lib.default_config()  # 16 trees of 4 leaves x 5 turns
  nodes = 16 * 4 * 5
  assert bounds.TREE_NODE_BYTES == 23
  trees = bounds._check_trees  # pylint: disable=protected-access
  assert _one(trees, config, nodes * 23, None) == []
  problems = _one(trees, config, nodes * 23 - 1, None)
  assert problems == [
      f"rollout.max_leaves x env.max_turns = 4 x 5: the iteration's 16 trees of that many nodes "
      f"take {bounds._size(nodes * 23)}, more than this host's {bounds._size(nodes * 23 - 1)} of "  # pylint: disable=protected-access
      "memory"]
  # A baseline's group: its episodes in place of the leaves.
  assert _one(trees, config, 16 * 8 * 5 * 23, 8) == []
  assert _one(trees, config, 16 * 8 * 5 * 23 - 1, 8)[0].startswith(
      "episodes per group x env.max_turns = 8 x 5")


def test_layer_parameters_match_the_decoder():
  """The floor counts every parameter but the embedding and Qwen2's q/k/v biases."""
  config = config_lib.default_config()
  assert bounds.layer_params(config) == 590_720
  model = model_config_lib.ModelConfig(
      architecture="qwen2", vocab_size=300, hidden_size=128, intermediate_size=384, num_layers=3,
      num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True, qkv_bias=True)
  biases = 3 * (4 * 32 + 2 * 2 * 32)
  assert bounds.layer_params(config) == model.num_params() - 300 * 128 - biases


def test_weight_bound_at_its_edge():
  config = config_lib.default_config()
  weights = 590_720 * 4
  check = bounds._check_weights  # pylint: disable=protected-access
  assert _one(check, config, weights) == []
  (problem,) = _one(check, config, weights - 1)
  assert problem.startswith("model: a decoder of 3 layers, hidden_size 128, intermediate_size "
                            "384, 4 heads of head_dim 32 has 590720 parameters besides its "
                            "embedding, 2.3 MiB as float32, more than this host's")
  config.model.checkpoint = "/some/checkpoint"  # its weights are read one at a time
  assert _one(check, config, weights - 1) == []


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="no /proc/meminfo here")
def test_host_memory_is_meminfo_total_or_the_cgroup_limit():
  with open("/proc/meminfo", encoding="ascii") as f:
    total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
  limit = None
  if os.path.exists("/sys/fs/cgroup/memory.max"):
    with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
      text = f.read().strip()
    limit = int(text) if text.isdigit() else None
  assert bounds.host_memory_bytes() == (total if limit is None else min(total, limit))
