"""experiments/estimator_demo.py: the demo's exact expected gradient is the true policy gradient
(up to float32 rounding over the enumerated trees), its figures are saved, and a bad override is
one line with exit status 2."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from experiments import estimator_demo  # pylint: disable=g-import-not-at-top,wrong-import-position

DEMO = os.path.join(ROOT, "experiments", "estimator_demo.py")


@pytest.mark.slow
def test_the_demo_enumerates_the_trees_and_saves_its_figures(tmp_path, capsys):
  settings = estimator_demo.settings()
  settings.num_sampled_trees, settings.max_enumerated_groups = 50, 100
  summary = estimator_demo.run(settings, str(tmp_path))
  # Depth 3, two actions, at most 2 forks of 2: 60 possible trees under the entropy rule.
  assert summary["num_trees_enumerated"] == 60
  # The expected gradient is a probability-weighted sum over the 60 trees, each rounded in
  # float32: at most one rounding per tree at a magnitude below 1.
  assert summary["exact_gradient_max_error"] <= 60 * np.finfo(np.float32).eps
  with open(tmp_path / "summary.json", encoding="utf-8") as f:
    assert json.load(f) == json.loads(json.dumps(summary))
  assert "Total gradient variance, exact" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--config.mdp.depth=3"], "error: mdp.depth: unknown key; known keys under 'mdp': "),
    (["--config.mdp.horizon=x"], "error: mdp.horizon = 'x': must be of type int"),
    ([], "error: --workdir is required"),
])
@pytest.mark.slow
def test_bad_flags_one_line_exit_2(tmp_path, args, message):
  workdir = [f"--workdir={tmp_path / 'w'}"] if args else []
  result = subprocess.run([sys.executable, DEMO, *workdir, *args], capture_output=True,
                          text=True, cwd=ROOT, check=False)
  assert result.returncode == 2
  assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "w").exists()
