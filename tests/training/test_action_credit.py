"""action_credit.py: each class of action's steps and Σ w·A in the batches a run's checkpoints
grow, by hand on a small tree, as the run logged them, and the sibling credit of a leave-one-out
baseline summing to 0 at every fork; bad flags in one line."""

import json
import os

import numpy as np
import pytest

from bpo_jax.sandboxes import registry
from bpo_jax.training import loop
from bpo_jax.training import workdir as workdir_lib
from experiments import action_credit
from tests.training.test_display import small_config


def test_classes_by_the_worlds_parser():
  parse = registry.get_action_syntax("frozenlake").parse_action
  assert action_credit.classify(" \n ", parse) == "empty"
  assert action_credit.classify("down", parse) == "parsed"
  assert action_credit.classify("xyz", parse) == "unparsed"


def test_credit_by_class_by_hand():
  # Tree 0: a step (parsed), then a fork into an empty action and a move, and an invalid node
  # (None) beside them that is no sibling; tree 1: one unparsed step.
  classes = [["parsed", "empty", "parsed", None], ["unparsed"]]
  parents = [[-1, 0, 0, 0], [-1]]
  advantages = np.array([[0.0, 1.0, -1.0, 7.0], [0.5, 0.0, 0.0, 0.0]])
  weights = np.array([[1.0, 0.5, 0.5, 1.0], [2.0, 0.0, 0.0, 0.0]])
  out = action_credit.credit_by_class(classes, parents, advantages, weights)
  assert out["empty"] == {"steps": 1, "with_sibling": 1, "credit": 0.5, "credit_with_sibling": 0.5}
  assert out["parsed"] == {"steps": 2, "with_sibling": 1, "credit": -0.5,
                           "credit_with_sibling": -0.5}
  assert out["unparsed"] == {"steps": 1, "with_sibling": 0, "credit": 1.0,
                             "credit_with_sibling": 0.0}


@pytest.fixture(name="run")
def _run(tmp_path, small_checkpoint):
  config = small_config(small_checkpoint)
  config.checkpoint.every = 1
  workdir = str(tmp_path / "bpo")
  loop.train(config, workdir, stop_after=1)  # checkpoints 0 and 1
  return workdir


@pytest.mark.slow
def test_the_batches_are_trainings_and_sibling_credit_sums_to_zero(run, tmp_path, capsys,
                                                                    monkeypatch):
  out = str(tmp_path / "credit.json")
  assert action_credit.main([f"--run={run}", f"--out={out}", "--estimators=bpo,rloo"]) == 0
  with open(out) as f:
    result = json.load(f)
  assert result["run_estimator"] == "bpo" and "commit" in result
  assert [(c["checkpoint"], c["estimator"]) for c in result["checkpoints"]] == [
      (0, "bpo"), (0, "rloo"), (1, "bpo"), (1, "rloo")]
  logged = {r["iteration"]: r for r in map(json.loads, open(os.path.join(run, "metrics.jsonl")))
            if r.get("phase") == "train"}
  first = result["checkpoints"][0]
  # Checkpoint 0's BPO batch is the one iteration 1 trained on: its nodes and success logged.
  assert first["as_logged"] is True and first["nodes"] == logged[1]["nodes"]
  assert result["checkpoints"][2]["as_logged"] is None  # no iteration 2 in the run
  for entry in result["checkpoints"]:
    classes = entry["classes"].values()
    assert sum(c["steps"] for c in classes) == entry["nodes"]
    # Leave-one-out baselines with equal weights among siblings: Σ_i A_i = Σ_i Q_i − Σ_i (S −
    # Q_i) / (K − 1) = 0 at each fork (BPO) and over each group's episodes (RLOO).
    assert abs(sum(c["credit_with_sibling"] for c in classes)) <= 1e-5
    assert sum(c["with_sibling"] for c in classes) >= 2
  # A full disk: one line, exit status 1, no file (and no partial one).
  def full(path, obj):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(workdir_lib, "write_json", full)
  capsys.readouterr()
  again = str(tmp_path / "again.json")
  assert action_credit.main([f"--run={run}", f"--out={again}", "--checkpoints=0"]) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"error: {again} not written: ") and err.count("\n") == 1
  assert "No space left on device" in err and not os.path.exists(again)


@pytest.mark.parametrize("flags, message", [
    ([], "error: the following arguments are required: --run, --out"),
    (["--run=RUN", "--out=o.json"], "error: --run=RUN: no run's record there (config.json)"),
    (["--run=REC", "--out=o.json", "--checkpoints=a"],
     "error: --checkpoints=a: must be comma-separated integers"),
    (["--run=REC", "--out=o.json", "--checkpoints=3"],
     "error: --checkpoints=3: REC keeps no checkpoint 3 (it keeps none)"),
    (["--run=REC", "--out=o.json", "--estimators=ppo"],
     "error: --estimators=ppo: unknown estimator 'ppo'"),
    (["--run=REC", "--out=o.json"], "error: --run=REC: keeps no checkpoint"),
    (["--run=REC", "--out=nowhere/o.json"], "error: --out=nowhere/o.json: no such directory"),
])
def test_bad_flags_in_one_line(flags, message, tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  os.makedirs("REC")
  with open("REC/config.json", "w") as f:
    json.dump({"rollout": {"estimator": "bpo"}}, f)
  with pytest.raises(SystemExit) as exit_:
    action_credit.main(flags)
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err == message and "\n" not in err
  assert not os.path.exists("o.json")
