"""The testbed's statistics over seeds (NumPy): intervals, updates to reach a level, variance ratios.

All take per-seed arrays; seed s of every method is the same seed index, so resampling seed
indices resamples methods jointly.

* `t_interval`: mean ± t_{0.975, n−1} · s / √n, s the sample std (ddof 1).
* `updates_to_reach(curve, level)`: the first update u such that the curve stays ≥ level from u
  on (claim 3's "reach and stay"); None if the last point is below the level.
* `claim3`: the level is the start plus `fraction` of the best baseline's (highest mean final
  success) gain, start + f · (final − start), on the mean curves; each method's updates to reach
  it on its mean curve, with a 95% percentile bootstrap interval over seeds (the level
  recomputed in every resample; a resample that never reaches it counts as beyond the last
  update). f = 1 is the best baseline's final success itself; exact success curves approach
  their limit smoothly, so at f = 1 a curve level with it to the fourth digit reads "not reached".
* `variance_ratio`: per seed d draws give E‖g − ḡ‖² unbiased (the draws' sum of squares over
  d − 1) and ‖E g‖² as ‖ḡ‖² − E‖g − ḡ‖²/d; a method's raw variance is the mean over seeds, its
  relative variance that over the mean ‖E g‖²; a ratio of two methods is the ratio of those means,
  with a percentile bootstrap interval over seeds.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

BOOTSTRAP = 2000
LEVEL = 0.95


def t_interval(x) -> dict:
  """{'mean', 'low', 'high', 'n'} of a 95% Student-t interval over the entries of `x`."""
  x = np.asarray(x, np.float64)
  n = x.size
  mean = float(x.mean())
  if n < 2:
    return dict(mean=mean, low=None, high=None, n=n)
  half = float(stats.t.ppf((1 + LEVEL) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
  return dict(mean=mean, low=mean - half, high=mean + half, n=n)


def updates_to_reach(curve, level: float) -> int | None:
  """First index u with curve[v] ≥ level for every v ≥ u; None if curve[-1] < level.

  Example: [0.1, 0.6, 0.4, 0.7, 0.8] at level 0.5 → 3.
  """
  below = np.nonzero(np.asarray(curve) < level)[0]
  if below.size == 0:
    return 0
  last = int(below[-1])
  return None if last == len(curve) - 1 else last + 1


def _percentile(values, beyond: int) -> tuple[float, float]:
  v = np.array([beyond if x is None else x for x in values], np.float64)
  return (float(np.percentile(v, 100 * (1 - LEVEL) / 2)),
          float(np.percentile(v, 100 * (1 + LEVEL) / 2)))


def claim3(curves: dict[str, np.ndarray], baselines, *, fraction: float = 1.0,
           seed: int = 0) -> dict:
  """Updates to reach `fraction` of the best baseline's gain (module docstring).

  Args:
    curves: method -> float[seeds, updates + 1], the success after each update (index 0: start).
    baselines: the methods a level can come from.
    fraction: f in (0, 1].
  Returns:
    {'best': name, 'level': float, 'methods': {name: {'updates', 'low', 'high'}}} where 'high'
    equal to the number of updates + 1 means "beyond the last update" in some resamples.
  """
  def point(index):
    means = {m: c[index].mean(0) for m, c in curves.items()}
    best = max(baselines, key=lambda m: means[m][-1])
    level = float(means[best][0] + fraction * (means[best][-1] - means[best][0]))
    return best, level, {m: updates_to_reach(means[m], level) for m in curves}

  n = next(iter(curves.values())).shape[0]
  best, level, reached = point(np.arange(n))
  rng = np.random.default_rng(seed)
  samples = [point(rng.integers(0, n, n))[2] for _ in range(BOOTSTRAP)]
  beyond = next(iter(curves.values())).shape[1]
  methods = {}
  for m in curves:
    low, high = _percentile([s[m] for s in samples], beyond)
    methods[m] = dict(updates=reached[m], low=low, high=high)
  return dict(best=best, level=level, methods=methods)


def variance_moments(draws_sq_dev, mean_sq_norm, draws: int) -> tuple[np.ndarray, np.ndarray]:
  """Per seed: (E‖g − ḡ‖², ‖E g‖²) from the draws' Σ_d ‖g_d − ḡ‖² and ‖ḡ‖²."""
  var = np.asarray(draws_sq_dev, np.float64) / (draws - 1)
  return var, np.asarray(mean_sq_norm, np.float64) - var / draws


def gram_moments(gram, counts) -> tuple[np.ndarray, np.ndarray]:
  """(E‖g − ḡ‖², ‖E g‖²) of M draws taken `counts` times each, from their Gram matrix
  G_ij = ⟨g_i, g_j⟩: with c the counts (Σ c = M), ḡ = Σ c_d g_d / M,

      V = (Σ_d c_d G_dd − cᵀGc / M) / (M − 1),     N = cᵀGc / M² − V / M,

  `variance_moments` of the resampled draws. `gram` [..., M, M] and `counts` [..., M] broadcast
  (a stack of seeds). Example: two draws g = (1, 0), (0, 1), counts (1, 1): V = (2 − 1) / 1 =
  1, N = 2/4 − 1/2 = 0; counts (2, 0): V = 0, N = 1.
  """
  gram, counts = np.asarray(gram, np.float64), np.asarray(counts, np.float64)
  m = counts.sum(-1)
  quad = np.einsum("...i,...ij,...j->...", counts, gram, counts)
  var = (np.einsum("...i,...ii->...", counts, gram) - quad / m) / (m - 1)
  return var, quad / m ** 2 - var / m


def variance_ratio_over_draws(num: list, den: list, *, relative: bool, seed: int = 0) -> dict:
  """`variance_ratio` with a bootstrap over seeds and over each seed's draws: `num`, `den` one
  Gram matrix of the draws' gradients per seed (`gram_moments`). Each resample draws n seeds
  with replacement, the same for both methods (paired), then each chosen seed's M draws with
  replacement, independently per method and occurrence; the ratio of the means over seeds is
  taken on every resample. The point estimate uses every draw once (the seed-level ratio)."""
  num, den = (np.asarray(x, np.float64) for x in (num, den))
  ones = lambda g: np.ones(g.shape[:-1])  # noqa: E731
  point_num, point_den = gram_moments(num, ones(num)), gram_moments(den, ones(den))
  point = variance_ratio(point_num, point_den, relative=relative)
  if point["ratio"] is None:
    return point
  n, rng = len(num), np.random.default_rng(seed)

  def resampled(grams, rows):
    draws = grams.shape[-1]
    counts = rng.multinomial(draws, np.full(draws, 1 / draws), size=len(rows))
    var, sq = gram_moments(grams[rows], counts)
    return var.mean() / (sq.mean() if relative else 1.0)

  boot = []
  with np.errstate(divide="ignore", invalid="ignore"):
    for _ in range(BOOTSTRAP):
      rows = rng.integers(0, n, n)
      boot.append(resampled(num, rows) / resampled(den, rows))
  boot = np.asarray(boot)
  low, high = _percentile(boot[np.isfinite(boot)], 0)
  return dict(ratio=point["ratio"], low=low, high=high)


def variance_ratio(num: tuple, den: tuple, *, relative: bool, seed: int = 0) -> dict:
  """Ratio of two methods' mean variances over seeds (raw, or each over its mean ‖E g‖²), with
  a 95% percentile bootstrap interval over seeds. `num`, `den`: (var[seeds], sq_norm[seeds])."""
  def ratios(rows):  # the ratio of the means over each row's seeds
    a = np.asarray(num[0])[rows].mean(-1) / (np.asarray(num[1])[rows].mean(-1) if relative else 1.0)
    b = np.asarray(den[0])[rows].mean(-1) / (np.asarray(den[1])[rows].mean(-1) if relative else 1.0)
    return a / b
  if not (np.any(np.asarray(den[0]) > 0) and (not relative or np.mean(den[1]) > 0)
          and (not relative or np.mean(num[1]) > 0)):
    return dict(ratio=None, low=None, high=None)  # no variance (or no mean gradient) to compare
  n = len(num[0])
  rng = np.random.default_rng(seed)
  rows = np.stack([rng.integers(0, n, n) for _ in range(BOOTSTRAP)])  # one resample per row
  with np.errstate(divide="ignore", invalid="ignore"):  # a resample may hold no variance
    boot = ratios(rows)
  boot = boot[np.isfinite(boot)]
  return dict(ratio=float(ratios(np.arange(n))),
              low=float(np.percentile(boot, 100 * (1 - LEVEL) / 2)),
              high=float(np.percentile(boot, 100 * (1 + LEVEL) / 2)))


def _distinct_pairs_mean(matrix, counts):
  """Σ_{i≠j} c_i c_j M_ij / Σ_{i≠j} c_i c_j: the mean of M over pairs of distinct draws, each
  draw taken `counts` times ([..., M, M] and [..., M], broadcast)."""
  matrix, counts = np.asarray(matrix, np.float64), np.asarray(counts, np.float64)
  quad = np.einsum("...i,...ij,...j->...", counts, matrix, counts)
  same = np.einsum("...i,...ii->...", counts ** 2, matrix)
  return (quad - same) / (counts.sum(-1) ** 2 - (counts ** 2).sum(-1))


def same_expectation(gram_a, gram_b, cross, *, seed: int = 0) -> dict:
  """Whether two estimators have one expectation, from M draws of each at the same parameters.

  Per seed, with Gᵃ, Gᵇ the draws' Gram matrices and X_ij = ⟨a_i, b_j⟩, draws i ≠ j independent
  (draw i of both may share a key, so X_ii is left out):

      A = Σ_{i≠j} Gᵃ_ij / (M(M − 1)),   B likewise,   C = Σ_{i≠j} X_ij / (M(M − 1))

  estimate ‖E a‖², ‖E b‖² and ⟨E a, E b⟩ without bias, and A + B − 2C ‖E a − E b‖². Over seeds:
  `scale` = ΣC / ΣB (1 when E a = E b; a factor s when E a = s · E b) and `difference` =
  Σ(A + B − 2C) / ΣB (0 then), each with a 95% percentile bootstrap over seeds and over each
  chosen seed's draws (draw i of a and b resampled together, as they may share a key).

  Example: a = (1, 0), (1, 2); b = (1, 1), (1, 1): A = 1, B = 2, C = (1 + 3)/2 = 2, so
  scale 1 and difference (1 + 2 − 4)/2 = −0.5.
  """
  mats = [np.asarray(x, np.float64) for x in (gram_a, gram_b, cross)]
  n, draws = mats[0].shape[0], mats[0].shape[-1]

  def pooled(rows, counts):
    a, b, c = (_distinct_pairs_mean(m[rows], counts).sum() for m in mats)
    return c / b, (a + b - 2 * c) / b

  point = pooled(np.arange(n), np.ones((n, draws)))
  rng = np.random.default_rng(seed)
  boot = []
  with np.errstate(divide="ignore", invalid="ignore"):
    for _ in range(BOOTSTRAP):
      rows = rng.integers(0, n, n)
      boot.append(pooled(rows, rng.multinomial(draws, np.full(draws, 1 / draws), size=n)))
  boot = np.asarray(boot)
  out = {}
  for k, name in enumerate(("scale", "difference")):
    finite = boot[:, k][np.isfinite(boot[:, k])]
    low, high = _percentile(finite, 0)
    out[name] = dict(ratio=float(point[k]), low=low, high=high)
  return out
