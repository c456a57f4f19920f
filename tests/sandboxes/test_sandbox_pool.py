"""The worker pool: faults fail only their own branch, workers are replaced, the rest goes on."""

import functools

import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import faults
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import rooms

TIMEOUT_S = 1.5
FACTORY = functools.partial(faults.make_sandbox, inner="rooms")


def _tasks(n):
  return rooms.make_tasks("train", n, 0, difficulty=2)


def _local_step(task, action):
  sandbox = rooms.make_sandbox()
  sandbox.reset(task)
  return sandbox.step(action)


@pytest.fixture()
def pool():
  p = pool_lib.SandboxPool(FACTORY, num_workers=2, timeout_s=TIMEOUT_S)
  yield p
  p.shutdown()


def test_every_fault_fails_only_its_branch_and_the_pool_keeps_its_size(pool):
  tasks = _tasks(6)
  first = pool.reset_many(dict(enumerate(tasks)))
  assert all(isinstance(o, str) and o.startswith("Goal:") for o in first.values())
  assert [pool.worker_of(b) for b in range(6)] == [0, 1, 0, 1, 0, 1]
  pids_before = pool.worker_pids()
  actions = {0: "fault raise", 1: "fault hang", 2: "fault segfault", 3: "fault exit",
             4: "go north", 5: "take pear"}
  results = pool.step_many(actions)
  assert isinstance(results[0], pool_lib.BranchFailure)
  assert "RuntimeError: injected fault" in results[0].reason
  assert results[1].reason == f"step timed out after {TIMEOUT_S:g} s"
  assert results[2].reason == "worker process was killed by SIGSEGV"
  assert results[3].reason == "worker process exited with code 3"
  # The healthy branches finished, with the same Step a local sandbox gives.
  for b in (4, 5):
    assert results[b] == _local_step(tasks[b], actions[b])
  # Same size, fresh processes (each worker replaced twice: raise then segfault; hang then exit).
  pids_after = pool.worker_pids()
  assert len(pids_after) == 2 and pids_after[0] != pids_before[0]
  assert pids_after[1] != pids_before[1]
  stats = pool.stats()
  assert stats["failures"] == 4 and stats["replaced_workers"] == 4
  assert stats["steps"] == 2 and stats["resets"] == 6
  # Live branches were moved into the replacements from their backups: 2 and 4 after the raise,
  # 4 again after the segfault; 3 and 5 after the hang, 5 again after branch 3's exit.
  assert stats["recovered_branches"] == 6
  assert sorted(pool.branches()) == [4, 5]
  assert set(pool.failures) == {0, 1, 2, 3}
  # A failed branch answers with its failure record; resetting it brings it back.
  assert pool.step(2, "go north") == results[2]
  assert pool.reset(2, tasks[2]) == first[2]
  assert pool.step(2, "go north") == _local_step(tasks[2], "go north")


def test_branch_state_survives_its_worker_being_replaced(pool):
  tasks = _tasks(2)
  pool.reset_many({"a": tasks[0], "b": tasks[0]})
  assert pool.worker_of("a") != pool.worker_of("b")
  plan = rooms.expert_actions(tasks[0])
  pool.step("a", plan[0])
  pool.restore("c", pool.snapshot("a"))  # lands next to "b" ... or "a": either way a sibling
  victim = pool.worker_of("c")
  neighbour = "a" if pool.worker_of("a") == victim else "b"
  pool.reset("crash", tasks[1])
  if pool.worker_of("crash") != victim:
    pool.close("crash")
    pool.restore("pad", pool.snapshot("a"))
    pool.reset("crash", tasks[1])
  assert pool.worker_of("crash") == victim
  assert pool.step("crash", "fault exit").reason == "worker process exited with code 3"
  # "c" continues from where it was, in the new process.
  rest = [pool.step("c", a) for a in plan[1:]]
  assert rest[-1].reward == 1.0 and rest[-1].info["success"]
  assert neighbour in pool.branches()


def test_without_backups_co_located_branches_are_lost_with_a_reason():
  with pool_lib.SandboxPool(FACTORY, num_workers=1, timeout_s=TIMEOUT_S,
                            keep_backups=False) as p:
    tasks = _tasks(2)
    p.reset_many({"x": tasks[0], "y": tasks[1]})
    results = p.step_many({"x": "fault segfault", "y": "go north"})
    assert results["x"].reason == "worker process was killed by SIGSEGV"
    assert results["y"].reason == "lost with its worker process (no backup snapshot)"
    assert p.stats()["replaced_workers"] == 1 and len(p.worker_pids()) == 1


def test_a_raising_sandbox_can_keep_its_worker():
  with pool_lib.SandboxPool(FACTORY, num_workers=1, timeout_s=30.0,
                            replace_worker_on_error=False) as p:
    tasks = _tasks(2)
    p.reset_many({"x": tasks[0], "y": tasks[1]})
    pid = p.worker_pids()
    results = p.step_many({"x": "fault raise", "y": "go north"})
    assert results["x"].reason == "step raised RuntimeError: injected fault"
    assert results["y"] == _local_step(tasks[1], "go north")
    assert p.worker_pids() == pid and p.stats()["replaced_workers"] == 0


def test_in_process_mode_has_the_same_api_and_results(pool):
  tasks = _tasks(3)
  local = pool_lib.SandboxPool(FACTORY, num_workers=0)
  plan = rooms.expert_actions(tasks[0])
  for p in (local, pool):
    assert p.reset("a", tasks[0]).startswith("Goal:")
  for action in plan:
    assert local.step("a", action) == pool.step("a", action)
  snap_local, snap_workers = local.snapshot("a"), pool.snapshot("a")
  assert snap_local == snap_workers  # the same bytes
  assert local.step_many({"a": "fault raise"})["a"].reason.endswith("injected fault")
  assert local.stats()["failures"] == 1
  local.shutdown()


def test_errors_name_what_was_wrong(pool):
  with pytest.raises(KeyError, match="unknown branch 'nope'"):
    pool.step("nope", "go north")
  with pytest.raises(TypeError, match="needs a Snapshot"):
    pool.restore("x", b"raw bytes")
  with pytest.raises(KeyError, match="known environments: .*rooms"):
    pool_lib.SandboxPool.for_environment("no-such-world")
  with pytest.raises(ValueError, match="fork"):
    pool_lib.SandboxPool(FACTORY, start_method="fork")
  with pytest.raises(ValueError, match="timeout_s"):
    pool_lib.SandboxPool(FACTORY, timeout_s=0)


def test_fork_spreads_siblings_over_workers_and_they_run_in_parallel():
  """Two siblings that each sleep 0.5 s finish in about 0.5 s, not 1 s."""
  with pool_lib.SandboxPool(functools.partial(_SlowRooms, 0.5), num_workers=2,
                            timeout_s=30.0) as p:
    task = _tasks(1)[0]
    p.reset("root", task)
    p.fork("root", ["s1", "s2"])
    assert p.worker_of("s1") != p.worker_of("s2")
    import time  # pylint: disable=g-import-not-at-top
    start = time.perf_counter()
    results = p.step_many({"s1": "go north", "s2": "go south"})
    elapsed = time.perf_counter() - start
    assert all(isinstance(r, base.Step) for r in results.values())
    assert elapsed < 0.9, elapsed


class _SlowRooms(rooms.RoomsSandbox):
  """Rooms whose step sleeps, to show parallel stepping. Picklable through its module path."""

  def __init__(self, delay_s):
    super().__init__()
    self.delay_s = delay_s

  def step(self, action):
    import time  # pylint: disable=g-import-not-at-top
    time.sleep(self.delay_s)
    return super().step(action)


def test_bad_actions_cross_the_process_boundary_and_come_back_as_observations(pool):
  tasks = _tasks(4)
  pool.reset_many(dict(enumerate(tasks)))
  bad = {0: "", 1: "go " * ((1 << 20) // 3), 2: b"\xc3\x28", 3: "take\x00apple"}
  results = pool.step_many(bad)
  reasons = {b: results[b].info["invalid_action"] for b in bad}
  assert reasons[0] == "action is empty"
  assert reasons[1].startswith("action is 1048575 characters long")
  assert reasons[2] == "action is not valid UTF-8"
  assert reasons[3] == "action contains control character '\\x00'"
  assert all(r.observation.startswith("Invalid action:") for r in results.values())
  assert pool.stats()["failures"] == 0
