"""The built-in world at difficulty 2, where the warm start leaves room: the rooms comparison there.

Three rooms, a one-way door into a dead end, a distractor object; shortest solutions of 3-6
steps. The comparison's trees (`base.compared`) in the env-step budget of four whole episodes;
a warm start of 32 expert episodes over 200 steps (chosen on training tasks no warm-start
episode demonstrates, docs/RESULTS.md), then 20 iterations of 16 tasks, held-out success every
5, checkpoints at 0, 10 and 20 (where the gradient variance is measured).

    python experiments/compare.py --config=experiments/configs/rooms_d2.py --seeds=5
"""

import ml_collections

from experiments.configs import base

# Seven turns leave the longest shortest solution a spare step.
TURNS = 7


def world(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Difficulty 2 on a rooms `config`: `TURNS` turns, the context they need, and the env-step
  budget of four whole episodes."""
  config.env.options.difficulty = 2
  config.env.max_turns = TURNS
  config.model.max_length = 448
  # Four whole episodes and no slack: here most episodes run to the turn limit, so a group
  # spends nearly all of its budget and the slack would be BPO's alone (docs/RESULTS.md).
  config.rollout.max_env_steps = 4 * TURNS
  return config


def get_config(arg=None) -> ml_collections.ConfigDict:
  config = world(base.compared(base.rooms("bpo")))
  config.warm_start.num_trajectories, config.warm_start.steps = 32, 200
  config.train.iterations = 20
  config.eval.every = 5
  config.checkpoint.every = 10
  return base.variant(config, arg)
