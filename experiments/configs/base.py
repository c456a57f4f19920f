"""Shared settings of the experiment configs: the world, the model, and matched compute.

Every config file is `base.<world>()` with one estimator on top:

    rooms(estimator)      the built-in world (difficulty 1), a ~0.6M-parameter decoder, CPU
    textworld(estimator)  TextWorld games made by scripts/make_textworld_games.py

and the rooms comparison (rooms_bpo.py and its baselines) adds `compared(config)`: its trees,
iterations and evaluations; `rooms_d2(estimator)` (`rooms_bpo.py:d2`) is that comparison at
difficulty 2, where the warm start leaves room; `textworld_cpu(estimator)`
(`textworld_bpo.py:cpu`) is the comparison on 296 generated TextWorld games; `pretrained(config)`
makes a world's comparison from a pretrained checkpoint on a GPU (the `<world>_qwen2_5.py` files).

Matched compute, by construction. Every method gets the same budget of environment steps per
tree (`rollout.max_env_steps`; per task with one tree per task): BPO grows its tree inside it
(a fork is made only if the worst case of every live branch still fits), and a baseline
(`rollout.group_size = 0`) rolls as many whole episodes as fit in it at the worst case,
N = max_env_steps // env.max_turns, fixed before any episode starts so that the group's size
does not depend on its episodes' outcomes (`rollout.RolloutConfig.episodes_per_group`). Neither
can spend more than the budget and no episode is cut by it; what each spends is logged
(`env_steps`, `tokens_processed` per iteration in `metrics.jsonl`).

Both charge the worst case, but not alike: a group reserves N whole episodes once, at the root,
while BPO's forks reserve every live branch's rest of the turns at each decision, so at a budget
of N whole episodes its trees spend about 10% fewer env steps and 15% fewer tokens than a group
(docs/RESULTS.md, the rooms sweeps). `matched_budget` gives the budget the slack that no whole
episode can use, which BPO's trees can. How much slack matches depends on how often episodes end
before the turn limit, so each world's budget is chosen on training tasks: at difficulty 1 most
episodes succeed early and the slack brings BPO's spend to a group's; at difficulty 2 most run
to the limit, a group spends nearly all of its budget, and four whole episodes with no slack
match.
"""

import ml_collections

from bpo_jax.training import config as config_lib
from bpo_jax.training import estimator_registry



def matched_budget(episodes: int, max_turns: int) -> int:
  """The largest env-step budget that holds `episodes` whole episodes of at most `max_turns`
  steps and no more: episodes * max_turns + max_turns - 1. A baseline rolls `episodes` in it;
  BPO's tree grows in all of it."""
  return episodes * max_turns + max_turns - 1


# The per-tree env-step budget of every method. Rooms: a baseline group holds N = 4 episodes
# (env.max_turns = 5) and BPO's tree grows in 24 steps. Chosen on training tasks, at the rooms
# comparison's BPO checkpoint 30 of seed 0 (results/rooms_bpo_claim2; 8 draws of the next
# iteration's 16 tasks, `compare.py --grad_params_from`): BPO spent 12.1 env steps and 396
# tokens per task at 20 steps, 13.2 and 415 at 22, 14.7 and 438 at 24, against GRPO's 13.6 and
# 467 (16 draws), so at 24 within 10% of a group in both. TextWorld: two episodes
# (env.max_turns = 8), not yet measured this way.
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
  its trees spend about what a baseline's group of whole episodes does (on rooms, a threshold
  at the states' 0.5 quantile spent 8.1 env steps per task at 20 against a group's 15.1)."""
  r = config.rollout
  r.siblings_fork = True
  r.entropy_threshold = 0.0
  r.entropy_quantile = 0.0
  r.max_leaves = 8
  return config


def compared(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The comparison's settings (rooms_bpo.py and its baselines): `comparison_trees` in 2048
  tree tokens, 30 iterations, evaluated and checkpointed every 10 (the gradient-variance
  checkpoints)."""
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
  `comparison_trees` in an env-step budget of `episodes` whole episodes of `env.max_turns`, so
  that `experiments/compare.py` runs it at matched compute. The tree's token budget is as many
  whole contexts (`model.max_length`, set before): a fork charges each live branch the rest of
  its context, so a smaller one would stop BPO's trees at fewer live branches than a group has
  episodes (a group's size counts env steps only)."""
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


# TextWorld on a CPU (`textworld_<estimator>.py:cpu`): 256 training and 40 held-out games of
# TextWorld's "custom" type (two rooms, four objects, quests of three actions; the expert solves
# each in 2-3 commands), generated once into TEXTWORLD_CPU_GAMES by
TEXTWORLD_CPU_GAMES = "workdirs/textworld_games"
TEXTWORLD_CPU_COMMAND = (f"python scripts/make_textworld_games.py --output {TEXTWORLD_CPU_GAMES} "
                         "--train_seeds $(seq 1001 1256) --test_seeds $(seq 2001 2040)")
# Five turns leave the longest expert solution two spare steps; four whole episodes and no slack.
TEXTWORLD_CPU_TURNS = 5


def textworld_cpu(estimator: str = "bpo") -> ml_collections.ConfigDict:
  """The TextWorld comparison on a CPU (`textworld_bpo.py:cpu`): the games of
  `TEXTWORLD_CPU_COMMAND`, `TEXTWORLD_CPU_TURNS` turns, the env-step budget of four whole
  episodes, BPO's trees as in `compared`; observations cut at 160 tokens (the opening one states
  the quest first, in at most 127 tokens); the quickstart's model; a warm start of 192 expert
  episodes over 400 steps (chosen on training games it does not demonstrate, docs/RESULTS.md),
  then 20 iterations of 8 tasks starting on the 64 games it does not demonstrate
  (`rollout.task_offset`), held-out success on the 40 games every 5, checkpoints at 0, 10 and
  20."""
  config = compared(textworld(estimator, games_dir=TEXTWORLD_CPU_GAMES))
  config.env.num_train_tasks = 256
  config.env.num_eval_tasks = config.eval.num_tasks = 40
  config.env.max_turns = TEXTWORLD_CPU_TURNS
  config.env.max_observation_tokens = 160
  config.model.max_length = 1024
  config.rollout.max_tree_tokens = 4096
  config.rollout.max_env_steps = 4 * TEXTWORLD_CPU_TURNS
  config.rollout.tasks_per_iteration = 8
  config.warm_start.num_trajectories, config.warm_start.steps = 192, 400
  config.rollout.task_offset = config.warm_start.num_trajectories
  config.train.iterations = 20
  config.eval.every = 5
  config.checkpoint.every = 10
  return config


def textworld_comparison(estimator: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """The configuration of textworld_<estimator>.py: the fixture games (`textworld(estimator)`),
  with ARG "cpu" the comparison on generated games (`textworld_cpu`), with "tiny" the
  former's tiny version."""
  if arg == "cpu":
    return textworld_cpu(estimator)
  return variant(textworld(estimator), arg, others=("cpu",))


VARIANTS = ("tiny",)


def variant(config: ml_collections.ConfigDict, arg: str | None,
            others: tuple[str, ...] = ()) -> ml_collections.ConfigDict:
  """`config` as a config file's argument asks (`--config=FILE:ARG`; ml_collections passes ARG
  to `get_config`): none or "" as it is, "tiny" its `tiny` version; `others` are the file's own
  arguments, named in the error."""
  if not arg:
    return config
  if arg == "tiny":
    return tiny(config)
  raise ValueError(f"unknown config argument {arg!r}: one of "
                   f"{', '.join(VARIANTS + tuple(others))}, or none")


def rooms_comparison(estimator: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """The configuration of rooms_<estimator>.py: the comparison at difficulty 1
  (`compared(rooms(estimator))`), with ARG "d2" the one at difficulty 2 (`rooms_d2`), with
  "tiny" the former's tiny version."""
  if arg == "d2":
    return rooms_d2(estimator)
  return variant(compared(rooms(estimator)), arg, others=("d2",))


# Rooms at difficulty 2: three rooms, a one-way door into a dead end, a distractor object;
# shortest solutions of 3-6 steps. 7 turns leave the longest one a spare step.
ROOMS_D2_TURNS = 7
# Four whole episodes and no slack: here most episodes run to the turn limit, so a group spends
# nearly all of its 28 steps. Chosen on training tasks, at checkpoint 20 of the first d2 sweep's
# BPO run of seed 0 (8 draws of the next iteration's 16 tasks, `compare.py --grad_params_from`):
# at 28 BPO spent 24.0 env steps and 952 tokens per task, GRPO 23.7 and 974; that sweep ran at
# `matched_budget(4, 7)` = 34, where BPO's own runs spent 31.0 against the groups' 25.0-25.6.
ROOMS_D2_ENV_STEPS = 4 * ROOMS_D2_TURNS


def rooms_d2(estimator: str = "bpo") -> ml_collections.ConfigDict:
  """The comparison where the warm start leaves room (`rooms_bpo.py:d2`): difficulty 2,
  `ROOMS_D2_TURNS` turns, the env-step budget of four whole episodes (`ROOMS_D2_ENV_STEPS`),
  BPO's trees as in `compared`. A warm start of 32 expert episodes over 200 steps (chosen on
  training tasks no warm-start episode demonstrates, docs/RESULTS.md), then 20 iterations of 16
  tasks, held-out success every 5, checkpoints at 0, 10 and 20 (the gradient-variance
  checkpoints)."""
  config = compared(rooms(estimator))
  config.env.options.difficulty = 2
  config.env.max_turns = ROOMS_D2_TURNS
  config.model.max_length = 448
  config.rollout.max_env_steps = ROOMS_D2_ENV_STEPS
  config.warm_start.num_trajectories, config.warm_start.steps = 32, 200
  config.train.iterations = 20
  config.eval.every = 5
  config.checkpoint.every = 10
  return config


def tiny(config: ml_collections.ConfigDict, iterations: int = 2) -> ml_collections.ConfigDict:
  """A seconds-long version of `config` for smoke tests and CI: a one-layer model, a handful of
  warm-start steps, two tasks per iteration, at most four held-out tasks, at most four turns
  and one fork per tree (a baseline's group as many episodes as that fork's leaves, by the
  env-step budget); the world's token budgets (observation, action, context) as they are."""
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
