"""The built-in world at difficulty 1 from a weak warm start: a regime where RL has room to learn.

The rooms comparison (`base.compared`: BPO's trees in the env-step budget of four whole episodes
plus the slack only a tree can use) from a warm start of 32 expert episodes over 150 steps
rather than 200, which leaves held-out success below 0.86, then 8 iterations of 8 tasks at
learning rate 1e-3 (the library's 2e-4 left held-out success where it was after 3 updates; 3e-3
collapsed it; 120 steps left seed 0 at 0.09, too few successes to learn from; at 1e-3 BPO's
held-out success on seed 0 rose over 8 updates and fell over the next 8). Chosen by a pilot on
seeds 0 and 100, which the sweep leaves out (docs/RESULTS.md). Held-out success on 512 tasks,
after 0, 4 and 8 updates; the iterations start on training tasks no warm-start episode
demonstrates (`rollout.task_offset`).

    python experiments/compare.py --config=experiments/configs/rooms_regime.py --seeds=10 \\
        --first_seed=1 --estimators=bpo,grpo,rloo --share_warm_start --jobs=1 \\
        --out=results/rooms_regime
"""

import ml_collections

from experiments.configs import base

WARM_START_STEPS = 150
EVAL_TASKS = 512


def get_config(arg=None) -> ml_collections.ConfigDict:
  config = base.compared(base.rooms("bpo"))
  config.warm_start.steps = WARM_START_STEPS
  config.env.num_train_tasks = 512
  config.rollout.task_offset = config.warm_start.num_trajectories
  config.env.num_eval_tasks = EVAL_TASKS
  config.eval.num_tasks = EVAL_TASKS
  config.rollout.tasks_per_iteration = 8
  config.train.learning_rate = 1e-3
  config.train.iterations = 8
  config.eval.every = 4
  config.checkpoint.every = 8
  config.log.progress_bar = False
  return base.variant(config, arg)
