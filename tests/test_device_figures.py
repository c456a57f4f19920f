"""benchmarks/device_figures.py: the bandwidth bound and the utilisation, by hand."""

import pytest

from benchmarks import device_figures


def _result(**changes):
  result = dict(tokens_decoded=4800, decode_s=2.0, decode_steps=100, param_bytes=1e9,
                update_tokens_per_s=1e4, iteration_s=3.0, compiles_in_timed_iterations=0,
                startup_compile_seconds={"jit(generate)": 2.5, "jit(train_step)": 1.5})
  result.update(changes)
  return result


def test_figures_of_a_known_chip():
  chip = device_figures.chip_figures("NVIDIA H200")
  assert chip == (4.8e12, 989e12)
  figures = device_figures.estimator_figures(_result(), chip)
  # Each step reads 1e9 bytes at 4.8e12 B/s: 1/4800 s; 100 steps bound 4800 tokens to 1/48 s.
  assert figures["decode_bound_tokens_per_s"] == pytest.approx(4800 * 48)
  assert figures["decode_tokens_per_s"] == pytest.approx(2400)
  assert figures["decode_fraction_of_bound"] == pytest.approx(2400 / (4800 * 48))
  # 5e8 parameters, 4 flops each per token, 1e4 tokens/s over 989e12 flops/s.
  assert figures["update_mfu"] == pytest.approx(4 * 5e8 * 1e4 / 989e12)
  assert figures["startup_compile_seconds"] == pytest.approx(4.0)


def test_names_pick_the_right_entry_and_an_unknown_chip_has_no_bound():
  assert device_figures.chip_figures("NVIDIA H100 PCIe") == (2.0e12, 756e12)
  assert device_figures.chip_figures("NVIDIA H100 80GB HBM3") == (3.35e12, 989e12)
  assert device_figures.chip_figures("NVIDIA GH200 480GB") == (4.0e12, 989e12)
  assert device_figures.chip_figures("Some New Chip") is None
  figures = device_figures.estimator_figures(_result(), None)
  assert "decode_bound_tokens_per_s" not in figures and figures["decode_tokens_per_s"] == 2400
