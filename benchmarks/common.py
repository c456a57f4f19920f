"""Shared by the benchmarks: median timing and the one-JSON-object output."""

from __future__ import annotations

import argparse
import json
import os
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


def _current_cpu() -> int | None:
  """The CPU this process last ran on (Linux: field 39 of /proc/self/stat), or None."""
  try:
    with open("/proc/self/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[36])  # fields after the command name start at field 3
  except (OSError, IndexError, ValueError):
    return None


def pin_cores(count: int) -> list[int]:
  """Restricts this process to `count` of its allowed CPUs (0: all of them); returns them.

  The CPU the process is running on comes first (the scheduler put it where there was room),
  then the others in order. Call it before the first JAX computation: XLA's CPU client sizes
  its thread pool, and the compiler how many pieces it splits a large op into, from the CPUs
  the process may run on when the backend starts.
  """
  if count < 0:
    raise ValueError(f"--cores must be >= 0, got {count}")
  allowed = sorted(os.sched_getaffinity(0))
  if count == 0 or count >= len(allowed):
    return allowed
  here = _current_cpu()
  chosen = sorted(sorted(allowed, key=lambda cpu: cpu != here)[:count])
  os.sched_setaffinity(0, chosen)
  return chosen


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
