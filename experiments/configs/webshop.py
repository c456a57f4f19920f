"""WebShop (Yao et al., 2022): buy the product an instruction describes, in a synthetic shop.

The shop is generated offline (1000 products of 12 types, two instructions each: 1600 train,
200 eval and 200 test goals). WebShop's own released files are `webshop_qwen2_5.py`'s
(`--config.env.options.data_dir=D`); a config of your own names them with `data_dir` (a
directory of the released files; `data_size`: "1000" for items_shuffle_1000.json, "full" for
items_shuffle.json) or `products_path`, `attributes_path`, `human_instructions_path`, in place
of `catalogue_seed` and `goals_per_product`; `num_products` keeps the first N products, and the
search index is saved once under `index_cache_dir`.

Pages are long (a result page lists ten titles, about 360 words), so observations are cut at
384 tokens and the context holds 10 turns (a path of up to ~4250 tokens in the chat format); the
expert buys in about 6.

    python experiments/run.py --config=experiments/configs/webshop.py --workdir=workdirs/webshop

`webshop.py:cpu` is a shop small enough to train from scratch on a CPU with the quickstart's
model: 200 products (320 train, 40 test goals), three results per page, observations cut at 128
tokens and 6 turns, a warm start of 256 expert episodes over 600 steps (about 15 minutes on two
shared cores; chosen on the 64 training goals it does not demonstrate, docs/RESULTS.md). Its
tokenizer keeps each product id whole (`atomic_strings`, `bpo_jax/text/bpe.py`). It is the
comparison's config too (`experiments/compare.py --config=experiments/configs/webshop.py:cpu`):
an env-step budget of four whole episodes, BPO's trees as in `base.compared`, and iterations that
start on the 64 goals the warm start does not demonstrate (`rollout.task_offset`).
"""

import ml_collections

from bpo_jax.training import config as config_lib
from experiments.configs import base


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = config_lib.default_config()
  c.env.name = "webshop"
  c.env.options = ml_collections.ConfigDict({
      "num_products": 1000,
      "catalogue_seed": 0,
      "goals_per_product": 2,
      "max_steps": 10,
  })
  c.env.num_train_tasks = 1600
  c.env.num_eval_tasks = 200
  c.env.max_turns = 10
  c.env.max_observation_tokens = 384
  # The longest expert action (a search with the instruction's words) takes about 32 tokens of
  # the shop's BPE.
  c.rollout.max_action_tokens = 40
  c.model.max_length = 4608
  c.rollout.max_tree_tokens = 16384
  c.eval.num_tasks = 100
  if arg == "cpu":
    return cpu(c)
  return base.variant(c, arg)


# `webshop.py:cpu`'s turn limit; a baseline's group holds the whole episodes that fit in the
# env-step budget, 4 * CPU_TURNS (`base.with_estimator`).
CPU_TURNS = 6


def cpu(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The small shop of the module docstring (`webshop.py:cpu`) with the comparison's settings
  (`base.compared`): 20 iterations of 8 goals from the first one the warm start does not
  demonstrate, held-out success every 5, checkpoints at 0, 10 and 20."""
  c.env.options.num_products = 200
  c.env.options.results_per_page = 3
  c.env.options.max_steps = CPU_TURNS
  c.env.num_train_tasks = 320
  c.env.num_eval_tasks = 40
  c.eval.num_tasks = 40
  c.env.max_turns = CPU_TURNS
  c.env.max_observation_tokens = 128
  c.model.max_length = 1152
  c.rollout.tasks_per_iteration = 8
  c.rollout.max_env_steps = 4 * CPU_TURNS
  c.warm_start.num_trajectories = 256
  c.warm_start.steps = 600
  c.warm_start.batch_size = 8
  c.rollout.task_offset = c.warm_start.num_trajectories
  base.compared(c)
  c.rollout.max_tree_tokens = 4608
  c.train.iterations = 20
  c.eval.every = 5
  c.checkpoint.every = 10
  return c
