"""Accelerators a pod layout is checked against: their names and memory (HBM) per device.

The configuration names one in `scale.chip`; the dry run (`training/dry_run.py`) compares each
compiled program's per-device memory with it. Pure Python: the schema reads it without JAX.
"""

from __future__ import annotations

import dataclasses

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """An accelerator: its name and memory (HBM) per device in bytes."""

  name: str
  hbm_bytes: int


CHIPS = {
    "v4": Chip("TPU v4", 32 * GIB),
    "v5p": Chip("TPU v5p", 95 * GIB),
    "v5e": Chip("TPU v5e", 16 * GIB),
    "v6e": Chip("TPU v6e", 32 * GIB),
    "h100": Chip("NVIDIA H100", 80 * GIB),
    "h200": Chip("NVIDIA H200", 141 * GIB),
}


def get_chip(chip: str | Chip) -> Chip:
  """`chip` itself, or the entry of `CHIPS` it names (any case)."""
  if isinstance(chip, Chip):
    return chip
  key = chip.lower()
  if key not in CHIPS:
    raise ValueError(f"unknown chip {chip!r}; known chips: {', '.join(sorted(CHIPS))}")
  return CHIPS[key]
