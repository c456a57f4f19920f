"""RLOO on the built-in world (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/rooms_rloo.py --workdir=workdirs/rooms_rloo
    python experiments/run.py --config=experiments/configs/rooms_rloo.py:d2 --workdir=workdirs/rooms_rloo_d2  # difficulty 2
"""

from experiments.configs import base


def get_config(arg=None):
  return base.rooms_comparison("rloo", arg)
