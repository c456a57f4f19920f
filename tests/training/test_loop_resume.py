"""The training loop: its pure pieces by hand, and kill -9 + resume == an uninterrupted run.

The resume tests run `experiments/run.py` with a tiny configuration: once without interruption,
and then killed with SIGKILL at random moments and resumed; with the latest checkpoint corrupt;
and on a small tmpfs that fills up under config.json and under a checkpoint. Each ends, once
resumed, with the uninterrupted run's parameters, optimiser state and metrics (wall-clock times
aside), exactly.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import tree as tree_lib
from bpo_jax.training import experiment
from bpo_jax.training import iteration
from bpo_jax.training import loop
from bpo_jax.training import metrics
from bpo_jax.training.settings import from_config
from bpo_jax.training.estimator_registry import advantages_and_weights

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
ITERATIONS = 2


def test_task_order_is_a_permutation_per_epoch_and_a_pure_function_of_position():
  order = experiment.task_order(5, seed=3, start=0, count=15)
  for epoch in range(3):
    assert sorted(order[5 * epoch:5 * epoch + 5]) == [0, 1, 2, 3, 4]
  assert order[:5] != order[5:10]  # epochs are shuffled differently
  assert experiment.task_order(5, 3, 0, 7) + experiment.task_order(5, 3, 7, 8) == order
  assert experiment.task_order(5, 4, 0, 15) != order


def test_iterations_start_at_the_task_offset():
  """Iteration i draws positions [o + (i-1)·T, o + i·T) of the seeded order; with o the warm
  start's episodes it begins on the tasks the warm start did not demonstrate."""
  import types  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.default_config()
  config.rollout.tasks_per_iteration, config.rollout.trees_per_task = 3, 2
  config.rollout.task_offset = 4
  exp = types.SimpleNamespace(settings=from_config(config),
                              train_tasks=[f"t{i}" for i in range(5)])
  order = experiment.task_order(5, config.seed, 0, 10)
  assert order[:5] != order[5:10]
  for i in (1, 2):
    expected = [f"t{order[4 + 3 * (i - 1) + j]}" for j in range(3)]
    assert iteration.iteration_tasks(exp, i) == [t for t in expected for _ in range(2)]
  demonstrated = experiment.task_order(5, config.seed, 0, 4)
  assert f"t{order[4]}" not in {f"t{p}" for p in demonstrated}


def test_a_key_added_since_the_run_resumes_only_at_its_default(tmp_path):
  """A workdir saved before a key existed resumes when the key is at its default (it changes
  nothing) and is refused, naming the key, when it is not."""
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.default_config()
  check = loop._check_workdir_config  # pylint: disable=protected-access
  saved = check(from_config(config), str(tmp_path))
  del saved["rollout"]["task_offset"]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  check(from_config(config), str(tmp_path))
  config.rollout.task_offset = 8
  with pytest.raises(config_lib.ConfigError, match=r"rollout.task_offset: the workdir .* holds "
                     r"a run with rollout.task_offset = None, not 8"):
    check(from_config(config), str(tmp_path))


def _stack(*trees):
  capacity = 4
  return jax.tree.map(jnp.asarray, tree_lib.stack_trees(
      [tree_lib.pad_tree(t, capacity) for t in trees]))


@pytest.mark.slow
def test_advantages_and_weights_by_hand():
  # A backbone step (reward 0) then a fork of two terminal steps with rewards 1 and 3:
  # Q = [2, 1, 3]; zero trunk baseline; sibling baselines 3 and 1.
  fork = tree_lib.from_parents([-1, 0, 0], [0.0, 1.0, 3.0], terminal=[False, True, True])
  chain = tree_lib.from_parents([-1], [1.0], terminal=[True])
  adv, w = advantages_and_weights(_stack(fork, chain), estimator="bpo", gamma=1.0)
  np.testing.assert_allclose(adv, [[2, -2, 2, 0], [1, 0, 0, 0]], atol=1e-6)
  np.testing.assert_allclose(w, [[1, 0.5, 0.5, 0], [1, 0, 0, 0]], atol=1e-6)
  # The same two trees as the two trees of one task, leave-one-out trunk baseline: the fork
  # tree's root value 2 and the chain's 1 are each other's trunk baselines.
  adv, _ = advantages_and_weights(_stack(fork, chain), estimator="bpo", gamma=1.0,
                                  trees_per_task=2, trunk="loo")
  np.testing.assert_allclose(adv, [[2 - 1, -2, 2, 0], [1 - 2, 0, 0, 0]], atol=1e-6)
  # Batch trunk baseline over three trees of different tasks: root values 2, 1 and 4, so the
  # trunk baselines are (1 + 4) / 2, (2 + 4) / 2 and (2 + 1) / 2.
  other = tree_lib.from_parents([-1], [4.0], terminal=[True])
  adv, _ = advantages_and_weights(_stack(fork, chain, other), estimator="bpo", gamma=1.0,
                                  trunk="batch")
  np.testing.assert_allclose(adv, [[2 - 2.5, -2, 2, 0], [1 - 3, 0, 0, 0], [4 - 1.5, 0, 0, 0]],
                             atol=1e-6)
  # RLOO on a group of three episodes with returns 1, 2, 6: G - mean of the others.
  group = tree_lib.from_parents([-1, -1, -1], [1.0, 2.0, 6.0], terminal=[True] * 3)
  adv, w = advantages_and_weights(_stack(group), estimator="rloo", gamma=1.0)
  np.testing.assert_allclose(adv, [[1 - 4, 2 - 3.5, 6 - 1.5, 0]], atol=1e-6)
  np.testing.assert_allclose(w, [[1 / 3, 1 / 3, 1 / 3, 0]], atol=1e-6)


def test_explained_share_averages_the_trees_whose_returns_differ():
  # estimators.prefix_explained_variance's example: path returns 1, 2, 4 (weights 1/2, 1/4,
  # 1/4, variance 1.5) and last-fork means 2, 3, 3 (variance 0.5): 1/3.
  fork = tree_lib.from_parents([-1, 0, 0, 1, 1], [0.0, 0.0, 1.0, 2.0, 4.0],
                               terminal=[False, False, True, True, True])
  # Two leaves of return 1 (nothing to explain): left out of the mean.
  equal = tree_lib.from_parents([-1, 0, 0], [0.0, 1.0, 1.0], terminal=[False, True, True])
  # One leaf: its return varies over nothing.
  chain = tree_lib.from_parents([-1], [1.0], terminal=[True])
  # Two leaves with returns 0 and 1 at a fork of the root: the fork's mean 0.5 is both paths'
  # estimate of E[G], so it explains none of the variance.
  root_fork = tree_lib.from_parents([-1, 0, 0], [0.0, 0.0, 1.0], terminal=[False, True, True])
  capacity = 6
  trees = tree_lib.stack_trees([tree_lib.pad_tree(t, capacity)
                                for t in (fork, equal, chain, root_fork)])
  returns = [[1.0, 2.0, 4.0], [1.0, 1.0], [1.0], [0.0, 1.0]]
  stats = iteration.explained_share_stats(trees, returns, gamma=1.0)
  assert stats["variance_trees"] == 2
  assert stats["prefix_explained_share"] == pytest.approx((1 / 3 + 0) / 2, abs=1e-6)
  assert iteration.explained_share_stats(trees, [[1.0], [1.0, 1.0], [1.0], []], 1.0) == {
      "prefix_explained_share": 0.0, "variance_trees": 0}


def _config_file(tmp_path):
  path = tmp_path / "tiny.py"
  path.write_text(textwrap.dedent(f"""
      from experiments.configs import base

      def get_config():
        config = base.tiny(base.rooms("bpo"), iterations={ITERATIONS})
        config.rollout.entropy_quantile = 0.5  # the running threshold is loop state too
        config.rollout.signal_rounds = 2  # an iteration's rounds are resumed too
        return config
      """))
  return str(path)


def _run(config_path, workdir, *extra):
  return subprocess.run([sys.executable, RUN, f"--config={config_path}",
                         f"--workdir={workdir}", *extra], cwd=ROOT, capture_output=True,
                        text=True, timeout=600)


def _train_records(workdir):
  return [metrics.deterministic_part(r)
          for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


def _checkpoint_steps(workdir):
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


@pytest.fixture(name="straight", scope="module")
def _straight(tmp_path_factory):
  """(config file, workdir, seconds) of the tiny run without interruption."""
  tmp_path = tmp_path_factory.mktemp("straight")
  config_path = _config_file(tmp_path)
  workdir = str(tmp_path / "run")
  start = time.time()
  result = _run(config_path, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "held-out success, untrained model: " in result.stdout
  assert "held-out success, after the warm start (iteration 0): " in result.stdout
  assert f"held-out success, after iteration {ITERATIONS}: " in result.stdout
  phases = [r["phase"] for r in _train_records(workdir)]
  assert phases.count("train") == ITERATIONS and phases.count("eval") == 3
  stages = [r["stage"] for r in _train_records(workdir) if r["phase"] == "eval"]
  assert stages == ["init", "warm_start", "train"]
  rounds = [r["signal_rounds"] for r in _train_records(workdir) if r["phase"] == "train"]
  assert 2 in rounds, rounds  # an iteration drew a second round
  return config_path, workdir, time.time() - start


def _kill_at(config_path, workdir, seconds):
  """Starts the run and kills it with SIGKILL after `seconds`; whether it was still running."""
  process = subprocess.Popen([sys.executable, RUN, f"--config={config_path}",
                              f"--workdir={workdir}"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    process.wait(timeout=seconds)
  except subprocess.TimeoutExpired:
    os.kill(process.pid, signal.SIGKILL)
  process.wait()
  assert process.returncode in (0, -signal.SIGKILL), process.returncode
  return process.returncode == -signal.SIGKILL


def _assert_same_run(straight, workdir, config_path):
  """The metrics record by record (wall-clock times aside), the checkpoints kept, and the final
  parameters and optimiser state bit for bit."""
  assert _checkpoint_steps(workdir) == _checkpoint_steps(straight)
  assert _train_records(workdir) == _train_records(straight)
  config = _load(config_path)
  _, state_a, loop_a = loop.load_checkpoint(from_config(config), straight)
  _, state_b, loop_b = loop.load_checkpoint(from_config(config), workdir)
  assert loop_a["iteration"] == loop_b["iteration"] == ITERATIONS
  assert loop_a["fork_threshold"] == loop_b["fork_threshold"]
  assert int(state_a.step) == int(state_b.step) == ITERATIONS
  leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
  assert len(leaves_a) == len(leaves_b) > 10
  for a, b in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_kill_at_random_moments_and_resume_equals_uninterrupted_run(tmp_path, straight):
  """Killed with SIGKILL twice, at moments drawn at random over the uninterrupted run's span
  (the seed is in the assertion messages; KILL_SEED repeats it), then resumed to the end."""
  config_path, straight_dir, seconds = straight
  seed = int(os.environ.get("KILL_SEED", time.time_ns() % 2**31))
  rng = random.Random(seed)
  interrupted = str(tmp_path / "interrupted")
  # A resumed run is shorter than a fresh one and the compilation cache is warm by now: the
  # moments are drawn over the first half of the uninterrupted run's span.
  moments = [rng.uniform(0.1, 0.5) * seconds for _ in range(2)]
  killed = [_kill_at(config_path, interrupted, t) for t in moments]
  assert any(killed), f"KILL_SEED={seed}: both kills ({moments}) came after the run's end"
  lock = os.path.join(interrupted, "run.lock")
  left = os.path.exists(lock) and os.path.getsize(lock) > 0  # a killed holder's name
  result = _run(config_path, interrupted)
  assert result.returncode == 0, f"KILL_SEED={seed} {moments}: {result.stderr[-3000:]}"
  assert ("took over the lock of pid " in result.stderr) == left, f"KILL_SEED={seed}"
  assert not os.path.exists(lock)  # released
  _assert_same_run(straight_dir, interrupted, config_path)

  # Evaluation mode scores the latest checkpoint: the numbers of the run's final evaluation.
  result = _run(config_path, interrupted, "--mode=eval")
  assert result.returncode == 0, result.stderr[-3000:]
  final_eval = [r for r in _train_records(straight_dir) if r["phase"] == "eval"][-1]
  with open(os.path.join(interrupted, "eval.json")) as f:
    evaluated = metrics.deterministic_part(json.load(f))
  assert evaluated == final_eval
  assert f"held-out success {final_eval['success_rate']:.3f}" in result.stdout


@pytest.mark.slow
def test_a_corrupt_latest_checkpoint_is_named_and_the_run_goes_on_from_the_one_before(
    tmp_path, straight):
  """A flipped byte in the last checkpoint: evaluation names it and scores the one before; a
  resume sets it aside, trains its iteration again and ends as the uninterrupted run. With no
  intact checkpoint left, one line and exit status 2."""
  from tests.training import test_checkpoint_integrity as integrity  # pylint: disable=g-import-not-at-top
  config_path, straight_dir, _ = straight
  workdir = str(tmp_path / "run")
  shutil.copytree(straight_dir, workdir)
  last = os.path.join(workdir, "checkpoints", str(ITERATIONS))
  integrity._damage(last, "flipped bytes")  # pylint: disable=protected-access
  result = _run(config_path, workdir, "--mode=eval")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"checkpoint {ITERATIONS} in {os.path.join(workdir, 'checkpoints')} does not restore " \
         "(ValueError: its file state/" in result.stderr
  with open(os.path.join(workdir, "eval.json")) as f:
    assert json.load(f)["iteration"] == ITERATIONS - 1
  assert _checkpoint_steps(workdir) == _checkpoint_steps(straight_dir)  # an evaluation moves none

  result = _run(config_path, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"moved the unrestorable checkpoint {ITERATIONS} to " in result.stderr
  assert len(os.listdir(os.path.join(workdir, "unrestorable_checkpoints"))) == 1
  _assert_same_run(straight_dir, workdir, config_path)

  for step in _checkpoint_steps(workdir):
    integrity._damage(os.path.join(workdir, "checkpoints", str(step)), "truncated data file")  # pylint: disable=protected-access
  result = _run(config_path, workdir, "--mode=eval")
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and errors[0].startswith(
      f"error: no checkpoint in {os.path.join(workdir, 'checkpoints')} restores: "
      f"checkpoint {ITERATIONS}: "), result.stderr[-3000:]


@pytest.mark.slow
def test_a_full_disk_leaves_the_workdir_resumable(tmp_path, straight):
  """On a small tmpfs: config.json rewritten onto a full filesystem, then checkpoint 2 written
  onto one without room for it. Each is one line and exit status 1, the files before stay whole
  (config.json, checkpoints 0 and 1, no temporary directory), and once there is room the run
  resumes to the uninterrupted run's metrics and parameters."""
  from tests.training import test_workdir  # pylint: disable=g-import-not-at-top
  config_path, straight_dir, _ = straight
  no_tensorboard = "--config.log.tensorboard=false"  # its writer thread is not the run's
  with test_workdir.small_filesystem(tmp_path / "fs", 4096) as fs:
    workdir = os.path.join(fs, "run")
    result = _run(config_path, workdir, no_tensorboard, "--stop_after=1")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(workdir, "config.json")) as f:
      record = f.read()

    filler = test_workdir.fill(fs)
    result = _run(config_path, workdir, no_tensorboard, "--config.checkpoint.keep=3")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    config_json = os.path.join(workdir, "config.json")
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot write {config_json}: No space left on device")
    with open(config_json) as f:
      assert f.read() == record
    os.remove(filler)

    size = sum(os.path.getsize(os.path.join(root, name)) for root, _, names
               in os.walk(os.path.join(workdir, "checkpoints", "1")) for name in names)
    filler = test_workdir.fill(fs, leave_bytes=max(size // 2, 64 << 10))
    result = _run(config_path, workdir, no_tensorboard, "--config.checkpoint.keep=3")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.fullmatch(
        rf"error: cannot write checkpoint {ITERATIONS} to "
        rf"{re.escape(os.path.join(workdir, 'checkpoints'))}: No space left on device \(0\.\d "
        r"MiB free, the state takes \d\.\d MiB\); the checkpoints before it are intact",
        result.stderr.strip().splitlines()[-1]), result.stderr[-3000:]
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["0", "1"]
    os.remove(filler)

    result = _run(config_path, workdir, no_tensorboard, "--config.checkpoint.keep=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _train_records(workdir) == _train_records(straight_dir)
    assert _checkpoint_steps(workdir) == [0, 1, 2]  # keep=3 from the second start on
    config = _load(config_path)
    _, state_a, _ = loop.load_checkpoint(from_config(config), straight_dir)
    _, state_b, _ = loop.load_checkpoint(from_config(config), workdir)
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_resume_compiles_the_start_up_set_only_with_iterations_left(tmp_path, straight):
  """`scale.startup_compile=on` on a copy of the finished run: restored first, nothing left to
  run, so nothing compiled and no "startup" record. One iteration more: one set compiled and
  one record, at the iteration the run resumed from, the earlier records as they were."""
  config_path, straight_dir, _ = straight
  workdir = str(tmp_path / "run")
  shutil.copytree(straight_dir, workdir)
  before = _train_records(workdir)
  on = ("--config.scale.startup_compile=on", "--config.log.progress_bar=false")
  result = _run(config_path, workdir, *on)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "start-up compile" not in result.stderr, result.stderr[-3000:]
  assert _train_records(workdir) == before

  result = _run(config_path, workdir, *on, f"--config.train.iterations={ITERATIONS + 1}")
  assert result.returncode == 0, result.stderr[-3000:]
  totals = re.findall(r"start-up compile: (\d+) programs in ", result.stderr)
  assert len(totals) == 1, result.stderr[-3000:]
  after = _train_records(workdir)
  startup = [r for r in after if r["phase"] == "startup"]
  assert [r["iteration"] for r in startup] == [ITERATIONS], startup
  assert startup[0]["startup_programs"] == int(totals[0]) > 0
  assert after[:len(before)] == before
  assert [r["phase"] for r in after[len(before):]] == ["startup", "train", "eval"]


def _load(config_path):
  import importlib.util  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, ROOT)
  spec = importlib.util.spec_from_file_location("tiny_config", config_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()
