"""Shared settings of the experiment configs: the world, the model, and matched compute.

Every config file is `base.<world>()` with one estimator on top:

    rooms(estimator)      the built-in world (difficulty 1), a ~0.6M-parameter decoder, CPU
    textworld(estimator)  TextWorld games made by scripts/make_textworld_games.py

Matched compute. BPO grows one tree per task with forks of K = `rollout.k` siblings within the
per-tree budgets (leaves, tokens, env steps); the baselines roll `rollout.k` = N independent
episodes per task. N is set so that a baseline group costs what a BPO tree costs in environment
steps (`branching.matched_group_size`: BPO's mean env steps per tree over the mean episode
length, both measured on the quickstart run), and every run logs `env_steps` and
`tokens_processed` per iteration, so the match can be checked in `metrics.jsonl`.
"""

import ml_collections

from bpo_jax.training import config as config_lib
from bpo_jax.training import estimator_registry

# Independent episodes per task matching one BPO tree's environment steps (see the docstring).
# Rooms, measured on the quickstart (120 iterations x 16 trees): 6.8 env steps and 1.7 leaves
# per tree, 3.9 steps per leaf: matched_group_size(6.8, 3.9) = 2. TextWorld takes the same value by
# the same rule; it was not measured there (check `env_steps` in a run's metrics.jsonl).
ROOMS_MATCHED_GROUP_SIZE = 2
TEXTWORLD_MATCHED_GROUP_SIZE = 2


def with_estimator(config: ml_collections.ConfigDict, estimator: str,
                   matched_group_size: int) -> ml_collections.ConfigDict:
  """`config` with `estimator`; one that grows groups (a baseline) gets `matched_group_size`
  episodes per task."""
  config.rollout.estimator = estimator
  if estimator_registry.get(estimator).topology == "group":
    config.rollout.k = matched_group_size
    config.rollout.max_leaves = max(config.rollout.max_leaves, matched_group_size)
  return config


def rooms(estimator: str = "bpo") -> ml_collections.ConfigDict:
  """The built-in world at difficulty 1 with the library defaults (CPU, no downloads)."""
  config = config_lib.default_config()
  return with_estimator(config, estimator, ROOMS_MATCHED_GROUP_SIZE)


def textworld(estimator: str = "bpo",
              games_dir: str = "tests/fixtures/textworld_games") -> ml_collections.ConfigDict:
  """TextWorld games (the repository's fixture games by default; make more with
  `python scripts/make_textworld_games.py`), played through Jericho (extra `textworld`)."""
  config = config_lib.default_config()
  config.env.name = "textworld"
  config.env.options = ml_collections.ConfigDict({"games_dir": games_dir})
  config.env.num_train_tasks = 64
  config.env.num_eval_tasks = 16
  config.eval.num_tasks = 16
  config.env.max_turns = 8
  config.env.max_observation_tokens = 96
  config.rollout.max_action_tokens = 8
  config.model.max_length = 1024
  config.rollout.max_tree_tokens = 2048
  config.warm_start.num_trajectories = 32
  return with_estimator(config, estimator, TEXTWORLD_MATCHED_GROUP_SIZE)


VARIANTS = ("tiny",)


def variant(config: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
  """`config` as a config file's argument asks (`--config=FILE:ARG`; ml_collections passes ARG
  to `get_config`): none or "" as it is, "tiny" its `tiny` version."""
  if not arg:
    return config
  if arg == "tiny":
    return tiny(config)
  raise ValueError(f"unknown config argument {arg!r}: one of {', '.join(VARIANTS)}, or none")


def tiny(config: ml_collections.ConfigDict, iterations: int = 2) -> ml_collections.ConfigDict:
  """A seconds-long version of `config` for smoke tests and CI: a one-layer model, a handful of
  warm-start steps, two tasks per iteration, at most four held-out tasks, at most four turns
  and one fork per tree; the world's token budgets (observation, action, context) as they are."""
  config.model.hidden_size = 32
  config.model.intermediate_size = 64
  config.model.num_layers = 1
  config.model.num_heads = 2
  config.model.num_kv_heads = 1
  config.model.head_dim = 16
  config.env.num_train_tasks = min(config.env.num_train_tasks, 16)
  config.env.num_eval_tasks = min(config.env.num_eval_tasks, 4)
  config.eval.num_tasks = min(config.eval.num_tasks, 4)
  config.eval.every = 0
  config.warm_start.num_trajectories = min(config.warm_start.num_trajectories, 8)
  config.warm_start.steps = 4
  config.warm_start.batch_size = 4
  config.rollout.tasks_per_iteration = 2
  # Short trees: a few turns and one fork (the worlds' long contexts would otherwise make the
  # packed rows of a CPU update tens of thousands of tokens long).
  config.env.max_turns = min(config.env.max_turns, 4)
  config.rollout.max_leaves = config.rollout.k
  config.train.iterations = iterations
  config.checkpoint.every = 1
  config.log.progress_bar = False
  return config


def pod(config: ml_collections.ConfigDict, *, model_preset: str, chip: str, fsdp: int,
        tensor: int, hosts: int, tasks_per_iteration: int, max_tree_tokens: int,
        max_length: int, micro_batches: int) -> ml_collections.ConfigDict:
  """A pretrained preset on a pod slice: BPO with a leave-one-out trunk over 2 trees per task,
  bfloat16 parameters with float32 master weights, full remat, scanned layers, FSDP x tensor
  mesh over `fsdp * tensor` chips driven by `hosts` processes (4 chips per host)."""
  c = config
  c.rollout.tasks_per_iteration = tasks_per_iteration
  c.rollout.trees_per_task = 2
  c.rollout.trunk_baseline = "loo"
  c.rollout.max_leaves = 4
  c.rollout.max_tree_tokens = max_tree_tokens
  c.model.max_length = max_length
  c.train.micro_batches = micro_batches
  c.train.learning_rate = 1e-6
  c.warm_start.num_trajectories = 0  # a pretrained checkpoint needs no warm start
  s = c.scale
  s.model_preset = model_preset
  s.chip = chip
  s.num_devices = fsdp * tensor
  s.mesh.data, s.mesh.fsdp, s.mesh.tensor, s.mesh.dcn_data = 1, fsdp, tensor, 1
  s.param_dtype = "bfloat16"
  s.master_weights = True
  s.remat = "full"
  s.scan_layers = True
  s.distributed.coordinator_address = "host0:8476"
  s.distributed.num_processes = hosts
  return c
