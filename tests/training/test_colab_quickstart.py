"""colab/quickstart.py, the notebook's paired script, on its tiny setting; and the pairing."""

import json
import os
import subprocess
import sys
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "colab"))

import pair_notebook  # noqa: E402  pylint: disable=g-import-not-at-top


def test_notebook_is_in_sync_with_its_script():
  with open(os.path.join(ROOT, "colab", "quickstart.py"), encoding="utf-8") as f:
    expected = pair_notebook.notebook_from_script(f.read())
  with open(os.path.join(ROOT, "colab", "quickstart.ipynb"), encoding="utf-8") as f:
    notebook = json.load(f)
  assert notebook == expected, "run `python colab/pair_notebook.py` after editing the script"
  kinds = [c["cell_type"] for c in notebook["cells"]]
  assert kinds.count("code") >= 4 and kinds[0] == "markdown"


def test_split_cells_by_hand():
  source = "# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n\n# %%\nprint(x)\n"
  assert pair_notebook.split_cells(source) == [
      ("markdown", "# Title\n\ntext"), ("code", "x = 1"), ("code", "print(x)")]


@pytest.mark.slow
def test_quickstart_script_runs_on_the_tiny_setting(tmp_path):
  env = dict(os.environ, QUICKSTART_TINY="1", QUICKSTART_WORKDIR=str(tmp_path))
  result = subprocess.run([sys.executable, os.path.join("colab", "quickstart.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  for estimator in ("bpo", "grpo"):
    assert f"{estimator}: held-out success" in out
    records = [json.loads(line) for line in open(tmp_path / estimator / "metrics.jsonl")]
    assert [r["iteration"] for r in records if r["phase"] == "train"] == [1, 2]
  # The curves, as a figure when matplotlib is there, else as a table.
  assert (tmp_path / "curves.png").exists() or "bpo:success" in out
  # The drawn tree: a root line, then steps with their rewards and advantages.
  tree_lines = out[out.index("[root] "):].splitlines()
  assert tree_lines[0].startswith("[root] Goal: put the ")
  assert any(line.startswith(("├─ ", "└─ ")) and " r=" in line and " A=" in line
             for line in tree_lines[1:])
