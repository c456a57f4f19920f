"""Each world's config trains from scratch in its `:tiny` version: the BPE tokenizer is trained on
the world's text and saved, the budgets fit its chat format, the warm start and two iterations
of BPO run, and the held-out evaluation reports.

WebShop, ALFWorld (generated games) and SWE (the shipped tasks; in worker processes, confined
where the host allows namespaces): the worlds with long contexts and actions (SWE's trees pack
into rows longer than the default buckets, `translate.row_buckets`).
"""

import importlib
import json
import os

import pytest

from bpo_jax import text
from bpo_jax.sandboxes.swe import confinement
from bpo_jax.training import loop

SWE_OPTIONS = {} if confinement.namespaces_available() else {"confinement": "rlimits-only"}


def _tiny(name, tmp_path):
  config = importlib.import_module(f"experiments.configs.{name}").get_config("tiny")
  if name == "alfworld":
    config.env.options.cache_dir = str(tmp_path / "games")
    config.env.num_train_tasks, config.env.num_eval_tasks = 4, 2
    config.eval.num_tasks = 2
    config.warm_start.num_trajectories = 4
  if name == "swe":
    config.env.options.update(SWE_OPTIONS)
  # One device, as on a laptop: the mesh has its own tests (test_mesh_loop.py).
  config.scale.num_devices = 1
  return config


@pytest.mark.slow
@pytest.mark.parametrize("name", ["webshop", "alfworld", "swe"])
def test_tiny_world_config_trains_two_iterations(name, tmp_path):
  config = _tiny(name, tmp_path)
  workdir = str(tmp_path / "run")
  summary = loop.train(config, workdir)
  assert summary["iterations"] == 2
  assert os.path.isfile(os.path.join(workdir, text.TOKENIZER_DIR, "tokenizer.json"))
  _, fmt = text.load_format(os.path.join(workdir, text.TOKENIZER_DIR),
                            max_observation_tokens=config.env.max_observation_tokens)
  bound = fmt.path_token_bound(config.env.max_turns, config.rollout.max_action_tokens)
  assert bound <= config.model.max_length
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  iterations = [r for r in records if r.get("phase") == "train"]
  assert [r["iteration"] for r in iterations][-2:] == [1, 2], records[-3:]
  for stage in ("init", "end"):
    e = summary[f"eval_{stage}"]
    assert e["num_tasks"] == config.eval.num_tasks
    assert 0.0 <= e["success_low"] <= e["success_rate"] <= e["success_high"] <= 1.0
