"""Training on a mesh gives what one device gives: two processes of four CPU devices each.

`experiments/run.py` runs a small quickstart (`mesh_setup.small_config`, a model whose matrices
the mesh divides) in two processes of four fake CPU devices each (JAX distributed, Gloo on
localhost), on the mesh data 2 x fsdp 2 x tensor 2 over their eight devices (all three axes),
from its warm-started checkpoint (`small_checkpoint`) as a pod run starts; a few warm-start steps
continue it. The processes are killed (SIGKILL) once the checkpoint of iteration 1 is written and
then resume from their joint checkpoint. Each process feeds its rows of every packed batch, of
the warm start and of the update, to the sharded step, and grows the trees of half of the tasks
with its own sandboxes, decoding them on its own four devices.

The reference is one device of this process: the warm start's steps from the same checkpoint,
and the two iterations from the two-process run's warm-started state (its checkpoint 0) with the
loop's own update and iteration. The trees must be equal; the metrics and each leaf of the final
parameters and optimiser state may differ by the rounding of sums run in another order, counted
by `mesh_setup.update_roundings` at the magnitude compared; and each device must hold at most
1/(fsdp x tensor) of the train state plus 10% (the embedding, whose odd vocabulary is not split
over tensor, and the replicated norms make up the excess).

The refusals of a mesh the devices cannot form are checked on `placement.run_devices` in this
process's eight devices, and once through run.py's one line.
"""

import functools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import rollout
from bpo_jax.testing import tolerance
from bpo_jax.training import config as config_lib
from bpo_jax.training import evaluation
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import iteration as iteration_lib
from bpo_jax.training import loop
from bpo_jax.training import metrics
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import translate
from bpo_jax.training import warm_start as warm_start_lib
from bpo_jax.training.settings import from_config

from tests.training import mesh_setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# Counts that depend only on the trees (they must be equal, not close).
TREE_KEYS = ("success", "tree_success", "return", "leaves", "nodes", "forks", "env_steps",
             "tokens_processed", "tokens_decoded", "unique_tokens", "num_action_tokens",
             "row_length", "state_bytes", "sample_bytes")
# Numbers of float sums in another order (the update; the tensor-parallel logits of the states'
# entropies, whose quantile is the fork threshold), or of parameters that differ by such
# rounding (the entropies of iteration 2's states): compared by `_assert_metrics_close`.
UPDATE_KEYS = ("state_entropy_mean", "fork_threshold", "loss", "grad_norm", "approx_kl",
               "entropy", "clip_fraction", "advantage_mean", "advantage_std")
def _assert_metrics_close(one, other, roundings):
  """`UPDATE_KEYS` of two placements' records within `roundings` at the magnitude of their
  per-token terms: log-probabilities and ratios of about 1, advantages up to their largest
  |value| (a mean of such terms, like the approximate KL, may itself be far smaller)."""
  for a, b in zip(one, other):
    magnitude = max(1.0, a["advantage_abs_max"])
    for key in UPDATE_KEYS:
      atol = tolerance.ulp_tol(np.float32, max(magnitude, abs(a[key])), roundings)
      assert abs(b[key] - a[key]) <= atol, (key, a[key], b[key], atol)


def _assert_state_close(one, other, roundings):
  """Each leaf of two train states within `roundings` at that leaf's largest |value|: the
  parameters at theirs, the Adam moments (down to 1e-12 here) at theirs."""
  assert len(one) == len(other) > 10
  for j, (a, b) in enumerate(zip(one, other)):
    tolerance.assert_close(np.asarray(b), np.asarray(a), steps=roundings, dtype=np.float32,
                           err_msg=f"train state leaf {j}")


@pytest.mark.parametrize("overrides, expected", [
    ({"scale.mesh.data": -1, "scale.mesh.fsdp": 3},
     "invalid configuration: scale.mesh: 8 devices do not divide by the fixed axes"),
    ({"scale.mesh.fsdp": 2, "scale.mesh.tensor": 2},
     "scale.mesh: mesh {'data': 1, 'fsdp': 2, 'tensor': 2} needs 4 devices, have 8"),
    ({"scale.num_devices": 16, "scale.mesh.fsdp": 16},
     "scale.num_devices = 16: this run has 8 device(s)"),
    ({"model.kv_page_size": 16},
     "model.kv_page_size = 16: a paged KV cache decodes on one device, this run's mesh has 8"),
])
def test_a_mesh_the_devices_cannot_form_is_refused_by_the_placement(tmp_path, overrides,
                                                                     expected):
  """`placement.run_devices` on this process's eight devices, which run.py calls before any
  work and answers in one line (that path is the next test's)."""
  from experiments.configs import quickstart  # pylint: disable=g-import-not-at-top
  config = quickstart.get_config("tiny")
  for key, value in overrides.items():
    section, name = key.rsplit(".", 1)
    setattr(functools.reduce(getattr, section.split("."), config), name, value)
  config_lib.validate(config, "train", str(tmp_path / "w"))  # each key alone is valid
  with pytest.raises(config_lib.ConfigError) as error:
    placement_lib.run_devices(from_config(config))
  assert expected in str(error.value)


@pytest.mark.slow
def test_a_preset_without_its_checkpoint_is_refused_before_any_work(tmp_path):
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu"}
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "run.py"),
       f"--config={os.path.join(ROOT, 'experiments', 'configs', 'quickstart.py')}:tiny",
       f"--workdir={tmp_path / 'w'}", "--config.scale.mesh.fsdp=2",
       "--config.scale.mesh.tensor=2"], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert result.stderr == ("error: invalid configuration: scale.mesh: mesh {'data': 1, 'fsdp': "
                           "2, 'tensor': 2} needs 4 devices, have 8\n"), result.stderr
  assert not (tmp_path / "w").exists()  # nothing was started
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "run.py"),
       f"--config={os.path.join(ROOT, 'experiments', 'configs', 'quickstart.py')}:tiny",
       f"--workdir={tmp_path / 'w'}", "--config.scale.model_preset=qwen2_5_7b"], cwd=ROOT,
      env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
  assert result.stderr.startswith("error: scale.model_preset = 'qwen2_5_7b': training a preset "
                                  "needs its pretrained")
  assert not (tmp_path / "w").exists()


# Two processes of four devices each.

RUN = os.path.join(ROOT, "experiments", "run.py")
TWO_PROCESS_TIMEOUT_S = 420
# All three axes: rows split over data x fsdp (4 ways), matrices over fsdp and tensor.
MESH = ("--config.scale.mesh.data=2", "--config.scale.mesh.fsdp=2",
        "--config.scale.mesh.tensor=2", "--config.scale.startup_compile=on")
SHARDS = 4  # fsdp x tensor: the train state's split



def _config_file(tmp_path, checkpoint: str):
  # mesh_setup.py's small quickstart (a model whose matrices the mesh divides) from its
  # warm-started checkpoint, its warm start continued (`mesh_setup.from_checkpoint`), keeping
  # the checkpoints the kill and the resume leave.
  path = tmp_path / "small_quickstart.py"
  path.write_text(textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
      import mesh_setup

      def get_config():
        config = mesh_setup.from_checkpoint(mesh_setup.small_config(), {checkpoint!r})
        config.checkpoint.keep = 3
        return config
      """))
  return str(path)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(config_path, workdir, log_name, *flags, devices=1):
  """Starts run.py on `devices` fake CPU devices; its stdout and stderr go to files (a full
  pipe would stall a process while the other one waits for it in a collective)."""
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  logs = (f"{workdir}.{log_name}.out", f"{workdir}.{log_name}.err")
  with open(logs[0], "w") as out, open(logs[1], "w") as err:
    process = subprocess.Popen([sys.executable, RUN, f"--config={config_path}",
                                f"--workdir={workdir}", *flags], cwd=ROOT, env=env,
                               stdout=out, stderr=err, text=True)
  return process, logs


def _two_processes(config_path, workdir, log_name):
  """Two processes of four devices each, training on the mesh fsdp 4 x tensor 2."""
  port = _free_port()
  return [_start(config_path, workdir, f"{log_name}{i}", *MESH,
                 "--config.scale.distributed.num_processes=2",
                 f"--config.scale.distributed.process_id={i}",
                 f"--config.scale.distributed.coordinator_address=localhost:{port}", devices=4)
          for i in range(2)]


def _logs(started):
  outputs = []
  for _, logs in started:
    with open(logs[0]) as out, open(logs[1]) as err:
      outputs.append((out.read(), err.read()))
  return outputs


def _finish(started):
  """(stdout, stderr) of each started process; fails if one exits non-zero or runs too long."""
  try:
    for process, _ in started:
      process.wait(timeout=TWO_PROCESS_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    for process, _ in started:
      process.kill()
    pytest.fail(f"a run did not finish in {TWO_PROCESS_TIMEOUT_S} s")
  outputs = _logs(started)
  for (process, _), (out, err) in zip(started, outputs):
    assert process.returncode == 0, (out + err)[-4000:]
  return outputs


def _kill_after_checkpoint(started, checkpoints: str, step: int):
  """SIGKILLs the processes as soon as checkpoint `step` is on disk (orbax renames its
  directory into place once every process has written its shards)."""
  deadline = time.monotonic() + TWO_PROCESS_TIMEOUT_S
  while not os.path.isdir(os.path.join(checkpoints, str(step))):
    for (process, _), (out, err) in zip(started, _logs(started)):
      assert process.poll() is None, (out + err)[-4000:]
    assert time.monotonic() < deadline, f"no checkpoint {step} in {TWO_PROCESS_TIMEOUT_S} s"
    time.sleep(0.05)
  for process, _ in started:
    process.send_signal(signal.SIGKILL)
  for process, _ in started:
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL


def _load(config_path):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("small_quickstart", config_path)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, ROOT)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.mark.slow
def test_two_processes_on_a_mesh_train_the_quickstart_like_one_device(tmp_path,
                                                                       small_checkpoint):
  config_path = _config_file(tmp_path, small_checkpoint)
  two = str(tmp_path / "two")
  killed = _two_processes(config_path, two, "killed")
  _kill_after_checkpoint(killed, os.path.join(two, "checkpoints"), 1)
  # Killed between iterations: after checkpoint 1, before iteration 2's.
  assert sorted(d for d in os.listdir(os.path.join(two, "checkpoints")) if d.isdigit()) == [
      "0", "1"]
  # Resumed by both processes from their joint checkpoint of iteration 1.
  (out0, err0), (out1, _) = _finish(_two_processes(config_path, two, "resumed"))
  assert "resumed from the checkpoint of iteration 1" in err0
  # Process 0 prints the held-out successes; process 1 none of them.
  assert out0.count("held-out success") == 3 and "held-out" not in out1

  records = metrics.read_jsonl(os.path.join(two, "metrics.jsonl"))
  assert [(r["phase"], r["iteration"]) for r in records
          if r["phase"] not in ("warm_start", "startup")] == [
      ("eval", 0), ("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
  # Each start compiled its program set (the decode programs on each process's four devices, the
  # update on all eight), and the iterations ran every program of the set from it.
  assert [r["startup_programs"] > 0 for r in records if r["phase"] == "startup"] == [True] * 2
  assert [r["compile_misses"] for r in records if r["phase"] == "train"] == [0, 0]
  config = _load(config_path)
  config.scale.num_devices = 1  # the reference: one device of this process
  exp, state = experiment_lib.build_experiment(from_config(config), two)
  try:
    _compare_warm_start(exp, state.params, records, config)
    start, _, _ = loop.restore_checkpoint(exp, state, 0)
    start_params = jax.tree.map(np.asarray, start.params)  # the update donates the state's
    final, reference = _one_device_iterations(exp, start)
    state_two, _, loop_two = loop.restore_checkpoint(exp, state)
  finally:
    exp.close()
  roundings = mesh_setup.update_roundings(
      exp.model_config, [r for r in reference if r["phase"] == "train"])
  _compare(records, reference, roundings)
  assert loop_two["iteration"] == 2 and int(state_two.step) == 2
  # The threshold is a running mean of quantiles of the states' float32 entropies, of about 1.
  saved, expected = loop_two["fork_threshold"], final["threshold"]
  assert saved["updates"] == expected["updates"]
  assert abs(saved["threshold"] - expected["threshold"]) <= tolerance.ulp_tol(
      np.float32, max(1.0, abs(expected["threshold"])), roundings)
  _assert_state_close(jax.tree.leaves(final["state"]), jax.tree.leaves(state_two), roundings)
  # The parameters moved beyond that tolerance at the largest of them.
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(start_params), jax.tree.leaves(state_two.params)))
  largest = max(float(np.abs(x).max()) for x in jax.tree.leaves(start_params))
  assert moved > tolerance.ulp_tol(np.float32, largest, roundings), moved


def _compare_warm_start(exp, params, records, config):
  """The mesh's warm start takes the steps of one device: each logged loss is one device's from
  the same checkpoint, on the same expert episodes, within the roundings of the steps before it
  and its own (`mesh_setup.step_roundings`, at the longest row and a batch of such rows)."""
  logged = [r for r in records if r["phase"] == "warm_start"]
  longest = translate.row_buckets(from_config(config))[-1]
  step = mesh_setup.step_roundings(exp.model_config, longest,
                                    config.warm_start.batch_size * longest)
  _, _, one = warm_start_lib.warm_start(exp, jax.tree.map(jnp.copy, params))  # one device
  assert [r["step"] for r in logged] == [r["step"] for r in one] == list(
      range(1, mesh_setup.CONTINUED_WARM_START["steps"] + 1))
  for a, b in zip(one, logged):
    atol = tolerance.ulp_tol(np.float32, max(1.0, abs(a["loss"])), a["step"] * step)
    assert abs(b["loss"] - a["loss"]) <= atol, (a["step"], a["loss"], b["loss"], atol)
    assert b["expert_episodes"] == a["expert_episodes"] == 16


def _one_device_iterations(exp, start):
  """Iterations 1 and 2 from `start` on one device, as the loop runs them; their records (and
  the final held-out evaluation) and the final state and fork threshold."""
  settings = exp.settings
  setup = loop.build_update(exp, start.params)
  assert setup.placement.mesh is None
  engine = rollout.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt, exp.pool,
                                 translate.rollout_config(settings))
  state, records = setup.placement.place(start), []
  threshold = iteration_lib.initial_fork_threshold(settings)
  for i in (1, 2):
    state, record, _, threshold = iteration_lib.run_iteration(
        exp, engine, setup.train_step, state, i, jax.random.key(settings.seed), threshold,
        setup.placement)
    records.append(metrics.clean_record(record))
  records.append(metrics.clean_record(evaluation.eval_record(exp, state.params, 2)))
  return {"state": jax.tree.map(np.asarray, state), "threshold": threshold}, records


def _compare(records, reference, roundings):
  """The two-process run's records of iterations 1 and 2 are those of one device."""
  train_two = [r for r in records if r["phase"] == "train"]
  train_one = [r for r in reference if r["phase"] == "train"]
  assert len(train_one) == len(train_two) == 2
  for a, b in zip(train_one, train_two):
    assert {k: b[k] for k in TREE_KEYS} == {k: a[k] for k in TREE_KEYS}
    # One device holds all of the state; on the mesh each holds about a quarter (the
    # embedding, whose odd vocabulary is not split over tensor, and the norms make the excess).
    assert a["state_bytes_per_device"] == a["state_bytes"]
    fraction = b["state_bytes_per_device"] / b["state_bytes"]
    assert 1 / SHARDS <= fraction <= 1.1 / SHARDS, fraction
    # Each process decoded its trees on its four devices, the parameters split over tensor 2.
    assert (a["decode_devices"], b["decode_devices"]) == (1, 8)
    fraction = b["sample_bytes_per_device"] / b["sample_bytes"]
    assert 1 / 2 <= fraction <= 1.1 / 2, fraction
  _assert_metrics_close(train_one, train_two, roundings)
  # Both updates have non-zero advantages and moved the parameters.
  assert min(r["success"] for r in train_one) > 0
  assert max(r["grad_norm"] for r in train_one) > 1.0
  evals = lambda rs: [(r["stage"], r["success_rate"], r["return"], r["episode_length"])
                      for r in rs if r["phase"] == "eval" and r["iteration"] == 2]
  assert evals(records) == evals(reference) and len(evals(reference)) == 1
