"""Test tolerances from the rounding of the dtype at the magnitude compared.

Each float operation rounds its exact result to a neighbouring float, an error of at most half the
spacing of the floats there. eps · m (eps: the spacing at 1) is at least the spacing at every float
no larger than m in magnitude, so `steps` · eps · m bounds the difference of two computations that
each round at most `steps` times at magnitudes no larger than m (or of one such computation and
the exact value, twice over). A test states how many roundings the numbers it compares went
through and at what magnitude; the tolerance then holds on any processor, whose XLA code may
round in another order, and is never tighter than the dtype's own rounding.

  assert_close(out, reference, steps=4)                     # 4 roundings at max |reference|
  np.testing.assert_allclose(x, y, rtol=0, atol=ulp_tol(np.float32, 8.0, 2))
"""

from __future__ import annotations

import numpy as np


def eps(dtype) -> float:
  """The spacing of `dtype`'s floats at 1 (2⁻²³ for float32, 2⁻⁵² for float64)."""
  return float(np.finfo(dtype).eps)


def ulp_tol(dtype, magnitude: float, steps: float = 1.0) -> float:
  """Absolute tolerance for computations of `steps` roundings in `dtype` at most at `magnitude`.

  steps · eps(dtype) · |magnitude|. Example: ulp_tol(np.float32, 4.0, 2) = 2 · 2⁻²³ · 4 ≈ 9.5e-7.
  """
  if steps < 1:
    raise ValueError(f"steps counts roundings and must be at least 1, got {steps}")
  return float(steps) * eps(dtype) * abs(float(magnitude))


def assert_close(actual, expected, *, steps: float, magnitude: float | None = None, dtype=None,
                 err_msg: str = "") -> None:
  """`np.testing.assert_allclose(actual, expected, rtol=0, atol=ulp_tol(dtype, magnitude, steps))`.

  Args:
    actual: the computed numbers.
    expected: the reference (hand-computed, float64, or another computation).
    steps: the roundings of either side (the larger count) between its inputs and the result.
    magnitude: the largest magnitude the roundings happen at; default the largest |expected|.
      Pass it when the compared values come out of cancellation (a difference of larger terms).
    dtype: whose rounding; default `actual`'s dtype (float32 if it is not a float).
    err_msg: shown on failure.
  """
  actual, expected = np.asarray(actual), np.asarray(expected)
  if dtype is None:
    dtype = actual.dtype if np.issubdtype(actual.dtype, np.floating) else np.float32
  if magnitude is None:
    magnitude = float(np.max(np.abs(expected))) if expected.size else 0.0
  atol = ulp_tol(dtype, magnitude, steps)
  np.testing.assert_allclose(actual, expected, rtol=0, atol=atol,
                             err_msg=f"{err_msg} (tolerance: {steps} roundings of "
                             f"{np.dtype(dtype).name} at magnitude {magnitude:.3g})".strip())
