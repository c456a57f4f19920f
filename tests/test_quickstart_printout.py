"""scripts/quickstart_printout.py: the README's main command, and its printout written or checked
from a run's output (the run itself takes minutes and is not repeated here)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "quickstart_printout.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import quickstart_printout  # noqa: E402  pylint: disable=g-import-not-at-top

README = ("intro\n\n<!-- main-command --> pip install -e . && python experiments/run.py "
          "--config=experiments/configs/quickstart.py --workdir=workdirs/quickstart\n\n"
          "printed\n\n```\nheld-out success, untrained model: 0.000\n```\n\n```\nother\n```\n")


def test_main_command_is_the_python_part_of_the_marked_line():
  assert quickstart_printout.main_command(README) == [
      "python", "experiments/run.py", "--config=experiments/configs/quickstart.py",
      "--workdir=workdirs/quickstart"]
  assert quickstart_printout.with_workdir(
      ["python", "run.py", "--workdir=a", "--x=1"], "/tmp/w") == [
          "python", "run.py", "--x=1", "--workdir=/tmp/w"]


def test_printout_replaces_the_first_block_after_the_command_only():
  stdout = ("I1205 log line\nheld-out success, untrained model: 0.016 [0.003, 0.083]\n"
            "held-out success, after iteration 60: 0.984 [0.917, 0.997]\n")
  block = quickstart_printout.printout(stdout)
  assert block == ("held-out success, untrained model: 0.016 [0.003, 0.083]\n"
                   "held-out success, after iteration 60: 0.984 [0.917, 0.997]")
  updated = quickstart_printout.replace_block(README, block)
  assert updated == README.replace("held-out success, untrained model: 0.000", block)
  assert updated.endswith("```\nother\n```\n")


def test_the_readme_matches_its_recorded_run_and_check_names_a_difference(tmp_path):
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  start = readme.index(quickstart_printout.MARKER)
  opening = readme.index("```\n", start) + 4
  block = readme[opening:readme.index("\n```", opening)]
  assert block.startswith("held-out success, untrained model: ")
  output = tmp_path / "stdout.txt"
  output.write_text(block + "\n")
  check = [sys.executable, SCRIPT, "--check", f"--output={output}"]
  assert subprocess.run(check, capture_output=True, text=True).returncode == 0
  output.write_text(block[:-1] + ("0" if block[-1] != "0" else "1") + "\n")
  result = subprocess.run(check, capture_output=True, text=True)
  assert result.returncode == 1 and "printout differs" in result.stderr
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    assert f.read() == readme  # --check writes nothing
  missing = subprocess.run(check[:-1] + [f"--output={tmp_path / 'none'}"], capture_output=True,
                           text=True)
  assert missing.returncode == 2 and "no such file" in missing.stderr
