"""WebShop, ALFWorld and SWE each run two iterations from a tiny random HF checkpoint (its own
BPE tokenizer with the family's chat template) through `run.py`: WebShop from a Qwen2 one,
ALFWorld and SWE from Llama 3.2 ones (both families train and export on rooms in
test_reference_lora_export.py; the worlds differ in their text, not in the family's code).

SWE's budgets are cut for the test (3 turns, observations, actions, context): its packed rows
otherwise reach ~8k tokens; a path of 3 turns is at most 1,420 tokens, so the rows stay within
the 2,048-token bucket and the test takes seconds per step.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from test_reference_lora_export import ROOT, RUN, _hf_checkpoint  # pylint: disable=g-bad-import-order

# Per world, overrides that keep a CPU run small (the rest is the config's `:tiny`).
SMALL = {
    "webshop": [],
    # The games a run plays (2 iterations of 2 tasks; 2 held-out), generated at the start.
    "alfworld": ["--config.env.num_train_tasks=4", "--config.env.num_eval_tasks=2",
                 "--config.eval.num_tasks=2"],
    "swe": ["--config.env.max_turns=3", "--config.env.max_observation_tokens=128",
            "--config.rollout.max_action_tokens=64", "--config.model.max_length=1536",
            "--config.rollout.max_tree_tokens=2048"],
}


QWEN2 = ("qwen2", "qwen2", "qwen2_5.jinja")
LLAMA3 = ("llama3.2", "llama3", "llama3_1.jinja")


@pytest.mark.slow
@pytest.mark.parametrize("world,variant,family,template", [
    ("webshop", *QWEN2), ("alfworld", *LLAMA3), ("swe", *LLAMA3)])
def test_tiny_worlds_train_from_a_qwen2_or_llama3_checkpoint(tmp_path, world, variant, family,
                                                             template):
  checkpoint = _hf_checkpoint(tmp_path / "hf", variant, family, template)
  workdir = tmp_path / "run"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, RUN, f"--config={ROOT}/experiments/configs/{world}.py:tiny",
       f"--workdir={workdir}", f"--config.model.checkpoint={checkpoint}",
       "--config.warm_start.num_trajectories=0", "--config.log.progress_bar=false",
       *SMALL[world]],
      cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(l) for l in open(workdir / "metrics.jsonl")]
  train = [r for r in records if r.get("phase") == "train"]
  assert [r["iteration"] for r in train] == [1, 2]
  for r in train:
    # Trees grown through the family's chat template: sampled actions, steps in the world ...
    assert r["leaves"] >= 1 and r["num_action_tokens"] > 0 and r["env_steps"] >= r["leaves"], r
    # ... and an update taken on them. The random checkpoint's returns are all equal, so the
    # advantages and the gradient are zero: the update's arithmetic is checked elsewhere
    # (test_reference_lora_export.py).
    assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and not r.get("skipped"), r
