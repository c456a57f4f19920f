"""Rooms at difficulty 2 from a Qwen2.5 checkpoint, one GPU: the comparison of `rooms_d2.py`.

For a user with a Hugging Face directory of Qwen2.5(-Instruct) (or Llama 3.x: any checkpoint of
a supported family with its chat template). The world, its turns, the env-step budget of four
whole episodes and BPO's trees are `rooms_d2.py`'s; the model is the checkpoint with rank-16
adapters in bfloat16 and no warm start (`base.pretrained`), and the context has room for a
tokenizer not fitted to the world's words. Nothing is downloaded at run time.

    python experiments/run.py --config=experiments/configs/rooms_qwen2_5.py --workdir=WORKDIR \\
      --config.model.checkpoint=QWEN_DIR
    python experiments/compare.py --config=experiments/configs/rooms_qwen2_5.py --seeds=5 \\
      --config.model.checkpoint=QWEN_DIR     # BPO, GRPO, RLOO and GiGPO at matched compute
"""

import ml_collections

from experiments.configs import base
from experiments.configs import rooms_d2


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = rooms_d2.get_config()
  c.env.max_observation_tokens = 96  # about 40 words, 50 tokens of Qwen2.5's tokenizer
  c.model.max_length = 2048
  c.rollout.max_action_tokens = 16
  base.pretrained(c)
  return base.variant(c, arg)
