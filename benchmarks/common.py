"""Shared by the benchmarks: median timing and the one-JSON-object output."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import jax


def parser(description: str, repeats: int = 7) -> argparse.ArgumentParser:
  """The flags every benchmark has: `--json` and `--repeats` (default `repeats`)."""
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--json", action="store_true", help="print one JSON object with the figures")
  p.add_argument("--repeats", type=int, default=repeats,
                 help="timed repetitions (the median is kept)")
  return p


def median_seconds(fn: Callable[[], Any], repeats: int = 7, warmup: int = 1) -> float:
  """Median wall time of `fn()` over `repeats` runs after `warmup` runs; blocks on JAX outputs."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def emit(figures: dict[str, Any], as_json: bool, lines: list[str]) -> None:
  """Prints the human-readable lines, or the figures as one JSON object."""
  if as_json:
    print(json.dumps(figures, sort_keys=True))
  else:
    print("\n".join(lines))
