"""Quickstart: BPO on the built-in world with a tiny from-scratch model, on a laptop CPU.

A byte-level BPE tokenizer trained on the world's text (chat turns) and a ~0.6M-parameter
decoder; a supervised warm start on expert episodes of easy training tasks, then BPO iterations; the held-out success
rate (greedy, with a 95% Wilson interval) is printed before and after.

    python experiments/run.py --config=experiments/configs/quickstart.py --workdir=workdirs/quickstart
"""

from experiments.configs import base


def get_config(arg=None):
  return base.variant(base.rooms("bpo"), arg)
