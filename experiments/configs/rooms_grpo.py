"""GRPO on the built-in world (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/rooms_grpo.py --workdir=workdirs/rooms_grpo
    python experiments/run.py --config=experiments/configs/rooms_grpo.py:d2 --workdir=workdirs/rooms_grpo_d2  # difficulty 2
"""

from experiments.configs import base


def get_config(arg=None):
  return base.rooms_comparison("grpo", arg)
