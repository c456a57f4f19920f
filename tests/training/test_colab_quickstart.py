"""colab/quickstart.py, the notebook's paired script: the pairing and its check, the first
cell's checkout and install from outside the repository, and the script on its tiny setting."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "colab", "quickstart.py")
sys.path.insert(0, os.path.join(ROOT, "colab"))

import pair_notebook  # noqa: E402  pylint: disable=g-import-not-at-top

PLACEHOLDER = 'REPO_URL = "https://github.com/YOUR-ORG/bpo_jax.git"'


def test_notebook_is_in_sync_with_its_script():
  assert pair_notebook.is_in_sync(SCRIPT), "run `python colab/pair_notebook.py`"
  with open(pair_notebook.notebook_path(SCRIPT), encoding="utf-8") as f:
    notebook = json.load(f)
  kinds = [c["cell_type"] for c in notebook["cells"]]
  assert kinds.count("code") >= 4 and kinds[0] == "markdown"
  assert [c["id"] for c in notebook["cells"]] == [f"{k}-{i}" for i, k in enumerate(kinds)]
  assert (notebook["nbformat"], notebook["nbformat_minor"]) == (4, 5)  # ids need 4.5


def test_split_cells_by_hand():
  source = "# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n\n# %%\nprint(x)\n"
  assert pair_notebook.split_cells(source) == [
      ("markdown", "# Title\n\ntext"), ("code", "x = 1"), ("code", "print(x)")]


def test_check_mode_finds_a_stale_notebook_and_writes_nothing(tmp_path, capsys):
  script = tmp_path / "demo.py"
  script.write_text("# %% [markdown]\n# # Demo\n\n# %%\nx = 1\n")
  notebook = tmp_path / "demo.ipynb"
  assert pair_notebook.main(["--check", str(script)]) == 1  # no notebook yet
  assert not notebook.exists()
  assert pair_notebook.main([str(script)]) == 0
  assert pair_notebook.main(["--check", str(script)]) == 0
  script.write_text("# %% [markdown]\n# # Demo\n\n# %%\nx = 2\n")
  before = notebook.read_text()
  assert pair_notebook.main(["--check", str(script)]) == 1
  assert notebook.read_text() == before
  assert f"{notebook} differs from its script" in capsys.readouterr().err
  assert pair_notebook.main(["--check", str(tmp_path / "missing.py")]) == 2


def first_code_cell() -> str:
  with open(SCRIPT, encoding="utf-8") as f:
    cells = pair_notebook.split_cells(f.read())
  return next(text for kind, text in cells if kind == "code")


def run_first_cell(cwd, source: str, extra: str = ""):
  """The first cell run by a fresh interpreter in `cwd`, outside the checkout, with the package
  not on PYTHONPATH, a folder named like it in `cwd` (the namespace trap) and no install."""
  os.makedirs(os.path.join(cwd, "bpo_jax"), exist_ok=True)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(QUICKSTART_SKIP_INSTALL="1")
  env.pop("QUICKSTART_CHECKOUT", None)
  env.pop("QUICKSTART_REPO_URL", None)
  return subprocess.run([sys.executable, "-c", source + "\n" + extra], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)


def test_first_cell_without_a_repository_address_names_the_setting(tmp_path):
  result = run_first_cell(tmp_path, first_code_cell())
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      "RuntimeError: set REPO_URL in this cell to the repository's git address, then run it "
      "again")


@pytest.mark.slow
def test_first_cell_clones_changes_directory_and_imports_from_the_clone(tmp_path):
  if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
    pytest.skip("needs git and a git checkout to clone")
  source = first_code_cell()
  assert PLACEHOLDER in source
  source = source.replace(PLACEHOLDER, f"REPO_URL = {ROOT!r}")
  result = run_first_cell(tmp_path, source, "import bpo_jax, experiments.configs.base\n"
                          "print('cwd', os.getcwd()); print('package', bpo_jax.__file__)")
  assert result.returncode == 0, result.stderr[-2000:]
  clone = os.path.join(str(tmp_path), os.path.basename(ROOT))
  lines = result.stdout.splitlines()
  assert f"Installed from {clone}; no runtime restart needed." in lines
  assert f"cwd {clone}" in lines
  assert f"package {os.path.join(clone, 'bpo_jax', '__init__.py')}" in lines


@pytest.mark.slow
def test_quickstart_script_runs_on_the_tiny_setting_outside_the_checkout(tmp_path):
  env = dict(os.environ, QUICKSTART_TINY="1", QUICKSTART_WORKDIR=str(tmp_path / "runs"),
             QUICKSTART_CHECKOUT=ROOT, QUICKSTART_SKIP_INSTALL="1")
  result = subprocess.run([sys.executable, SCRIPT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  for estimator in ("bpo", "grpo"):
    assert f"{estimator.upper():4s} held-out success" in out
    assert f"{estimator.upper():4s} gradient-norm variance across micro-batches: mean" in out
    records = [json.loads(line) for line in open(tmp_path / "runs" / estimator / "metrics.jsonl")]
    assert [r["iteration"] for r in records if r["phase"] == "train"] == [1, 2]
  # Matched spend: GRPO's env steps per task within 10% of BPO's, and the printed ratio is the
  # one the runs' metrics give.
  spend = {}
  for estimator in ("bpo", "grpo"):
    records = [json.loads(line) for line in open(tmp_path / "runs" / estimator / "metrics.jsonl")]
    train = [r for r in records if r["phase"] == "train"]
    spend[estimator] = sum(r["env_steps"] for r in train) / len(train)  # 2 tasks an iteration
  ratio = spend["grpo"] / spend["bpo"]
  assert abs(ratio - 1) <= 0.1, spend
  line = next(l for l in out.splitlines() if l.startswith("GRPO's spend per task as a multiple"))
  assert line.startswith(f"GRPO's spend per task as a multiple of BPO's: env steps {ratio:.2f}, ")
  assert "NOT matched" not in line
  assert (tmp_path / "runs" / "curves.png").exists()
  # The drawn tree: its header, a root line, then steps with their rewards and advantages.
  assert "iteration 1, tree " in out and "fork threshold 0 nats" in out
  tree_lines = out[out.index("[root] "):].splitlines()
  assert tree_lines[0].startswith("[root] Goal: put the ")
  assert any(line.startswith(("├─ ", "└─ ")) and " r=" in line and " A=" in line
             for line in tree_lines[1:])
