"""RLOO on TextWorld (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/textworld_rloo.py --workdir=workdirs/textworld_rloo
    python experiments/run.py --config=experiments/configs/textworld_rloo.py:cpu --workdir=workdirs/textworld_rloo_cpu  # generated games, base.TEXTWORLD_CPU_COMMAND
"""

from experiments.configs import base


def get_config(arg=None):
  return base.textworld_comparison("rloo", arg)
