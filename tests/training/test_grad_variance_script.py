"""experiments/grad_variance.py: the gradient variance of a comparison's finished runs, at their
own checkpoints or every method at one estimator's, saved beside the runs and aggregated into
the comparison's results; bad flags and runs not trained are refused in one line.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from experiments import grad_variance  # pylint: disable=g-import-not-at-top,wrong-import-position

COMPARE = os.path.join(ROOT, "experiments", "compare.py")
GRAD_VARIANCE = os.path.join(ROOT, "experiments", "grad_variance.py")
ROOMS_TINY = os.path.join(ROOT, "experiments", "configs", "rooms.py") + ":tiny"


def _run(script, *args):
  return subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                        cwd=ROOT, check=False)


# The comparison both measurements read: BPO's one run, two iterations with a checkpoint at
# each (checkpoints 0, 1, 2; the run keeps them all).
COMMON = [f"--config={ROOMS_TINY}", "--seeds=1", "--config.warm_start.num_trajectories=0",
          "--config.eval.num_tasks=1", "--config.checkpoint.every=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("compare") / "out")
  result = _run(COMPARE, *COMMON, "--estimators=bpo", f"--out={out}")
  assert result.returncode == 0, result.stderr[-2000:]
  return out


def _copy(trained, tmp_path) -> str:
  """A copy of the trained comparison that a test may write into."""
  out = str(tmp_path / "out")
  shutil.copytree(trained, out)
  return out


@pytest.mark.slow
def test_the_variance_is_measured_at_each_runs_kept_checkpoints(trained, tmp_path):
  # M = 4 draws keep the test fast; a measurement uses --draws >= 16.
  out = _copy(trained, tmp_path)
  args = [*COMMON, "--estimators=bpo", f"--out={out}"]
  first = _run(GRAD_VARIANCE, *args, "--draws=4")
  assert first.returncode == 0, first.stderr[-2000:]
  assert "bpo seed 0: gradient variance at checkpoints [0, 1, 2] (4 draws)" in first.stdout
  saved = json.load(open(os.path.join(out, "runs", "bpo", "seed0.json"), encoding="utf-8"))
  assert saved["checkpoint"]["keep"] == 3
  measured = json.load(open(os.path.join(out, "runs", "bpo", "seed0", "gradient_variance.json"),
                            encoding="utf-8"))
  assert measured["draws"] == 4 and [p["step"] for p in measured["checkpoints"]] == [0, 1, 2]
  # What made it: the code's commit and the command.
  assert len(measured["provenance"]["commit"]) == 40
  assert measured["provenance"]["command"] == "python experiments/grad_variance.py " + " ".join(
      [*args, "--draws=4"])
  for p in measured["checkpoints"]:
    assert p["draws"] == 4 and p["variance"] >= 0 and p["env_steps_per_task"] > 0
  results = json.load(open(os.path.join(out, "results.json"), encoding="utf-8"))
  v = results["methods"]["bpo"]["gradient_variance"]
  assert v["draws"] == 4 and v["seeds"] == 1
  assert v["variance"]["mean"] == pytest.approx(
      sum(p["variance"] for p in measured["checkpoints"]) / 3, rel=1e-12)
  assert "Claim 2" in open(os.path.join(out, "results.md"), encoding="utf-8").read()
  second = _run(GRAD_VARIANCE, *args, "--draws=4")
  assert second.returncode == 0, second.stderr[-2000:]
  assert "bpo seed 0: gradient variance measured, skipped" in second.stdout


@pytest.mark.slow
def test_every_method_is_measured_at_one_runs_parameters(trained, tmp_path):
  # --params=bpo: only BPO's run is trained; GRPO is measured at its checkpoints.
  out = _copy(trained, tmp_path)
  args = [*COMMON, "--estimators=bpo,grpo", "--draws=2", "--params=bpo"]
  result = _run(GRAD_VARIANCE, *args, f"--out={out}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "grpo seed 0: gradient variance at checkpoints [0, 1, 2] (2 draws)" in result.stdout
  assert os.path.exists(os.path.join(out, "runs", "bpo", "seed0", "summary.json"))
  assert os.listdir(os.path.join(out, "runs", "grpo", "seed0")) == ["gradient_variance.json"]
  results = json.load(open(os.path.join(out, "results.json"), encoding="utf-8"))
  assert list(results["methods"]) == ["bpo"]
  assert results["methods"]["bpo"]["gradient_variance"] is None
  shared = results["claim_2_shared"]
  assert shared["params_of"] == "bpo" and sorted(shared["methods"]) == ["bpo", "grpo"]
  for name in ("bpo", "grpo"):
    saved = json.load(open(os.path.join(out, "runs", name, "seed0", "gradient_variance.json"),
                           encoding="utf-8"))
    assert saved["params_of"] == "bpo" and [p["step"] for p in saved["checkpoints"]] == [0, 1, 2]
    v = shared["methods"][name]["gradient_variance"]
    assert v["variance"]["mean"] == pytest.approx(
        sum(p["variance"] for p in saved["checkpoints"]) / 3, rel=1e-12)
  assert "every method at the same parameters" in open(os.path.join(out, "results.md"),
                                                       encoding="utf-8").read()
  # Measured again at the checkpoints of that directory's BPO run (--params_from): nothing
  # trains, and the same configuration gives the same variances to the last bit; with --gram
  # each checkpoint keeps its draws' Gram matrix, whose variance is Welford's.
  again = str(tmp_path / "again")
  result = _run(GRAD_VARIANCE, *args, f"--out={again}", f"--params_from={out}", "--gram")
  assert result.returncode == 0, result.stderr[-2000:]
  assert sorted(os.listdir(os.path.join(again, "runs", "bpo", "seed0"))) == [
      "gradient_variance.json"]
  rerun = json.load(open(os.path.join(again, "results.json"), encoding="utf-8"))
  assert rerun["claim_2_shared"]["methods"] == shared["methods"]
  assert list(rerun["methods"]) == ["bpo"]  # the table's rows: the other directory's runs
  saved = json.load(open(os.path.join(again, "runs", "grpo", "seed0", "gradient_variance.json"),
                         encoding="utf-8"))
  for point in saved["checkpoints"]:
    gram = np.asarray(point["gram"])
    assert gram.shape == (2, 2)
    # Two draws: Σ‖g − ḡ‖² = (G00 + G11 − 2 G01) / 2, in float32 within a few ulps of trace G.
    assert abs((gram[0, 0] + gram[1, 1] - 2 * gram[0, 1]) / 2 - point["variance"]) <= (
        8 * np.finfo(np.float32).eps * np.trace(gram))
  # With --cross, the seed is measured again whole (the same draws: the same Gram matrices to
  # the last bit) and BPO's file gains the products of its draws with GRPO's (their values:
  # test_cross_products_are_those_of_the_draws); a second call reuses them.
  before = {m: json.load(open(os.path.join(again, "runs", m, "seed0", "gradient_variance.json"),
                              encoding="utf-8")) for m in ("bpo", "grpo")}
  result = _run(GRAD_VARIANCE, *args, f"--out={again}", f"--params_from={out}", "--gram",
                "--cross")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "grpo seed 0: gradient variance at checkpoints [0, 1, 2] (2 draws)" in result.stdout
  crossed = {m: json.load(open(os.path.join(again, "runs", m, "seed0", "gradient_variance.json"),
                               encoding="utf-8")) for m in ("bpo", "grpo")}
  for b, g, b0, g0 in zip(crossed["bpo"]["checkpoints"], crossed["grpo"]["checkpoints"],
                          before["bpo"]["checkpoints"], before["grpo"]["checkpoints"]):
    assert b["gram"] == b0["gram"] and g["gram"] == g0["gram"]
    assert np.asarray(b["cross"]["grpo"]).shape == (2, 2) and "cross" not in g
  result = _run(GRAD_VARIANCE, *args, f"--out={again}", f"--params_from={out}", "--gram",
                "--cross")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "bpo seed 0: gradient variance measured, skipped" in result.stdout


def test_cross_products_are_those_of_the_draws(tmp_path, monkeypatch):
  """--cross's bookkeeping with the measurement replaced by known draws: BPO's file holds, per
  checkpoint, its draws times each other method's (exactly: the same float64 product); a second
  call reuses everything, and a seed whose BPO file lost them is measured again whole."""
  from bpo_jax.training import gradient_variance  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings  # pylint: disable=g-import-not-at-top
  from experiments import compare  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  methods, seeds, steps = ("bpo", "grpo", "rloo"), (0, 1), [0, 5]
  draws = {(m, s, t): rng.randn(3, 4) for m in methods for s in seeds for t in steps}
  calls = []

  def measured(c, workdir, at, n, gram, keep_draws=False):
    del workdir
    calls.append((c["method"], c["seed"], keep_draws))
    out = []
    for t in at:
      d = draws[(c["method"], c["seed"], t)]
      out.append({"step": t, "variance": 1.0, "draws": n, "gram": (d @ d.T).tolist(),
                  "failed_draws": 0,
                  **({"draws_matrix": d} if keep_draws else {})})
    return out

  monkeypatch.setattr(gradient_variance, "checkpoint_gradient_variance", measured)
  monkeypatch.setattr(gradient_variance, "kept_steps", lambda workdir: steps)
  monkeypatch.setattr(settings, "from_config", lambda c: c)
  runs = [(compare.Run(m, s, str(tmp_path / m / f"seed{s}")), {"method": m, "seed": s})
          for s in seeds for m in methods]
  measure = lambda: grad_variance.measure(runs, 3, 2, "bpo", gram=True, cross=True)  # noqa
  assert measure() == [] and len(calls) == 6
  path = lambda s: tmp_path / "bpo" / f"seed{s}" / "gradient_variance.json"  # noqa: E731
  for s in seeds:
    saved = json.loads(path(s).read_text())
    for point in saved["checkpoints"]:
      assert sorted(point["cross"]) == ["grpo", "rloo"] and "draws_matrix" not in point
      for m in ("grpo", "rloo"):
        want = draws[("bpo", s, point["step"])] @ draws[(m, s, point["step"])].T
        np.testing.assert_array_equal(np.asarray(point["cross"][m]), want)
  calls.clear()
  assert measure() == [] and calls == []
  saved = json.loads(path(1).read_text())
  del saved["checkpoints"][1]["cross"]
  path(1).write_text(json.dumps(saved))
  assert measure() == [] and calls == [(m, 1, True) for m in methods]
  assert "cross" in json.loads(path(1).read_text())["checkpoints"][1]
  # A BPO file cut short (a process killed while writing it): that seed is measured again whole
  # and the file is whole once more.
  calls.clear()
  path(0).write_text(path(0).read_text()[:100])
  assert measure() == [] and calls == [(m, 0, True) for m in methods]
  assert sorted(json.loads(path(0).read_text())["checkpoints"][0]["cross"]) == ["grpo", "rloo"]


@pytest.mark.parametrize("flag, message", [
    ("--draws=1", "error: --draws=1: must be >= 2"),
    ("--checkpoints=0", "error: --checkpoints=0: must be >= 1"),
    ("--params=rloo", "error: --params=rloo: must be one of --estimators (bpo,grpo)"),
    ("--params_from=results", "error: --params_from=results: needs --params"),
    ("--cross", "error: --cross: needs --params and --gram"),
    ("--seeds=0", "error: --seeds=0: must be >= 1"),
    ("--config.rollout.k=two", "error: rollout.k = 'two': must be of type int"),
])
def test_bad_flags_one_line_exit_2(tmp_path, flag, message):
  result = _run(GRAD_VARIANCE, f"--config={ROOMS_TINY}", "--estimators=bpo,grpo",
                f"--out={tmp_path / 'out'}", flag)
  assert result.returncode == 2
  assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "out").exists()


def test_runs_not_trained_or_a_directory_without_them_exit_2(tmp_path):
  out = tmp_path / "out"
  result = _run(GRAD_VARIANCE, f"--config={ROOMS_TINY}", f"--out={out}", "--estimators=grpo")
  assert result.returncode == 2
  assert result.stderr == (f"error: {out / 'runs' / 'grpo' / 'seed0'}: not a finished run; "
                           "train it first (experiments/compare.py)\n")
  result = _run(GRAD_VARIANCE, f"--config={ROOMS_TINY}", f"--out={out}", "--params=bpo",
                f"--params_from={tmp_path / 'none'}")
  assert result.returncode == 2
  assert result.stderr.startswith(f"error: --params_from={tmp_path / 'none'}: no run ")
  assert len(result.stderr.strip().splitlines()) == 1
  assert not out.exists()
  # Another directory's runs are read from the same seed: one without seed 3 is refused.
  with pytest.raises(SystemExit) as error:
    grad_variance.source_runs(str(tmp_path), "bpo", 1, first_seed=3)
  assert error.value.code == 2
