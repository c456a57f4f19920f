"""benchmarks/pretrained_iteration.py: a configuration that cannot run is refused in one line
before the checkpoint is written (minutes at a real model's shape), not by a traceback after."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "pretrained_iteration.py")


@pytest.mark.parametrize("flags, expected", [
    (["--tasks=1"], "error: --config=rooms_qwen2_5 --tasks=1 --kv_page_size=0 for bpo: invalid "
                    "configuration: rollout.trunk_baseline = 'batch': needs at least 2 trees per "
                    "iteration"),
    (["--kv_page_size=-1"], "for bpo: invalid configuration: model.kv_page_size = -1: must be "
                            ">= 0"),
    (["--config=nope"], "error: --config=nope: no experiments/configs/nope.py"),
    (["--iterations=1"], "error: --iterations=1: must be >= 2"),
])
def test_a_bad_flag_is_one_line_before_any_compute(flags, expected):
  result = subprocess.run([sys.executable, SCRIPT, *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  errors = [line for line in result.stderr.splitlines() if "error:" in line]
  assert len(errors) == 1 and expected in errors[0], result.stderr
  assert "Traceback" not in result.stderr and "checkpoint written" not in result.stderr
