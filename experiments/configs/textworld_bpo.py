"""BPO on TextWorld (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/textworld_bpo.py --workdir=workdirs/textworld_bpo
"""

from experiments.configs import base


def get_config(arg=None):
  return base.variant(base.textworld("bpo"), arg)
