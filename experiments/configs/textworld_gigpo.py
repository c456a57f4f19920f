"""GIGPO on TextWorld (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/textworld_gigpo.py --workdir=workdirs/textworld_gigpo
    python experiments/run.py --config=experiments/configs/textworld_gigpo.py:cpu --workdir=workdirs/textworld_gigpo_cpu  # generated games, base.TEXTWORLD_CPU_COMMAND
"""

from experiments.configs import base


def get_config(arg=None):
  return base.textworld_comparison("gigpo", arg)
