"""ALFWorld's own games, a Qwen2.5 checkpoint, one GPU: BPO trees in ALFWorld's text engine.

For a user with ALFWorld's data (`$ALFWORLD_DATA/json_2.1.1`, from `alfworld-download`) and a
Hugging Face directory of Qwen2.5(-Instruct). The train split is ALFWorld's train games, the
held-out split `valid_unseen` (or `valid_seen` with `--config.env.options.split=valid_seen`);
each observation lists the admissible commands, as verl-agent's ALFWorld prompt does for its
published GiGPO results. Nothing is downloaded at run time.

    python experiments/run.py --config=experiments/configs/alfworld_qwen2_5.py --workdir=WORKDIR \\
      --config.env.options.data_path=$ALFWORLD_DATA/json_2.1.1 --config.model.checkpoint=QWEN_DIR

Low-rank adapters on a bfloat16 model keep a 7B checkpoint on one GPU. BPO's trees and the
env-step budget are the comparison's (`base.pretrained`), so `experiments/compare.py` runs its
baselines from this file at matched compute.
"""

import ml_collections

from experiments.configs import alfworld
from experiments.configs import base


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = alfworld.get_config()
  c.env.options = ml_collections.ConfigDict({
      "data_path": "", "split": "valid_unseen", "admissible_commands": True, "max_steps": 50})
  c.env.num_train_tasks = 3553  # ALFWorld's train games (the solvable ones of them)
  c.env.num_eval_tasks = 134  # valid_unseen's games
  c.env.max_turns = 50
  c.env.num_workers = 8
  c.env.max_observation_tokens = 768
  c.rollout.max_action_tokens = 48
  c.rollout.tasks_per_iteration = 16
  c.model.max_length = 40960
  c.eval.num_tasks = 134
  base.pretrained(c, episodes=8)  # 400 env steps per task: a baseline's group of 8, as GiGPO's
  return base.variant(c, arg)
