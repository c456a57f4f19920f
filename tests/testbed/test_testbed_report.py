"""The testbed's statistics, and its report script on a small fixture of result files."""

import json
import os
import sys

import numpy as np
import pytest

from bpo_jax.testbed import analysis

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments import testbed_report  # noqa: E402


def test_updates_to_reach():
  assert analysis.updates_to_reach([0.1, 0.6, 0.4, 0.7, 0.8], 0.5) == 3
  assert analysis.updates_to_reach([0.6, 0.7], 0.5) == 0
  assert analysis.updates_to_reach([0.6, 0.4], 0.5) is None


def test_t_interval_by_hand():
  # mean 0.6, s = 0.1, t_{0.975, 2} = 4.302653 → half-width 0.248414.
  x = analysis.t_interval([0.5, 0.6, 0.7])
  assert x["mean"] == pytest.approx(0.6)
  assert x["high"] - x["mean"] == pytest.approx(4.302653 * 0.1 / np.sqrt(3), rel=1e-6)


def test_claim3_level_and_crossings():
  curves = {"bpo": np.array([[0.0, 0.5, 0.9]] * 2), "rloo": np.array([[0.0, 0.2, 0.8]] * 2)}
  out = analysis.claim3(curves, ["rloo"], fraction=0.5)
  assert out["best"] == "rloo" and out["level"] == pytest.approx(0.4)
  assert out["methods"]["bpo"]["updates"] == 1 and out["methods"]["rloo"]["updates"] == 2


def test_variance_ratio_of_means():
  num = (np.array([1.0, 3.0]), np.array([1.0, 1.0]))
  den = (np.array([4.0, 4.0]), np.array([2.0, 2.0]))
  assert analysis.variance_ratio(num, den, relative=False)["ratio"] == pytest.approx(0.5)
  assert analysis.variance_ratio(num, den, relative=True)["ratio"] == pytest.approx(1.0)
  assert analysis.variance_ratio(num, (np.zeros(2), np.zeros(2)), relative=False)["ratio"] is None


def test_gram_moments_by_hand_and_against_the_resampled_draws():
  # The docstring's case: two orthogonal unit draws.
  gram = np.eye(2)
  assert analysis.gram_moments(gram, [1, 1]) == pytest.approx((1.0, 0.0))
  assert analysis.gram_moments(gram, [2, 0]) == pytest.approx((0.0, 1.0))
  # Any counts: the variance and ‖E g‖² estimate of the draws repeated that many times.
  g = np.random.RandomState(0).randn(5, 7)
  counts = np.array([2, 0, 1, 0, 2])
  picked = np.repeat(g, counts, axis=0)
  mean = picked.mean(0)
  var = np.sum((picked - mean) ** 2) / (len(picked) - 1)
  got = analysis.gram_moments(g @ g.T, counts)
  # float64 sums of a few terms of magnitude Σ‖g‖²: a few ulps of it.
  scale = float(np.sum(g ** 2))
  assert abs(got[0] - var) <= 16 * np.finfo(np.float64).eps * scale
  assert abs(got[1] - (mean @ mean - var / 5)) <= 16 * np.finfo(np.float64).eps * scale


def test_same_expectation_by_hand_and_against_loops_over_draw_pairs():
  # The docstring's case.
  a, b = np.array([[1.0, 0.0], [1.0, 2.0]]), np.array([[1.0, 1.0], [1.0, 1.0]])
  out = analysis.same_expectation([a @ a.T], [b @ b.T], [a @ b.T])
  assert out["scale"]["ratio"] == pytest.approx(1.0) and out["difference"]["ratio"] == -0.5
  # Two seeds of random draws against plain loops over the pairs i != j; b's draws are 0.5·a's
  # plus noise, a's mean gradient twice b's.
  rng = np.random.RandomState(2)
  a = 1 + rng.randn(2, 6, 9)
  b = 0.5 + rng.randn(2, 6, 9)
  pairs = [(i, j) for i in range(6) for j in range(6) if i != j]
  loop = lambda x, y: sum(x[s, i] @ y[s, j] for s in range(2) for i, j in pairs) / 30  # noqa
  big_a, big_b, c = loop(a, a), loop(b, b), loop(a, b)
  out = analysis.same_expectation([x @ x.T for x in a], [y @ y.T for y in b],
                                  [x @ y.T for x, y in zip(a, b)])
  scale = float(np.sum(a ** 2) + np.sum(b ** 2))  # float64 sums: a few ulps of it
  tol = 64 * np.finfo(np.float64).eps * scale
  assert abs(out["scale"]["ratio"] * big_b - c) <= tol
  assert abs(out["difference"]["ratio"] * big_b - (big_a + big_b - 2 * c)) <= 3 * tol
  assert out["scale"]["low"] < out["scale"]["ratio"] < out["scale"]["high"]
  # One estimator against itself: one expectation whatever the draws, scale 1 and no difference,
  # in every resample.
  same = analysis.same_expectation([x @ x.T for x in a], [x @ x.T for x in a],
                                   [x @ x.T for x in a])
  assert same["scale"]["low"] == pytest.approx(1.0) == same["scale"]["high"]
  assert abs(same["difference"]["high"]) <= tol and abs(same["difference"]["low"]) <= tol


def test_the_bootstrap_over_draws_is_the_seed_ratio_with_the_draws_noise():
  # Three seeds with the same draws for each method: seeds alone leave no spread (the interval
  # is the point), the draws' resampling does. The point estimate is the seed-level ratio.
  rng = np.random.RandomState(1)
  num = [g @ g.T for g in [1 + rng.randn(8, 20)] * 3]  # a mean gradient, so ‖E g‖² > 0
  den = [g @ g.T for g in [1 + 2 * rng.randn(8, 20)] * 3]
  moments = lambda grams: analysis.gram_moments(np.stack(grams), np.ones((3, 8)))  # noqa: E731
  for relative in (False, True):
    seeds = analysis.variance_ratio(moments(num), moments(den), relative=relative)
    both = analysis.variance_ratio_over_draws(num, den, relative=relative)
    assert seeds["low"] == pytest.approx(seeds["high"])
    assert seeds["ratio"] is not None
    assert both["ratio"] == pytest.approx(seeds["ratio"], rel=1e-12)
    assert both["low"] < both["ratio"] < both["high"]
  # No variance in the baseline's draws: no ratio.
  same = [np.ones((4, 4))] * 3
  assert analysis.variance_ratio_over_draws(num, same, relative=False)["ratio"] is None


SETTINGS = dict(weights=[0.5], methods=["bpo", "grpo", "rloo", "gigpo"], horizon=2, actions=2,
                num_tasks=2, episodes=2, max_env_steps=5, tasks_per_iteration=1, iterations=2,
                seeds=3, tune_seeds=2, lrs=[1.0], draws=2, checkpoints=[0])


def _fixture(root):
  record = dict(settings=SETTINGS, provenance=dict(commit="abcdef0123", command="fixture"))
  d = os.path.join(root, "w0.5")
  os.makedirs(d)
  files = dict(world=dict(world=dict(early_weight=0.5, prefix_share=[0.25], initial_success=0.5)),
               tune={})
  final = dict(bpo=[0.5, 0.6, 0.7], grpo=[0.4, 0.5, 0.6], rloo=[0.3, 0.4, 0.5],
               gigpo=[0.2, 0.3, 0.4])
  for m, last in final.items():
    files[m] = dict(method=m, lr=1.0, env_steps_per_task=4.0,
                    success=[[0.25, 0.3, x] for x in last])
  per_seed = dict(sum_sq_dev=[1.0, 1.0, 1.0], mean_sq_norm=[1.0, 1.0, 1.0],
                  sum_sq_dev_root_row=[0.5, 0.5, 0.5])
  files["variance"] = dict(variance={"0": {m: per_seed for m in final}})
  files["variance"]["variance"]["0"]["bpo"] = dict(per_seed, sum_sq_dev_root_row=[1.0, 2.0, 3.0])
  for name, payload in files.items():
    with open(os.path.join(d, f"{name}.json"), "w") as f:
      json.dump(dict(record, **payload), f)


@pytest.mark.slow
def test_report_reproduces_a_figure(tmp_path):
  _fixture(str(tmp_path / "results"))
  doc = tmp_path / "RESULTS.md"
  doc.write_text(f"# R\n\nabove\n{testbed_report.BEGIN}\nstale\n{testbed_report.END}\nbelow\n")
  args = [f"--results={tmp_path / 'results'}", f"--doc={doc}"]
  assert testbed_report.main(args + ["--check"]) == 1
  assert testbed_report.main(args) == 0
  text = doc.read_text()
  # BPO's success after the last update: 0.6 ± 4.302653 · 0.1 / √3; BPO − GRPO paired: 0.1 ± 0.
  assert "| 0.5 | 0.250 | 2 | 0.600 [0.352, 0.848] | 0.500 [0.252, 0.748] |" in text
  assert "0.100 [0.100, 0.100] (GRPO)" in text
  # The root row: BPO's mean 2 over RLOO's 0.5 (each over draws − 1 = 1).
  assert "| 0.5 | 0.250 | 4.00 [" in text
  assert text.startswith("# R\n\nabove\n") and text.endswith("\nbelow\n") and "stale" not in text
  assert testbed_report.main(args + ["--check"]) == 0
  assert (tmp_path / "results" / "curves.png").stat().st_size > 0
  assert (tmp_path / "results" / "by_share.png").stat().st_size > 0


def test_report_refuses_a_document_without_markers(tmp_path, capsys):
  _fixture(str(tmp_path / "results"))
  doc = tmp_path / "RESULTS.md"
  doc.write_text("# R\n")
  assert testbed_report.main([f"--results={tmp_path / 'results'}", f"--doc={doc}"]) == 2
  assert "markers" in capsys.readouterr().err
  assert doc.read_text() == "# R\n"
