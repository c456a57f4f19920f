"""The built-in world at difficulty 1: the rooms comparison of BPO against GRPO, RLOO and GiGPO.

The quickstart's world and model (CPU, no downloads) in the comparison's settings
(`base.compared`): BPO's trees in the env-step budget of four whole episodes plus the slack
only a tree can use (`base.ROOMS_ENV_STEPS`), 30 iterations, evaluated and checkpointed every 10.

    python experiments/run.py --config=experiments/configs/rooms.py --workdir=workdirs/rooms
    python experiments/compare.py --config=experiments/configs/rooms.py --seeds=5 --out=results/rooms_bpo
"""

from experiments.configs import base


def get_config(arg=None):
  return base.variant(base.compared(base.rooms("bpo")), arg)
