"""TextWorld on the repository's fixture games, played through Jericho (extra `textworld`).

The fixture games, 8 turns, observations cut at 96 tokens, an env-step budget of two whole
episodes (`base.textworld`). `textworld_cpu.py` is the comparison on generated games.

    python experiments/run.py --config=experiments/configs/textworld.py --workdir=workdirs/textworld
"""

from experiments.configs import base


def get_config(arg=None):
  return base.variant(base.textworld("bpo"), arg)
