"""The multi-process helpers: which rows a process holds, and the errors of a bad setup.

Two JAX processes training together (each feeding its own rows, one Orbax checkpoint written
and restored by both) are checked end to end, against one device, in test_mesh_loop.py."""

import jax
import numpy as np
import pytest

from bpo_jax import sharding
from bpo_jax.training import distributed


def test_process_rows_and_errors():
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2), jax.devices()[:8])
  row_sh = sharding.batch_sharding(mesh)
  assert distributed.process_rows(row_sh, 16) == range(0, 16)  # one process holds every row
  with pytest.raises(ValueError, match="process 1 holds no rows"):
    distributed.process_rows(row_sh, 16, process_index=1)
  with pytest.raises(ValueError, match="holds 16 rows .0..15. but its local batch has 4"):
    distributed.global_batch({"tokens": np.zeros((4, 3))}, row_sh, 16)
  with pytest.raises(ValueError, match="coordinator_address must be 'host:port'"):
    distributed.initialize("localhost", 2, 0)
  with pytest.raises(ValueError, match=r"process_id must be in \[0, 1\], got 2"):
    distributed.initialize("localhost:1234", 2, 2)
  assert distributed.initialize("", 1, 0) is False  # one process: nothing to connect
