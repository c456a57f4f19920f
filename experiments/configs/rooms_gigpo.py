"""GIGPO on the built-in world (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/rooms_gigpo.py --workdir=workdirs/rooms_gigpo
    python experiments/run.py --config=experiments/configs/rooms_gigpo.py:d2 --workdir=workdirs/rooms_gigpo_d2  # difficulty 2
"""

from experiments.configs import base


def get_config(arg=None):
  return base.rooms_comparison("gigpo", arg)
