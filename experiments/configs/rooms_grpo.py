"""GRPO on the built-in world (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/rooms_grpo.py --workdir=workdirs/rooms_grpo
"""

from experiments.configs import base


def get_config(arg=None):
  return base.variant(base.compared(base.rooms("grpo")), arg)
