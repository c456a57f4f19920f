"""Two JAX processes on localhost (Gloo collectives on CPU) train to the same parameters as one
process, each feeding only its own rows, and write and restore one Orbax checkpoint together."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from bpo_jax import sharding
from bpo_jax.training import distributed

from tests.training import distributed_worker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
  port = _free_port()
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": "2", "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  script = os.path.join(ROOT, "tests", "training", "distributed_worker.py")
  outputs = [tmp_path / f"process{i}.npz" for i in range(2)]
  workers = [subprocess.Popen([sys.executable, script, str(i), "2", str(port),
                               str(tmp_path / "run"), str(outputs[i])], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
  logs = []
  for worker in workers:
    try:
      logs.append(worker.communicate(timeout=300)[0])
    except subprocess.TimeoutExpired:
      for w in workers:
        w.kill()
      pytest.fail("a worker process did not finish in 300 s")
  for worker, log in zip(workers, logs):
    assert worker.returncode == 0, log[-3000:]

  # The reference: the same program in this one process, on 4 of its 8 devices.
  reference = distributed_worker.train_and_checkpoint(jax.devices()[:4], str(tmp_path / "one"))
  assert reference["restored_equal"] and reference["layouts_kept"]
  np.testing.assert_array_equal(reference["rows"], [0, 8])
  results = [np.load(path) for path in outputs]
  for process, result in enumerate(results):
    assert int(result["process_count"]) == 2 and int(result["device_count"]) == 4
    # Each process fed half of the rows: its devices' fsdp shard.
    np.testing.assert_array_equal(result["rows"], [4 * process, 4 * process + 4])
    assert bool(result["restored_equal"]) and bool(result["layouts_kept"])
    np.testing.assert_allclose(result["losses"], reference["losses"], rtol=1e-5)
    assert len([k for k in result.files if k.startswith("param")]) == len(reference["params"])
    for name, value in reference["params"].items():
      np.testing.assert_allclose(result["param" + name], value, rtol=1e-5, atol=1e-6,
                                 err_msg=name)
  # The parameters moved far beyond the tolerance (not a comparison of two initial states).
  initial = distributed_worker.Decoder(distributed_worker.CONFIG,
                                       rngs=distributed_worker.nnx.Rngs(1))
  q = np.asarray(initial.layers[0].attn.q_kernel[...])
  assert np.abs(results[0]["param['layers'][0]['attn']['q_kernel'].value"] - q).max() > 1e-4


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
