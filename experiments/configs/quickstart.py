"""Quickstart: BPO on the built-in world with a tiny from-scratch model, on a laptop CPU.

A byte-level BPE tokenizer trained on the world's text (chat turns) and a ~0.6M-parameter
decoder; a supervised warm start on expert episodes of easy training tasks, then BPO iterations; the held-out success
rate (greedy, with a 95% Wilson interval) is printed before and after. The library defaults as
they are: BPO's trees take the default env-step budget (`rooms.py` is the same world with the
budget the baselines are matched to).

    python experiments/run.py --config=experiments/configs/quickstart.py --workdir=workdirs/quickstart
"""

from bpo_jax.training import config as config_lib
from experiments.configs import base


def get_config(arg=None):
  return base.variant(config_lib.default_config(), arg)
