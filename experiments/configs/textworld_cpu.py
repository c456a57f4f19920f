"""The TextWorld comparison on a CPU: 256 training and 40 held-out generated games.

TextWorld's "custom" games (two rooms, four objects, quests of three actions; the expert solves
each in 2-3 commands), generated once into `GAMES` by `COMMAND`:

    python scripts/make_textworld_games.py --output workdirs/textworld_games \\
      --train_seeds $(seq 1001 1256) --test_seeds $(seq 2001 2040)
    python experiments/compare.py --config=experiments/configs/textworld_cpu.py --seeds=5

`TURNS` turns, the env-step budget of four whole episodes, BPO's trees as in `base.compared`;
observations cut at 160 tokens (the opening one states the quest first, in at most 127); the
quickstart's model; a warm start of 192 expert episodes over 400 steps (chosen on training games
it does not demonstrate, docs/RESULTS.md), then 20 iterations of 8 tasks starting on the 64
games it does not demonstrate (`rollout.task_offset`), held-out success on the 40 games every 5,
checkpoints at 0, 10 and 20.
"""

import ml_collections

from experiments.configs import base

GAMES = "workdirs/textworld_games"
COMMAND = (f"python scripts/make_textworld_games.py --output {GAMES} "
           "--train_seeds $(seq 1001 1256) --test_seeds $(seq 2001 2040)")
# Five turns leave the longest expert solution two spare steps.
TURNS = 5


def get_config(arg=None) -> ml_collections.ConfigDict:
  config = base.compared(base.textworld("bpo", games_dir=GAMES))
  config.env.num_train_tasks = 256
  config.env.num_eval_tasks = config.eval.num_tasks = 40
  config.env.max_turns = TURNS
  config.env.max_observation_tokens = 160
  config.model.max_length = 1024
  config.rollout.max_tree_tokens = 4096
  config.rollout.max_env_steps = 4 * TURNS  # four whole episodes and no slack
  config.rollout.tasks_per_iteration = 8
  config.warm_start.num_trajectories, config.warm_start.steps = 192, 400
  config.rollout.task_offset = config.warm_start.num_trajectories
  config.train.iterations = 20
  config.eval.every = 5
  config.checkpoint.every = 10
  return base.variant(config, arg)
