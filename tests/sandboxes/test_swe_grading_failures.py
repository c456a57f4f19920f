"""Infrastructure is never a reward: a full disk (a small tmpfs) before or while the tests run, a
git error, a test patch that does not apply are failed branches with their reason, counted in
`failed_branches`; what the agent puts in the hidden tests' way is cleared and graded."""

import dataclasses
import errno
import functools
import os
import subprocess

import jax
import numpy as np
import pytest
from flax import nnx

from bpo_jax import rollout
from bpo_jax import text
from bpo_jax.models import Decoder, ModelConfig
from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import rooms
from bpo_jax.sandboxes import swe
from bpo_jax.sandboxes.swe import confinement
from bpo_jax.sandboxes.swe import grading
from bpo_jax.sandboxes.swe import tasks as tasks_lib
from bpo_jax.sandboxes.swe import workspace as workspace_lib

MODE = {} if confinement.namespaces_available() else {"confinement": "rlimits-only"}
DISK_BYTES = 8 << 20


@pytest.fixture
def small_disk(tmp_path):
  """A fresh 8 MiB tmpfs, unmounted afterwards."""
  if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs needs root")
  mount = tmp_path / "disk"
  mount.mkdir()
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES // 1024}k", "tmpfs",
                         str(mount)], capture_output=True, text=True)
  if done.returncode:
    pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
  try:
    yield str(mount)
  finally:
    subprocess.run(["umount", str(mount)], check=True)


def _free(path):
  st = os.statvfs(path)
  return st.f_bavail * st.f_frsize


def _fill(directory, leave=0):
  """Writes zeros into `directory` until under `leave` bytes are free (or none at all)."""
  fd = os.open(os.path.join(directory, f"ballast{leave}"), os.O_WRONLY | os.O_CREAT, 0o644)
  try:
    while _free(directory) > leave:
      os.write(fd, b"\0" * min(65536, max(4096, _free(directory) - leave)))
  except OSError as e:
    assert e.errno == errno.ENOSPC
  finally:
    os.close(fd)


def _fixed(sandbox, task):
  """The sandbox reset to `task` with the reference fix made (not submitted); its snapshot."""
  sandbox.reset(task)
  for action in sandbox.expert_actions()[:-1]:
    assert "Error" not in sandbox.step(action).observation
  return sandbox.snapshot()


def test_full_disk_at_grading_is_a_failed_branch(small_disk):
  task = swe.load_shipped_task("lru")
  sandbox = swe.make_sandbox(root=small_disk, max_steps=10, **MODE)
  try:
    fixed = _fixed(sandbox, task)
    assert sandbox.step("submit").reward == 1.0  # with room on the disk, the fix resolves
    sandbox.restore(fixed)
    _fill(small_disk, leave=grading.MIN_FREE_BYTES // 2)  # git still works, the tests might not
    with pytest.raises(grading.GradingError, match=r"the disk of the task directory of "
                       r"bpo_jax__lru-1 has \d+ bytes free before the tests \(under 1048576\)"):
      sandbox.step("submit")
    sandbox.restore(fixed)
    _fill(small_disk)  # nothing left: git itself fails
    assert _free(small_disk) == 0
    with pytest.raises(grading.GradingError, match="grading bpo_jax__lru-1 failed: (GitError|"
                                                   "OSError).*(No space left|Out of diskspace)"):
      sandbox.step("submit")
  finally:
    sandbox.close()


def test_disk_filled_while_the_tests_run_is_a_failed_branch(small_disk):
  """The tests pass, but the disk was full while they ran: no verdict."""
  shipped = swe.load_shipped_task("lru")
  filling = ("i=0; while head -c 262144 /dev/zero > ballast$i 2>/dev/null; do i=$((i+1)); done; "
             + tasks_lib.DEFAULT_TEST_COMMAND)
  task = dataclasses.replace(shipped, instance={**shipped.instance, "test_cmd": filling})
  sandbox = swe.make_sandbox(root=small_disk, max_steps=10, **MODE)
  try:
    _fixed(sandbox, task)
    with pytest.raises(grading.GradingError, match="bytes free after the tests"):
      sandbox.step("submit")
    assert _free(small_disk) > DISK_BYTES // 2  # the tests' files went with the grading
  finally:
    sandbox.close()


def _unappliable(task):
  """`task` with a test patch whose context the base does not have."""
  broken = task.instance["test_patch"].replace("\n ", "\n #", 1)
  assert broken != task.instance["test_patch"]
  return dataclasses.replace(task, instance={**task.instance, "test_patch": broken})


def test_test_patch_that_does_not_apply_is_a_failed_branch():
  task = _unappliable(swe.load_shipped_task("lru"))
  mode = MODE.get("confinement", "namespaces")
  for patch in (task.instance["patch"], ""):  # the reference fix and no fix: no verdict
    with pytest.raises(grading.GradingError, match="the test patch of bpo_jax__lru-1 does not "
                                                   "apply: git apply"):
      swe.evaluate_patch(task, patch, mode=mode)
  # In a pool the branch fails with that reason; the other branch is graded.
  pool = pool_lib.SandboxPool(functools.partial(swe.make_sandbox, max_steps=10, **MODE),
                              num_workers=0)
  try:
    good = swe.load_shipped_task("lru")
    pool.reset("bad", task)
    pool.reset("good", good)
    steps = pool.step_many({"bad": "submit", "good": "submit"})
    assert isinstance(steps["bad"], pool_lib.BranchFailure)
    assert "the test patch of bpo_jax__lru-1 does not apply" in steps["bad"].reason
    assert steps["good"].reward == 0.0 and steps["good"].info["success"] is False
    assert pool.stats()["failures"] == 1
  finally:
    pool.shutdown()


def test_what_the_agent_puts_in_the_tests_way_is_cleared_and_graded(tmp_path):
  """Test files replaced by a directory, or their directory by a link out of the task directory:
  the agent's doing, graded as a verdict (never a failed branch), no host file touched."""
  task = swe.load_shipped_task("lru")
  sandbox = swe.make_sandbox(max_steps=20, **MODE)
  outside = tmp_path / "outside"
  outside.mkdir()
  try:
    fixed = _fixed(sandbox, task)
    os.remove(os.path.join(sandbox.workdir, "tests", "test_cache.py"))
    os.makedirs(os.path.join(sandbox.workdir, "tests", "test_cache.py", "inner"))
    assert sandbox.step("submit").reward == 1.0  # the hidden tests took their place
    sandbox.restore(fixed)
    tests = os.path.join(sandbox.workdir, "tests")
    subprocess.run(["rm", "-rf", tests], check=True)
    os.symlink(outside, tests)
    step = sandbox.step("submit")
    assert step.done and step.reward == 1.0 and step.info["success"]
    assert os.listdir(outside) == []
  finally:
    sandbox.close()


# -- the rollout engine: a failed grade is a failed branch, counted, without a reward ---------

_SCRIPTS = {}


class _Expert(base.SandboxWrapper):
  """Plays the reference fix whatever the policy replies: the k-th step of an episode is the
  expert's k-th action (from the state after reset)."""

  def reset(self, task):
    observation = self.inner.reset(task)
    _SCRIPTS.setdefault(task.task_id, self.inner.expert_actions())
    return observation

  def step(self, action):
    del action
    inner = self.inner  # pylint: disable=protected-access
    return inner.step(_SCRIPTS[inner._task.task_id][inner._steps])


def _expert_sandbox(**options):
  return _Expert(swe.make_sandbox(**options))


@pytest.mark.slow
def test_failed_grades_are_failed_branches_of_the_tree(small_disk, tmp_path):
  fmt = text.build_text("rooms", str(tmp_path / "text"),
                        rooms.make_tasks("train", num=16, seed=0, difficulty=1),
                        env_options={"difficulty": 1}, max_observation_tokens=40)[1]
  config = ModelConfig.tiny(vocab_size=fmt.vocab_size, hidden_size=32, intermediate_size=64,
                            num_heads=2, num_kv_heads=1, head_dim=16)
  graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))
  pool = pool_lib.SandboxPool(functools.partial(_expert_sandbox, root=small_disk, max_steps=6,
                                                **MODE), num_workers=0)
  engine = rollout.RolloutEngine(graphdef, config, fmt, pool, rollout.RolloutConfig(
      topology="group", group_size=2, max_turns=6, max_action_tokens=4, max_length=384,
      batch_buckets=(4,), temperature=1.0))
  task = swe.load_shipped_task("lru")
  try:
    graded = engine.rollout(params, [task], jax.random.key(0)).rollouts[0]
    assert graded.compute.failed_branches == 0 and not graded.failures
    assert sorted(graded.tree.reward[graded.tree.valid].tolist()) == [0.0, 0.0, 1.0, 1.0]
    _fill(small_disk, leave=grading.MIN_FREE_BYTES // 2)
    result = engine.rollout(params, [task], jax.random.key(0)).rollouts[0]
  finally:
    pool.shutdown()
  assert result.compute.failed_branches == 2
  assert [f.op for f in result.failures] == ["step", "step"]
  assert all("bytes free before the tests" in f.reason for f in result.failures)
  # Each episode's submit failed: no valid node is left, so no reward reaches the estimator.
  assert not result.tree.valid.any() and result.leaves().size == 0
  assert not np.any(result.node_success)


def test_test_files_are_reset_by_their_exact_names(tmp_path):
  """A test file whose name holds glob characters and non-ASCII letters is put back as at the
  base, and only it: not the file its name matches as a glob."""
  ws = workspace_lib.Workspace(str(tmp_path / "ws"))
  odd, globbed = "tests/test_[x]é.py", "tests/test_xé.py"
  ws.write_files([(odd, "100644", b"base odd\n"), (globbed, "100644", b"base globbed\n")])
  tree = ws.write_tree()
  ws.write_files([(odd, "100644", b"agent odd\n"), (globbed, "100644", b"agent globbed\n"),
                  ("tests/new.py", "100644", b"agent new\n")])
  grading._reset_test_files(ws, tree, [odd, "tests/new.py"])  # pylint: disable=protected-access
  read = lambda p: open(os.path.join(ws.workdir, p), "rb").read()  # noqa: E731
  assert read(odd) == b"base odd\n" and read(globbed) == b"agent globbed\n"
  assert not os.path.exists(os.path.join(ws.workdir, "tests", "new.py"))
  ws.close()
