"""A configuration saved as JSON (`config_lib.to_plain`), as a config file run.py takes:

    python experiments/run.py --config=experiments/json_config.py:results/rooms_bpo/runs/grpo/seed0.json \
        --workdir=results/rooms_bpo/runs/grpo/seed0

`compare.py` writes each of its runs' configurations so and trains them with this command.
"""

import json

import ml_collections


def get_config(path=None) -> ml_collections.ConfigDict:
  if not path:
    raise ValueError("json_config.py needs the JSON file: --config=experiments/json_config.py:FILE")
  with open(path, encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))
