"""WebShop's released data, a Qwen2.5 checkpoint, one GPU: BPO trees in the real shop.

For a user with WebShop's released files on disk (`items_shuffle.json` or
`items_shuffle_1000.json`, `items_ins_v2.json` or `items_ins_v2_1000.json`, `items_human_ins.json`
in one directory) and a Hugging Face directory of Qwen2.5(-Instruct). The goals are the
release's, split as WebShop splits them (the first 500 test, the next 1,000 eval, the rest
train); the BM25 index is built once into `index_cache_dir` and memory-mapped by every worker.
Nothing is downloaded at run time.

    python experiments/run.py --config=experiments/configs/webshop_qwen2_5.py --workdir=WORKDIR \\
      --config.env.options.data_dir=WEBSHOP_DATA --config.model.checkpoint=QWEN_DIR
      [--config.env.options.data_size=1000] [--config.env.options.index_cache_dir=CACHE]

`data_size` "full" reads the 1.18M-product catalogue, "1000" the release's 1,000-product one.
Pages are WebShop's (ten results each), observations cut at 512 tokens, 15 turns. Low-rank
adapters on a bfloat16 model keep a 7B checkpoint on one GPU. BPO's trees and the env-step
budget (four whole episodes) are the comparison's (`base.pretrained`), so
`experiments/compare.py` runs its baselines from this file at matched compute.
"""

import ml_collections
from ml_collections import config_dict

from experiments.configs import base
from experiments.configs import webshop


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = webshop.get_config()
  # Typed placeholders (None until given) so that the command line can set them.
  c.env.options = ml_collections.ConfigDict({
      "data_dir": config_dict.placeholder(str), "data_size": "full",
      "index_cache_dir": config_dict.placeholder(str), "max_steps": 15,
      "results_per_page": 10})
  c.env.num_train_tasks = 10000
  c.env.num_eval_tasks = 500
  c.env.max_turns = 15
  c.env.num_workers = 8
  c.env.max_observation_tokens = 512
  c.rollout.max_action_tokens = 64
  c.rollout.tasks_per_iteration = 16
  c.model.max_length = 16384
  c.eval.num_tasks = 500
  base.pretrained(c)
  return base.variant(c, arg)
