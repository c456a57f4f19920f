"""experiments/readme_results.py: the README's Results table from the testbed's and the rooms
regime's result files (the two reports' fixtures), every figure computed, none typed."""

import glob
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import readme_results  # noqa: E402
from tests.testbed import test_testbed_report as testbed  # noqa: E402
from tests.training import test_regime_report as regime  # noqa: E402


@pytest.mark.slow
def test_the_table_is_computed_from_the_files(tmp_path):
  testbed._fixture(str(tmp_path / "testbed"))  # pylint: disable=protected-access
  regime._fixture(str(tmp_path / "regime"))  # pylint: disable=protected-access
  # A second regime: the same files, on another world with one seed's BPO final success lower.
  regime._fixture(str(tmp_path / "regime2"))  # pylint: disable=protected-access
  for path in glob.glob(str(tmp_path / "regime2" / "runs" / "*" / "seed*" / "config.json")):
    config = json.loads(open(path, encoding="utf-8").read())
    config["env"]["name"] = "frozenlake"
    open(path, "w", encoding="utf-8").write(json.dumps(config))
  summary_path = tmp_path / "regime2" / "runs" / "bpo" / "seed2" / "summary.json"
  summary = json.loads(summary_path.read_text())
  summary["eval_end"]["success_rate"] = 0.5
  summary_path.write_text(json.dumps(summary))
  # Its claim 2 measured on seeds 0 and 1 only: the variance cell says so.
  for m in ("bpo", "grpo", "rloo"):
    os.remove(tmp_path / "regime2" / "runs" / m / "seed2" / "gradient_variance.json")
  doc = tmp_path / "README.md"
  doc.write_text(f"# R\n\n{readme_results.BEGIN}\nstale\n{readme_results.END}\nbelow\n")
  args = [f"--testbed={tmp_path / 'testbed'}",
          f"--regime={tmp_path / 'regime'},{tmp_path / 'regime2'}", f"--doc={doc}"]
  assert readme_results.main(args + ["--check"]) == 1
  assert readme_results.main(args) == 0
  assert readme_results.main(args + ["--check"]) == 0
  lines = doc.read_text().splitlines()
  assert lines[:3] == ["# R", "", readme_results.BEGIN] and lines[-2:] == [readme_results.END,
                                                                           "below"]
  # The testbed world (share 0.25, 3 seeds): BPO 0.6 ± 4.302653 · 0.1 / √3, GRPO 0.5 ± the same,
  # paired 0.1 on every seed; equal variances; both reach 0.25 + 0.9 · 0.25 after update 2.
  assert lines[5] == ("| testbed, share 0.25 | 3 | 0.600 [0.352, 0.848] | GRPO 0.500 "
                      "[0.252, 0.748] | 0.100 [0.100, 0.100] | 1.00 [1.00, 1.00] | 2, 2 |")
  # The regime (3 seeds): GRPO (0.5, 0.5, 0.6) the best baseline; BPO − GRPO 0.1, 0.2, 0.2;
  # BPO's variance half RLOO's; BPO stays above GRPO's final 0.533 from update 1, GRPO from 2.
  assert lines[6] == ("| rooms, weak warm start, 512 tasks | 3 | 0.700 [0.452, 0.948] "
                      "| GRPO 0.533 [0.390, 0.677] | 0.167 [0.023, 0.310] | 0.50 [0.50, "
                      "0.50] | 1, 2 |")
  # The second: BPO (0.6, 0.7, 0.5), mean 0.6, sd 0.1; BPO − GRPO 0.1, 0.2, -0.1, mean 0.0667,
  # sd 0.1528, ± 4.302653 · 0.1528 / √3 = 0.3795; BPO's mean curve ends at 0.6 > 0.533 and
  # stays from update 1 (0.3667 + 0.75 · 0.2333 = 0.5417); BPO's variance half RLOO's on seeds
  # 0 and 1.
  assert lines[7] == ("| frozenlake, weak warm start, 512 tasks | 3 | 0.600 [0.352, 0.848] "
                      "| GRPO 0.533 [0.390, 0.677] | 0.067 [-0.313, 0.446] | 0.50 [0.50, "
                      "0.50] (2 seeds) | 1, 2 |")


def test_missing_files_are_one_line_exit_2(tmp_path, capsys):
  doc = tmp_path / "README.md"
  doc.write_text(f"{readme_results.BEGIN}\n{readme_results.END}\n")
  assert readme_results.main([f"--testbed={tmp_path}", f"--doc={doc}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: readme_results.py: ValueError:") and err.count("\n") == 1
  assert doc.read_text() == f"{readme_results.BEGIN}\n{readme_results.END}\n"


@pytest.mark.slow
def test_the_committed_docs_are_what_the_committed_files_give():
  """README's Results and RESULTS.md's regime sections, regenerated from results/."""
  assert readme_results.main(["--check"]) == 0
  for name in readme_results.REGIMES:
    assert regime.regime_report.main(
        ["--check", f"--results={os.path.join(readme_results.REPO, 'results', name)}"]) == 0
