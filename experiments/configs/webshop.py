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

`webshop_cpu.py` is the small shop the comparison trains on a CPU.
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
  return base.variant(c, arg)

