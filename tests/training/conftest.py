"""Fixtures the training tests share across their files (and the test processes of a run)."""

import os

import pytest

from tests.training import mesh_setup


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory):
  """mesh_setup's small quickstart, warm-started on one device and exported as a Hugging Face
  directory: the starting point of the mesh and multi-process tests. Built once per test run:
  under pytest-xdist in the directory above the worker's own temporary root, which the
  workers of one run share (the first builds it, the others wait for it)."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent
  return mesh_setup.warm_started_checkpoint(str(root / "small_checkpoint"))
