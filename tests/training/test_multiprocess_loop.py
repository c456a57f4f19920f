"""Two processes on localhost (JAX distributed, Gloo on CPU) train like one process.

`experiments/run.py` is run on a small quickstart configuration three ways: by one process
straight through, and by two processes that stop after iteration 1 and then resume from their
joint checkpoint. Each of the two processes grows the trees of half of the tasks with its own
sandboxes and feeds half of the rows of the packed batch to the sharded update; the trees, the
metrics and the final parameters must be those of the one-process run (parameters to 1e-5: the
gradient's sums run in another order).
"""

import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from bpo_jax import rollout
from bpo_jax.training import checkpoint as checkpoint_lib
from bpo_jax.training import config as config_lib
from bpo_jax.training import distributed
from bpo_jax.training import loop
from bpo_jax.training import metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
TIMEOUT_S = 420

# Counts that depend only on the trees (they must be equal, not close).
TREE_KEYS = ("success", "tree_success", "return", "leaves", "nodes", "forks", "env_steps",
             "tokens_processed", "tokens_decoded", "unique_tokens", "num_action_tokens",
             "row_length", "fork_threshold", "state_entropy_mean")
# Numbers of the update (float sums in another order across processes).
UPDATE_KEYS = ("loss", "grad_norm", "approx_kl", "entropy", "advantage_mean", "advantage_std")


def _config_file(tmp_path):
  # A quickstart with a smaller model and warm start, 4 tasks per iteration; the warm start is
  # long enough for a tree of iteration 1 to succeed, so the update moves the parameters.
  path = tmp_path / "small_quickstart.py"
  path.write_text(textwrap.dedent("""
      from experiments.configs import base

      def get_config():
        config = base.tiny(base.rooms("bpo"), iterations=2)
        config.model.hidden_size = 64
        config.model.intermediate_size = 128
        config.model.num_layers = 2
        config.model.num_heads = 4
        config.model.num_kv_heads = 2
        config.model.head_dim = 16
        config.warm_start.steps = 200
        config.warm_start.num_trajectories = 16
        config.warm_start.batch_size = 8
        config.rollout.tasks_per_iteration = 4
        config.checkpoint.keep = 3
        config.log.tensorboard = False
        return config
      """))
  return str(path)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(config_path, workdir, log_name, *flags):
  """Starts run.py; its stdout and stderr go to files (a full pipe would stall a process while
  the other one waits for it in a collective)."""
  # One CPU device per process: the two-process mesh then has one device per process.
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": "1", "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  logs = (f"{workdir}.{log_name}.out", f"{workdir}.{log_name}.err")
  with open(logs[0], "w") as out, open(logs[1], "w") as err:
    process = subprocess.Popen([sys.executable, RUN, f"--config={config_path}",
                                f"--workdir={workdir}", *flags], cwd=ROOT, env=env,
                               stdout=out, stderr=err, text=True)
  return process, logs


def _two_processes(config_path, workdir, log_name, *flags):
  port = _free_port()
  return [_start(config_path, workdir, f"{log_name}{i}", *flags,
                 "--config.scale.distributed.num_processes=2",
                 f"--config.scale.distributed.process_id={i}",
                 f"--config.scale.distributed.coordinator_address=localhost:{port}")
          for i in range(2)]


def _finish(started):
  """(stdout, stderr) of each started process; fails if one exits non-zero or runs too long."""
  try:
    for process, _ in started:
      process.wait(timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:
    for process, _ in started:
      process.kill()
    pytest.fail(f"a run did not finish in {TIMEOUT_S} s")
  outputs = []
  for process, logs in started:
    with open(logs[0]) as out, open(logs[1]) as err:
      outputs.append((out.read(), err.read()))
    assert process.returncode == 0, (outputs[-1][0] + outputs[-1][1])[-4000:]
  return outputs


def _load(config_path):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("small_quickstart", config_path)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, ROOT)
  spec.loader.exec_module(module)
  return module.get_config()


def test_two_processes_train_the_quickstart_like_one(tmp_path):
  config_path = _config_file(tmp_path)
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  single = [_start(config_path, one, "run")]
  first_half = _two_processes(config_path, two, "first", "--stop_after=1")
  (single_out, _), = _finish(single)
  _finish(first_half)
  assert sorted(d for d in os.listdir(os.path.join(two, "checkpoints")) if d.isdigit()) == [
      "0", "1"]
  # Resumed by both processes from their joint checkpoint of iteration 1.
  (out0, err0), (out1, _) = _finish(_two_processes(config_path, two, "resumed"))
  assert "resumed from the checkpoint of iteration 1" in err0

  # Process 0 prints what the one-process run prints; process 1 none of it (Gloo's own
  # connection line aside).
  held_out = [line for line in single_out.splitlines() if line.startswith("held-out success")]
  assert len(held_out) == 3
  assert [line for line in out0.splitlines() if line.startswith("held-out")] == held_out
  assert "held-out" not in out1 and out0.count("held-out") == 3

  # Metrics: written once (by process 0), tree for tree those of the one-process run.
  records_one = metrics.read_jsonl(os.path.join(one, "metrics.jsonl"))
  records_two = metrics.read_jsonl(os.path.join(two, "metrics.jsonl"))
  assert [(r["phase"], r["iteration"]) for r in records_two] == [
      (r["phase"], r["iteration"]) for r in records_one]
  train_one = [r for r in records_one if r["phase"] == "train"]
  train_two = [r for r in records_two if r["phase"] == "train"]
  assert len(train_one) == 2
  for a, b in zip(train_one, train_two):
    assert {k: b[k] for k in TREE_KEYS} == pytest.approx({k: a[k] for k in TREE_KEYS},
                                                         rel=1e-6, abs=1e-6)
    for key in UPDATE_KEYS:
      assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
  assert max(r["grad_norm"] for r in train_one) > 1.0  # the update did move the parameters
  evals = lambda records: [(r["stage"], r["success_rate"], r["return"], r["episode_length"])
                           for r in records if r["phase"] == "eval"]
  assert evals(records_two) == evals(records_one)
  assert loop.summarize(records_two, two)["eval_end"] == loop.summarize(records_one,
                                                                        one)["eval_end"]

  # The final parameters and optimiser state, restored here in one process.
  config = _load(config_path)
  _, state_one, loop_one = loop.load_checkpoint(config, one)
  _, state_two, loop_two = loop.load_checkpoint(config, two)
  assert loop_one["iteration"] == loop_two["iteration"] == 2
  assert loop_one["fork_threshold"] == pytest.approx(loop_two["fork_threshold"], rel=1e-6)
  assert int(state_two.step) == 2
  leaves_one, leaves_two = jax.tree.leaves(state_one), jax.tree.leaves(state_two)
  assert len(leaves_one) == len(leaves_two) > 10
  for a, b in zip(leaves_one, leaves_two):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
  # Far beyond that tolerance from the warm start's parameters (checkpoint 0).
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(two, "checkpoints"), create=False)
  start, _ = checkpointer.restore(0, state_two)
  checkpointer.close()
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(start.params), jax.tree.leaves(state_two.params)))
  assert moved > 1e-4


def test_too_few_tasks_for_the_processes_are_named():
  config = config_lib.default_config()
  config.scale.distributed.num_processes = 4
  config.scale.distributed.coordinator_address = "localhost:1234"
  config.rollout.tasks_per_iteration = 3
  config.eval.num_tasks = 2
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate(config)
  message = str(error.value)
  assert ("rollout.tasks_per_iteration x rollout.trees_per_task = 3: fewer trees than "
          "scale.distributed.num_processes = 4") in message
  assert "eval.num_tasks = 2: fewer held-out tasks than scale.distributed.num_processes" in (
      message)


def test_process_share_splits_contiguously_and_evenly():
  shares = [distributed.process_share(10, i, 4) for i in range(4)]
  assert shares == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
  assert [distributed.process_share(3, i, 3) for i in range(3)] == [range(0, 1), range(1, 2),
                                                                    range(2, 3)]
  assert distributed.process_share(5, 1, 2) == range(3, 5)
  assert distributed.process_share(2, 2, 3) == range(2, 2)  # more processes than items
  assert distributed.process_share(7) == range(0, 7)  # this one process
  with pytest.raises(ValueError, match=r"process_index must be in \[0, 1\], got 2"):
    distributed.process_share(4, 2, 2)
  with pytest.raises(ValueError, match="num_items must be >= 0, got -1"):
    distributed.process_share(-1, 0, 2)
  # One process: allgather_objects gives back the object itself, in a list.
  value = {"a": [1, 2]}
  assert distributed.allgather_objects(value)[0] is value


def test_rollout_batches_concatenate_in_order():
  def batch(tasks, forks, seconds, turns):
    return rollout.RolloutBatch(
        rollouts=list(tasks), compute=rollout.Compute(forks=forks, env_steps=2 * forks),
        phase_seconds={"decode": seconds, "env": 1.0}, device_row_tokens=10 * forks,
        turns=turns, threshold=0.5)

  whole = rollout.RolloutBatch.concatenate([batch("ab", 1, 2.0, 3), batch("c", 2, 1.0, 5)])
  assert whole.rollouts == ["a", "b", "c"]
  assert whole.compute == rollout.Compute(forks=3, env_steps=6)
  assert whole.phase_seconds == {"decode": 2.0, "env": 1.0}
  assert (whole.device_row_tokens, whole.turns, whole.threshold) == (30, 5, 0.5)
  one = batch("a", 1, 1.0, 1)
  assert rollout.RolloutBatch.concatenate([one]) is one
  other = batch("b", 1, 1.0, 1)
  other.threshold = 0.7
  with pytest.raises(ValueError, match=r"different fork thresholds: \[0.5, 0.7\]"):
    rollout.RolloutBatch.concatenate([one, other])
  with pytest.raises(ValueError, match="at least one batch"):
    rollout.RolloutBatch.concatenate([])
