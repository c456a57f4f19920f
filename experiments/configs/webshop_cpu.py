"""The WebShop comparison on a CPU: a shop small enough to train the quickstart's model from scratch.

200 products (320 train, 40 test goals) of `webshop.py`'s synthetic shop, three results per
page, observations cut at 128 tokens and 6 turns, a warm start of 256 expert episodes over 600
steps (chosen on the 64 training goals it does not demonstrate, docs/RESULTS.md). Its tokenizer
keeps each product id whole (`atomic_strings`, `bpo_jax/text/bpe.py`). An env-step budget of
four whole episodes, BPO's trees as in `base.compared`; 20 iterations of 8 goals from the first
one the warm start does not demonstrate (`rollout.task_offset`), held-out success every 5,
checkpoints at 0, 10 and 20.

    python experiments/compare.py --config=experiments/configs/webshop_cpu.py --seeds=5
"""

import ml_collections

from experiments.configs import base
from experiments.configs import webshop

TURNS = 6


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = webshop.get_config()
  c.env.options.num_products = 200
  c.env.options.results_per_page = 3
  c.env.options.max_steps = TURNS
  c.env.num_train_tasks = 320
  c.env.num_eval_tasks = 40
  c.eval.num_tasks = 40
  c.env.max_turns = TURNS
  c.env.max_observation_tokens = 128
  c.model.max_length = 1152
  c.rollout.tasks_per_iteration = 8
  c.rollout.max_env_steps = 4 * TURNS
  c.warm_start.num_trajectories = 256
  c.warm_start.steps = 600
  c.warm_start.batch_size = 8
  c.rollout.task_offset = c.warm_start.num_trajectories
  base.compared(c)
  c.rollout.max_tree_tokens = 4608
  c.train.iterations = 20
  c.eval.every = 5
  c.checkpoint.every = 10
  return base.variant(c, arg)
