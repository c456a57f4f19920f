"""GRPO on TextWorld (see base.py for the shared settings and the matched compute).

    python experiments/run.py --config=experiments/configs/textworld_grpo.py --workdir=workdirs/textworld_grpo
    python experiments/run.py --config=experiments/configs/textworld_grpo.py:cpu --workdir=workdirs/textworld_grpo_cpu  # generated games, base.TEXTWORLD_CPU_COMMAND
"""

from experiments.configs import base


def get_config(arg=None):
  return base.textworld_comparison("grpo", arg)
