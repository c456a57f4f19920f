"""BPO on the built-in world (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/rooms_bpo.py --workdir=workdirs/rooms_bpo
    python experiments/run.py --config=experiments/configs/rooms_bpo.py:d2 --workdir=workdirs/rooms_bpo_d2  # difficulty 2
"""

from experiments.configs import base


def get_config(arg=None):
  return base.rooms_comparison("bpo", arg)
