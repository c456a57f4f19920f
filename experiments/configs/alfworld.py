"""ALFWorld (Shridhar et al., 2021): household tasks of six types on ALFWorld's own text engine.

ALFWorld's game files are a separate download, so by default the tasks are generated: household
layouts over ALFRED's four room kinds with tasks of all six types (pick and place, examine in
light, clean, heat, cool, pick two), written in ALFWorld's game format and kept only when
ALFWorld's hand-coded expert solves them. Generation takes a second or two per game; the games
are kept in `cache_dir` and reloaded on later runs. To train on ALFWorld's own games instead, set
`env.options.data_path` to its json_2.1.1 directory ("test" then reads valid_unseen).

The room's opening description lists every receptacle (up to ~30), so observations are cut at
160 tokens; episodes have at most 30 turns; the planner expert (`expert_actions`) solves a game
in about 5-12 commands.

    python experiments/run.py --config=experiments/configs/alfworld.py --workdir=workdirs/alfworld

`alfworld.py:cpu` is a version small enough to train the quickstart's from-scratch model (hidden
128, 3 layers) on a CPU, for the comparison of BPO against GRPO, RLOO and GiGPO
(docs/RESULTS.md): generated games of two task types (pick and place, examine in light) with 2-5
distractors that the expert solves in at most 8 commands (3-5 in practice), 8 turns,
observations cut at 128 tokens (the opening description ends with the task; at most 120 tokens
over 120 of the games), actions of up to 16 tokens, 40 held-out games. Every method has 32 env steps per task, so a
baseline rolls 4 whole episodes; BPO forks on siblings at every decision the budget allows, up to
8 leaves (`base.compared`). A warm start of 128 expert episodes over 400 steps (chosen on training
tasks it does not demonstrate, docs/RESULTS.md), then 10 iterations of 6 tasks, evaluated and
checkpointed every 5. The games are generated once (about 4 minutes) into workdirs/.
"""

import ml_collections

from bpo_jax.training import config as config_lib
from experiments.configs import base


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = config_lib.default_config()
  c.env.name = "alfworld"
  c.env.options = ml_collections.ConfigDict({
      "max_steps": 30,
      "num_distractors": (6, 14),
      "cache_dir": "workdirs/alfworld_games",
  })
  c.env.num_train_tasks = 240
  c.env.num_eval_tasks = 60
  c.env.max_turns = 30
  c.env.num_workers = 2
  c.env.timeout_s = 60.0           # a worker's first restore of a game loads it (about a second)
  c.env.max_observation_tokens = 160
  c.rollout.max_action_tokens = 10
  c.model.max_length = 5632
  c.rollout.max_tree_tokens = 16384
  c.rollout.max_env_steps = 240
  c.eval.num_tasks = 60
  if arg == "cpu":
    return cpu(c)
  return base.variant(c, arg)


# `alfworld.py:cpu`'s turn limit; a baseline's group holds the whole episodes that fit in the
# env-step budget, 4 * CPU_TURNS (`base.with_estimator`).
CPU_TURNS = 8


def cpu(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The small games of the module docstring (`alfworld.py:cpu`), with the comparison's settings
  (`base.compared`): BPO forks on siblings at every decision the budget allows, up to 8 leaves.
  The iterations start past the 128 games the warm start demonstrates (`rollout.task_offset`)."""
  c.env.options.task_types = ("pick_and_place_simple", "look_at_obj_in_light")
  c.env.options.num_distractors = (2, 5)
  c.env.options.max_expert_steps = CPU_TURNS
  c.env.options.max_steps = CPU_TURNS
  c.env.options.cache_dir = "workdirs/alfworld_games"
  c.env.num_train_tasks = 256
  c.env.num_eval_tasks = 40
  c.env.num_workers = 0
  c.env.max_turns = CPU_TURNS
  c.env.max_observation_tokens = 128
  c.rollout.max_action_tokens = 16
  c.model.max_length = 1344
  c.eval.num_tasks = 40
  c.warm_start.num_trajectories = 128
  c.warm_start.steps = 400
  c.warm_start.batch_size = 8
  c.rollout.task_offset = c.warm_start.num_trajectories  # RL on the games it did not demonstrate
  c.rollout.tasks_per_iteration = 6
  c.rollout.max_env_steps = 4 * CPU_TURNS
  base.compared(c)
  c.rollout.max_tree_tokens = 6144
  c.train.iterations = 10
  c.eval.every = 5
  c.checkpoint.every = 5
  c.checkpoint.keep = 3
  return c
