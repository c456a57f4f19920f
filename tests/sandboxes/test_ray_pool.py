"""The pool on Ray, on a local cluster of two simulated sandbox nodes (and a head that offers no
CPUs, as an accelerator host): forks replay byte for byte across nodes; an actor killed in the
middle of a step, a step past its time limit and a node that goes away are failed branches with
their reason while the rest goes on; a `:tiny` rooms run gives the process pool's metrics.

Every Ray process listens on 127.0.0.1 only (`testing/ray_cluster.py`)."""

import functools
import importlib
import os
import threading

import pytest

from bpo_jax.testing import ray_cluster

ray_cluster.use_loopback()  # before ray is imported
ray = pytest.importorskip("ray")

# pylint: disable=g-import-not-at-top,wrong-import-position
from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import faults
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import ray_pool
from bpo_jax.sandboxes import registry
from bpo_jax.sandboxes import rooms
from bpo_jax.training import config as config_lib
from bpo_jax.training import loop
from bpo_jax.training import metrics

FAULTY = functools.partial(faults.make_sandbox, inner="rooms")

GAMES_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                         "textworld_games")

# name -> (task config, prefix actions, three fork actions, continuation); frozenlake's slips
# come from the generator inside the snapshot, TextWorld's state from its engine's.
CASES = {
    "rooms": ({"difficulty": 3}, ["take red key"], ["go north", "open red door", "take red key"],
              ["go south", "go north", "look"]),
    "frozenlake": ({}, ["right"], ["down", "right", "up"], ["down", "right"] * 4),
    "textworld": ({"games_dir": GAMES_DIR}, ["look"],
                  ["go north", "examine box", "unlock box with keycard"],
                  ["open box", "take desktop computer from box", "inventory", "look"]),
}


def _task(name, task_config):
  module = registry.get_environment(name)
  if name == "rooms":  # a task the prefix does not finish
    return module.make_tasks("test", 1, 0, **task_config)[0]
  tasks = module.make_tasks("train", 2, 0, **task_config)
  if name == "textworld":  # the fixture game whose objects the actions name
    return next(t for t in tasks if t.task_id.endswith("custom-s1"))
  return tasks[0]


@pytest.fixture(scope="module")
def cluster():
  with ray_cluster.local_cluster(num_nodes=2, cpus_per_node=2) as (c, nodes):
    yield c, nodes


def _local_replay(name, task, snapshot, actions):
  """The steps of `actions` from `snapshot`, in this process."""
  sandbox = registry.get_environment(name).make_sandbox()
  sandbox.reset(task)
  return base.replay(sandbox, snapshot, actions)


def _pool_replay(pool, branch, actions):
  """As `base.replay`, in the pool's `branch`: the steps up to the first done one."""
  steps = []
  for action in actions:
    steps.append(pool.step(branch, action))
    if steps[-1].done:
      break
  return steps


def _place_on_worker(pool, branch, snapshot, worker):
  """Restores `snapshot` into `branch` on worker `worker` (new branches go to the least-loaded
  worker, so padding the other one sends it there)."""
  for pad in range(4):
    assert pool.restore(branch, snapshot) is None
    if pool.worker_of(branch) == worker:
      return
    pool.close(branch)
    pool.restore(f"pad{pad}", snapshot)
  raise AssertionError(f"could not place {branch!r} on worker {worker}")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_forks_replay_byte_for_byte_on_both_nodes(cluster, name):
  _, nodes = cluster
  task_config, prefix, forks, continuation = CASES[name]
  task = _task(name, task_config)
  with ray_pool.RaySandboxPool.for_environment(name, num_workers=2, timeout_s=60.0) as pool:
    assert sorted(pool.worker_nodes()) == sorted(n.node_id for n in nodes)  # one per node
    pool.reset("root", task)
    for action in prefix:
      assert not pool.step("root", action).done
    snapshot = pool.snapshot("root")
    branches = [f"fork{i}" for i in range(3)]
    assert all(r is None for r in pool.restore_many({b: snapshot for b in branches}).values())
    assert {pool.node_of(b) for b in branches} == {n.node_id for n in nodes}
    for branch, action in zip(branches, forks):
      actions = [action] + continuation[:3]
      got = _pool_replay(pool, branch, actions)
      assert got == _local_replay(name, task, snapshot, actions), (name, branch)
    # A snapshot taken on one node replays on the other, byte for byte.
    middle = pool.snapshot("fork0")
    other = 1 - pool.worker_of("fork0")
    _place_on_worker(pool, "copy", middle, other)
    assert pool.node_of("copy") != pool.node_of("fork0")
    rest = continuation[3:6] or continuation[:2]
    assert _pool_replay(pool, "copy", rest) == _local_replay(name, task, middle, rest)


def _kill_during_step(pool, worker, delay_s):
  """Kills worker `worker`'s actor from another thread `delay_s` after the call starts."""
  actor = pool._workers[worker].actor  # pylint: disable=protected-access
  timer = threading.Timer(delay_s, lambda: ray.kill(actor, no_restart=True))
  timer.start()
  return timer


def _local_steps(task, actions):
  sandbox = rooms.make_sandbox()
  sandbox.reset(task)
  return [sandbox.step(a) for a in actions]


@pytest.mark.slow
def test_a_killed_actor_a_segfault_and_a_timeout_fail_only_their_branches(cluster):
  del cluster
  tasks = rooms.make_tasks("train", 4, 0, difficulty=2)
  with ray_pool.RaySandboxPool(FAULTY, num_workers=2, timeout_s=6.0) as pool:
    pool.reset_many(dict(enumerate(tasks)))
    assert [pool.worker_of(b) for b in range(4)] == [0, 1, 0, 1]
    pool.step_many({2: "go north", 3: "look"})
    # Branch 0 hangs and its actor is killed mid-step; branch 1's actor segfaults; branches 2
    # and 3 wait behind them in the same actors and continue in the replacements.
    timer = _kill_during_step(pool, 0, delay_s=2.0)
    results = pool.step_many({0: "fault hang", 1: "fault segfault", 2: "go south", 3: "look"})
    timer.join()
    assert results[0] == pool_lib.BranchFailure(
        0, "step", "sandbox actor died because it was killed by `ray.kill`")
    assert results[1] == pool_lib.BranchFailure(
        1, "step", "sandbox actor died because its worker process has died")
    assert results[2] == _local_steps(tasks[2], ["go north", "go south"])[-1]
    assert results[3] == _local_steps(tasks[3], ["look", "look"])[-1]
    stats = pool.stats()
    assert stats["replaced_workers"] == 2 and stats["recovered_branches"] == 2
    # A step past its time limit: the actor is killed and replaced, the neighbour goes on.
    results = pool.step_many({2: "fault hang", 3: "go north"})
    assert results[2].reason == "step timed out after 6 s"
    assert results[3] == _local_steps(tasks[3], ["look", "look", "go north"])[-1]
    assert set(pool.failures) == {0, 1, 2} and pool.stats()["replaced_workers"] == 3
    # The run goes on: a failed branch comes back with a reset.
    assert pool.reset(0, tasks[0]) == rooms.make_sandbox().reset(tasks[0])


@pytest.mark.slow
def test_a_node_that_goes_away_fails_its_call_and_the_pool_moves_on(cluster):
  c, _ = cluster
  ray_cluster.add_node(c)  # the cluster keeps two sandbox nodes after the removal
  tasks = rooms.make_tasks("train", 3, 0, difficulty=2)
  with ray_pool.RaySandboxPool(FAULTY, num_workers=2, timeout_s=60.0) as pool:
    pool.reset_many({"a": tasks[0], "b": tasks[1], "c": tasks[2]})
    doomed = pool.node_of("a")
    assert pool.node_of("c") == doomed and pool.node_of("b") != doomed
    node = next(n for n in c.list_all_nodes() if n.node_id == doomed)
    timer = threading.Timer(2.0, lambda: c.remove_node(node))
    timer.start()
    results = pool.step_many({"a": "fault hang", "b": "go north", "c": "go north"})
    timer.join()
    assert results["a"] == pool_lib.BranchFailure("a", "step",
                                              "sandbox actor died because its node has died")
    assert results["b"] == _local_steps(tasks[1], ["go north"])[0]
    assert results["c"] == _local_steps(tasks[2], ["go north"])[0]  # from its backup
    assert doomed not in pool.worker_nodes() and pool.stats()["replaced_workers"] == 1
    assert pool.step("c", "go south") == _local_steps(tasks[2], ["go north", "go south"])[1]


def _tiny_rooms(workdir, backend):
  config = importlib.import_module("experiments.configs.rooms").get_config("tiny")
  config.env.num_workers = 2
  config.env.pool.backend = backend
  config.scale.num_devices = 1
  loop.train(config, str(workdir))
  return [metrics.deterministic_part(r)
          for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


@pytest.mark.slow
def test_a_tiny_rooms_run_on_ray_matches_the_process_pool_record_by_record(cluster, tmp_path):
  del cluster  # the run's pool joins the cluster this process is connected to
  on_processes = _tiny_rooms(tmp_path / "processes", "processes")
  on_ray = _tiny_rooms(tmp_path / "ray", "ray")
  assert len(on_processes) >= 3  # the evaluation before training and two iterations at least
  assert on_ray == on_processes


def test_config_names_a_bad_backend_in_one_line():
  config = config_lib.default_config()
  config.env.pool.backend = "threads"
  with pytest.raises(config_lib.ConfigError, match="env.pool.backend = 'threads': must be one "
                     "of 'processes', 'ray'"):
    config_lib.validate(config)
  config.env.pool.backend = "ray"
  config.env.num_workers = 0
  with pytest.raises(config_lib.ConfigError, match="needs env.num_workers >= 1"):
    config_lib.validate(config)
