"""Shared settings of the experiment configs: the worlds, the comparison's trees, matched compute.

Each config file is one world in one setting and trains BPO; the estimator is a key. compare.py's
`--estimators` gives every method the file's configuration through `with_estimator`; a single
run of a baseline sets the same two keys,

    python experiments/run.py --config=experiments/configs/rooms.py --workdir=workdirs/rooms_grpo \\
        --config.rollout.estimator=grpo --config.rollout.group_size=0

Matched compute, by construction: every method gets the same budget of environment steps per
tree (`rollout.max_env_steps`). BPO grows its tree inside it (a fork is made only if the worst
case of every live branch still fits); a baseline (`rollout.group_size = 0`) rolls as many whole
episodes as fit in it at the worst case, N = max_env_steps // env.max_turns, fixed before any
episode starts so that the group's size does not depend on its episodes' outcomes
(`rollout.RolloutConfig.episodes_per_group`). What each spends is logged (`env_steps`,
`tokens_processed` in `metrics.jsonl`).

A group reserves N whole episodes once, at the root, while BPO's forks reserve every live
branch's remaining turns at each decision, so BPO's trees leave some of a budget of N whole
episodes unspent; `matched_budget` adds the slack no whole episode can use. Each world's budget is
chosen on training tasks (docs/RESULTS.md).
"""

import ml_collections

from bpo_jax.training import config as config_lib
from bpo_jax.training import estimator_registry


def matched_budget(episodes: int, max_turns: int) -> int:
  """The largest env-step budget that holds `episodes` whole episodes of at most `max_turns`
  steps and no more: episodes * max_turns + max_turns - 1. A baseline rolls `episodes` in it;
  BPO's tree grows in all of it."""
  return episodes * max_turns + max_turns - 1


# The per-tree env-step budget of every method: rooms, a group of 4 episodes of 5 turns and the
# slack BPO's trees use; TextWorld's fixture games, two episodes of 8 turns.
ROOMS_ENV_STEPS = matched_budget(4, 5)
TEXTWORLD_ENV_STEPS = 16


def with_estimator(config: ml_collections.ConfigDict,
                   estimator: str) -> ml_collections.ConfigDict:
  """`config` with `estimator`; one that grows groups (a baseline) rolls as many whole
  episodes per task as fit in `rollout.max_env_steps` (`rollout.group_size = 0`)."""
  config.rollout.estimator = estimator
  if estimator_registry.get(estimator).topology == "group":
    config.rollout.group_size = 0
  return config


def rooms(estimator: str = "bpo") -> ml_collections.ConfigDict:
  """The built-in world at difficulty 1 with the library defaults (CPU, no downloads)."""
  config = config_lib.default_config()
  config.rollout.max_env_steps = ROOMS_ENV_STEPS
  return with_estimator(config, estimator)


def comparison_trees(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """BPO's trees in every comparison: forks, on the backbone and on siblings, at every decision
  the env-step budget still allows (entropy threshold 0, no quantile), up to 8 leaves, so that
  its trees spend about what a baseline's group of whole episodes does."""
  r = config.rollout
  r.siblings_fork = True
  r.entropy_threshold = 0.0
  r.entropy_quantile = 0.0
  r.max_leaves = 8
  return config


def compared(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The rooms comparison's settings: `comparison_trees` in 2048 tree tokens, 30 iterations,
  evaluated and checkpointed every 10 (the checkpoints the gradient variance is measured at)."""
  comparison_trees(config)
  config.rollout.max_tree_tokens = 2048
  config.train.iterations = 30
  config.eval.every = 10
  config.checkpoint.every = 10
  return config


def pretrained(config: ml_collections.ConfigDict, episodes: int = 4) -> ml_collections.ConfigDict:
  """A world's comparison from a pretrained Hugging Face checkpoint on one GPU (the
  `<world>_qwen2_5.py` files): `model.checkpoint` left for the command line, bfloat16 weights
  with rank-16 adapters (a 7B checkpoint fits one GPU), no warm start, learning rate 1e-5, and
  `comparison_trees` in an env-step budget of `episodes` whole episodes of `env.max_turns`. The
  tree's token budget is as many whole contexts (`model.max_length`, set before): a fork charges
  each live branch the rest of its context, so a smaller one would stop BPO's trees at fewer
  live branches than a group has episodes (a group's size counts env steps only)."""
  config.model.checkpoint = ""
  config.model.dtype = "bfloat16"
  config.model.lora_rank = 16
  config.warm_start.num_trajectories = 0  # a pretrained checkpoint needs no warm start
  config.train.learning_rate = 1e-5
  config.rollout.max_env_steps = episodes * config.env.max_turns
  config.rollout.max_tree_tokens = episodes * config.model.max_length
  return comparison_trees(config)


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
  config.rollout.max_env_steps = TEXTWORLD_ENV_STEPS
  return with_estimator(config, estimator)


def variant(config: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
  """`config` as a config file's argument asks (`--config=FILE:ARG`; ml_collections passes ARG
  to `get_config`): none or "" as it is, "tiny" its `tiny` version."""
  if not arg:
    return config
  if arg == "tiny":
    return tiny(config)
  raise ValueError(f"unknown config argument {arg!r}: tiny, or none")


def tiny(config: ml_collections.ConfigDict, iterations: int = 2) -> ml_collections.ConfigDict:
  """A seconds-long version of `config` for smoke tests and CI: a one-layer model, a handful of
  warm-start steps (a target, if any, checked on four training tasks), two tasks per iteration,
  at most four held-out tasks, at most four turns and one fork per tree (a baseline's group as
  many episodes as that fork's leaves, by the env-step budget); the world's token budgets
  (observation, action, context) as they are."""
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
  if config.warm_start.target_success > 0:  # checked every other step on 4 of 16 training tasks
    config.warm_start.validation_tasks = min(config.warm_start.validation_tasks, 4)
    config.warm_start.check_every = min(config.warm_start.check_every, 2)
  config.rollout.tasks_per_iteration = 2
  # Short trees: a few turns and one fork (the worlds' long contexts would otherwise make the
  # packed rows of a CPU update tens of thousands of tokens long).
  config.env.max_turns = min(config.env.max_turns, 4)
  config.rollout.max_leaves = config.rollout.k
  # The env-step budget of one fork's leaves: a baseline group of the same size.
  config.rollout.max_env_steps = min(config.rollout.max_env_steps,
                                     config.rollout.k * config.env.max_turns)
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
