"""One process of eight CPU devices trains on the configured mesh like one device.

`mesh_worker.py` runs, in a process of its own (the device count is fixed before JAX starts),
two iterations of a small quickstart from its warm-started checkpoint (`small_checkpoint`) on
each of three placements built by the loop's `build_update`: one device, a mesh fsdp 4 x tensor 2 and a mesh
data 2 x fsdp 2 x tensor 2. The trees must be equal, the metrics and the final parameters and
optimiser state equal to 1e-5 (the gradient's sums run in another order), and each device must
hold at most 1/(fsdp x tensor) of the train state plus 10% (the embedding, whose odd vocabulary
is not split over tensor, and the replicated norms make up the excess).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TIMEOUT_S = 600

# Counts that depend only on the trees (they must be equal, not close).
TREE_KEYS = ("success", "tree_success", "return", "leaves", "nodes", "forks", "env_steps",
             "tokens_processed", "tokens_decoded", "unique_tokens", "num_action_tokens",
             "row_length", "fork_threshold", "state_bytes")
# Numbers of float sums in another order (the update), or of parameters that differ by such
# rounding (the entropies of iteration 2's states).
UPDATE_KEYS = ("state_entropy_mean", "loss", "grad_norm", "approx_kl", "entropy", "clip_fraction", "advantage_mean",
               "advantage_std")
# name -> (fsdp x tensor, the mesh's shape).
MESHES = {"fsdp4_tensor2": (8, {"data": 1, "fsdp": 4, "tensor": 2}),
          "data2_fsdp2_tensor2": (4, {"data": 2, "fsdp": 2, "tensor": 2})}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, small_checkpoint):
  tmp = tmp_path_factory.mktemp("mesh")
  out = tmp / "out.npz"
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  result = subprocess.run([sys.executable, os.path.join(HERE, "mesh_worker.py"),
                           str(tmp / "workdir"), str(out), small_checkpoint], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-4000:]
  data = np.load(out)
  return {key: data[key] for key in data}


def _leaves(runs, name):
  keys = sorted((k for k in runs if k.startswith(f"{name}/leaf")),
                key=lambda k: int(k.rsplit("leaf", 1)[1]))
  return [runs[k] for k in keys]


@pytest.mark.slow
def test_the_reference_runs_on_one_device_and_moves_the_parameters(runs):
  assert json.loads(str(runs["one/mesh"])) is None
  records = json.loads(str(runs["one/records"]))
  assert [r["iteration"] for r in records] == [1, 2]
  assert min(r["success"] for r in records) > 0  # both updates have non-zero advantages
  assert records[0]["state_bytes_per_device"] == records[0]["state_bytes"]
  moved = max(float(np.abs(a - b).max())
              for a, b in zip(_leaves(runs, "start"), _leaves(runs, "one")))
  assert moved > 1e-3


@pytest.mark.parametrize("name", sorted(MESHES))
def test_a_mesh_trains_like_one_device(runs, name):
  shards, shape = MESHES[name]
  assert json.loads(str(runs[f"{name}/mesh"])) == shape
  assert json.loads(str(runs[f"{name}/trees"])) == json.loads(str(runs["one/trees"]))
  one, mesh = (json.loads(str(runs[f"{n}/records"])) for n in ("one", name))
  for a, b in zip(one, mesh):
    assert {k: b[k] for k in TREE_KEYS} == {k: a[k] for k in TREE_KEYS}
    for key in UPDATE_KEYS:
      assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
  leaves_one, leaves_mesh = _leaves(runs, "one"), _leaves(runs, name)
  assert len(leaves_one) == len(leaves_mesh) > 10
  for a, b in zip(leaves_one, leaves_mesh):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  # The train state is laid out by the partition rules: each device holds about 1/shards.
  fraction = mesh[-1]["state_bytes_per_device"] / mesh[-1]["state_bytes"]
  assert 1 / shards <= fraction <= 1.1 / shards, fraction


@pytest.mark.parametrize("overrides, expected", [
    (["--config.scale.mesh.data=-1", "--config.scale.mesh.fsdp=3"],
     "error: invalid configuration:\n  scale.mesh: 8 devices do not divide by the fixed axes"),
    (["--config.scale.mesh.fsdp=2", "--config.scale.mesh.tensor=2"],
     "scale.mesh: mesh {'data': 1, 'fsdp': 2, 'tensor': 2} needs 4 devices, have 8"),
    (["--config.scale.num_devices=16", "--config.scale.mesh.fsdp=16"],
     "scale.num_devices = 16: this run has 8 device(s)"),
    (["--config.scale.model_preset=qwen2_5_7b"],
     "error: scale.model_preset = 'qwen2_5_7b': training a preset needs its pretrained"),
])
def test_a_mesh_the_devices_cannot_form_is_refused_before_any_work(tmp_path, overrides,
                                                                    expected):
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu"}
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "run.py"),
       f"--config={os.path.join(ROOT, 'experiments', 'configs', 'quickstart.py')}:tiny",
       f"--workdir={tmp_path / 'w'}", *overrides], cwd=ROOT, env=env, capture_output=True,
      text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert expected in result.stderr, result.stderr[-2000:]
  assert not (tmp_path / "w").exists()  # nothing was started
