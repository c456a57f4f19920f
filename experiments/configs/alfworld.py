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

`alfworld_cpu.py` is the small version the comparison trains on a CPU.
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
  return base.variant(c, arg)

