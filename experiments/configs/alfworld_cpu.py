"""The ALFWorld comparison on a CPU: generated games small enough for the quickstart's model.

The quickstart's from-scratch model (hidden 128, 3 layers) against GRPO, RLOO and GiGPO
(docs/RESULTS.md) on generated games (`alfworld.py`) of two task types (pick and place, examine
in light) with 2-5 distractors that the expert solves in at most 8 commands (3-5 in practice):
8 turns, observations cut at 128 tokens (the opening description ends with the task; at most
120 tokens over 120 of the games), actions of up to 16 tokens, 40 held-out games. Every method
has the env-step budget of four whole episodes; BPO forks on siblings at every decision the
budget allows, up to 8 leaves (`base.compared`). A warm start of 128 expert episodes over 400
steps (chosen on training tasks it does not demonstrate, docs/RESULTS.md), then 10 iterations
of 6 tasks from the first game it does not demonstrate (`rollout.task_offset`), evaluated and
checkpointed every 5. The games are generated once (about 4 minutes) into workdirs/.

    python experiments/compare.py --config=experiments/configs/alfworld_cpu.py --seeds=5
"""

import ml_collections

from experiments.configs import alfworld
from experiments.configs import base

TURNS = 8


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = alfworld.get_config()
  c.env.options.task_types = ("pick_and_place_simple", "look_at_obj_in_light")
  c.env.options.num_distractors = (2, 5)
  c.env.options.max_expert_steps = TURNS
  c.env.options.max_steps = TURNS
  c.env.options.cache_dir = "workdirs/alfworld_games"
  c.env.num_train_tasks = 256
  c.env.num_eval_tasks = 40
  c.env.num_workers = 0
  c.env.max_turns = TURNS
  c.env.max_observation_tokens = 128
  c.rollout.max_action_tokens = 16
  c.model.max_length = 1344
  c.eval.num_tasks = 40
  c.warm_start.num_trajectories = 128
  c.warm_start.steps = 400
  c.warm_start.batch_size = 8
  c.rollout.task_offset = c.warm_start.num_trajectories  # RL on the games it did not demonstrate
  c.rollout.tasks_per_iteration = 6
  c.rollout.max_env_steps = 4 * TURNS
  base.compared(c)
  c.rollout.max_tree_tokens = 6144
  c.train.iterations = 10
  c.eval.every = 5
  c.checkpoint.every = 5
  c.checkpoint.keep = 3
  return base.variant(c, arg)
