"""SWE sandbox: shipped tasks graded by swebench, exact replays across processes, and commands
that try to escape their confinement leave the host unchanged."""

import json
import os
import pickle
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import registry
from bpo_jax.sandboxes import swe
from bpo_jax.sandboxes.swe import confinement
from bpo_jax.sandboxes.swe import grading
from bpo_jax.sandboxes.swe import tasks as tasks_lib
from bpo_jax.sandboxes.swe import workspace as workspace_lib

NAMESPACES = confinement.namespaces_available()  # raises if their set-up fails
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES, reason="host offers no namespaces (no root, no unprivileged user "
    "namespaces): only 'rlimits-only' runs here")
# Sandboxes use the namespaces where the host has them, else the explicit fallback.
MODE = {} if NAMESPACES else {"confinement": "rlimits-only"}

LRU_FIX = """replace lrucache/cache.py
<<<<<<< SEARCH
            self.hits += 1
=======
            self.hits += 1
            self._data.move_to_end(key)
>>>>>>> REPLACE"""


# ---------------------------------------------------------------------------------- the tasks


def test_shipped_tasks_follow_swebench_schema():
  names = swe.shipped_task_names()
  assert len(names) >= 12
  train = {t.task_id for t in swe.make_tasks("train", 8, 0)}
  test = {t.task_id for t in swe.make_tasks("test", 4, 0)}
  assert len(train) == 8 and len(test) == 4 and not train & test
  for name in names:
    task = swe.load_shipped_task(name)
    instance = task.instance
    # The instance's base_commit is the commit of exactly the shipped files.
    with tempfile.TemporaryDirectory() as parent:
      ws = workspace_lib.Workspace(parent)
      assert ws.commit(tasks_lib.materialize(task, ws)) == instance["base_commit"], name
    sources = [p for p, _, _ in task.files if p.endswith(".py") and not p.startswith("tests/")]
    test_files = [p for p, _, _ in task.files if p.startswith("tests/test_")]
    assert len(sources) >= 3 and len(test_files) >= 2, name
    fixed = grading.patched_files(instance["patch"])
    assert fixed and not any(p.startswith("tests/") for p in fixed), name
    assert all(p.startswith("tests/") for p in grading.patched_files(instance["test_patch"]))
    assert instance["FAIL_TO_PASS"] and instance["PASS_TO_PASS"], name
    assert not set(instance["FAIL_TO_PASS"]) & set(instance["PASS_TO_PASS"]), name
    assert pickle.loads(pickle.dumps(task)) == task


@pytest.mark.parametrize("name", tasks_lib.shipped_task_names())
def test_each_task_fails_before_and_is_resolved_by_its_reference_patch(name):
  task = swe.load_shipped_task(name)
  before = swe.evaluate_patch(task, "", mode=MODE.get("confinement", "namespaces"))
  assert before["patch_successfully_applied"] and not before["resolved"]
  status = before["tests_status"]
  assert sorted(status["FAIL_TO_PASS"]["failure"]) == sorted(task.fail_to_pass)
  assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(task.pass_to_pass)
  # The expert's actions (the reference patch's hunks as `replace` actions) in the sandbox:
  # the graded diff is the reference patch byte for byte, and it resolves the task (the hidden
  # tests, which the default sandbox does not show, applied at grading).
  sandbox = swe.make_sandbox(**MODE)
  sandbox.reset(task)
  for action in sandbox.expert_actions():
    step = sandbox.step(action)
    assert "invalid_action" not in step.info and "error" not in step.info, step
  sandbox.close()
  assert step.done and step.reward == 1.0 and step.info["success"] is True
  assert step.info["model_patch"] == task.instance["patch"]
  status = step.info["report"]["tests_status"]
  assert sorted(status["FAIL_TO_PASS"]["success"]) == sorted(task.fail_to_pass)
  assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(task.pass_to_pass)
  assert not status["FAIL_TO_PASS"]["failure"] and not status["PASS_TO_PASS"]["failure"]


def _log(lines, exit_code):
  return "\n".join([">>>>> Applied Patch", ">>>>> Start Test Output", *lines,
                    ">>>>> End Test Output", f">>>>> Test Exit Code: {exit_code}"]) + "\n"


def test_swebench_report_on_hand_written_logs():
  task = swe.load_shipped_task("lru")
  f2p, p2p = task.fail_to_pass, task.pass_to_pass
  all_pass = [f"PASSED {t}" for t in f2p + p2p]
  assert grading.report_from_log(task, "diff", _log(all_pass, 0))["resolved"]
  # One FAIL_TO_PASS test still failing: not resolved, and it is the one reported.
  one_fails = [f"FAILED {f2p[0]} - AssertionError"] + all_pass[1:]
  report = grading.report_from_log(task, "diff", _log(one_fails, 1))
  assert not report["resolved"]
  assert report["tests_status"]["FAIL_TO_PASS"]["failure"] == [f2p[0]]
  # A broken PASS_TO_PASS test fails the task too; a missing test counts as failed.
  report = grading.report_from_log(task, "diff", _log(all_pass[:-1], 0))
  assert not report["resolved"] and report["tests_status"]["PASS_TO_PASS"]["failure"] == [p2p[-1]]
  # A log that claims success but whose command failed is not trusted.
  assert not grading.report_from_log(task, "diff", _log(all_pass, 1))["resolved"]


# ------------------------------------------------------------------------------ the sandbox


@pytest.fixture(scope="module")
def lru_sandbox():
  sandbox = swe.make_sandbox(max_steps=20, **MODE)
  sandbox.reset(swe.load_shipped_task("lru"))
  yield sandbox
  sandbox.close()


def test_submit_grades_the_directory(lru_sandbox):
  sandbox = lru_sandbox
  sandbox.reset(swe.load_shipped_task("lru"))
  start = sandbox.snapshot()
  step = sandbox.step("submit")
  assert step.done and step.reward == 0.0 and step.info["success"] is False
  assert "tests/test_cache.py::test_get_refreshes" in step.observation
  after_done = sandbox.step("run true")
  assert after_done.done and after_done.info["invalid_action"] == "episode is over"
  sandbox.restore(start)
  assert sandbox.step(LRU_FIX).observation == (
      "Replaced 1 lines with 2 lines in lrucache/cache.py.")
  step = sandbox.step("submit")
  assert step.done and step.reward == 1.0 and step.info["success"] is True
  assert step.info["report"]["resolved"] and "+            self._data.move_to_end(key)" in (
      step.info["model_patch"])


def test_editing_the_tests_does_not_pass_grading(lru_sandbox):
  sandbox = lru_sandbox
  sandbox.reset(swe.load_shipped_task("lru"))
  sandbox.step("run printf 'def test_nothing():\\n    pass\\n' > tests/test_cache.py")
  sandbox.step("run rm tests/test_memo.py")
  step = sandbox.step("submit")
  assert step.info["success"] is False
  assert "tests/test_cache.py::test_get_refreshes" in step.observation


def test_actions_view_write_replace_and_bad_actions(lru_sandbox):
  sandbox = lru_sandbox
  sandbox.reset(swe.load_shipped_task("lru"))
  view = sandbox.step("view lrucache/cache.py 14 15").observation
  assert view == ("   14      def get(self, key, default=None):\n"
                  "   15          if key in self._data:\n[lines 14-15 of 32]")
  assert sandbox.step("write notes/a.txt\nfirst\nsecond").observation == (
      "Wrote 2 lines to notes/a.txt.")
  assert sandbox.step("run cat notes/a.txt").observation == "first\nsecond\n[exit code 0]"
  through_file = sandbox.step("write notes/a.txt/b.txt\nx")
  assert through_file.info["error"] == "File exists" and not through_file.done
  not_unique = sandbox.step("replace lrucache/cache.py\n<<<<<<< SEARCH\n        self\n=======\n"
                            "x\n>>>>>>> REPLACE")
  assert not_unique.info["error"] == "search text not unique" and not not_unique.done
  for bad in ["", "   ", b"\xff\xfe run ls", "run ls\x00", "x" * 5000, "frobnicate now",
              "view ../outside.txt", "write /etc/passwd\nroot", "view", "submit now",
              "replace lrucache/cache.py\nno markers", 42]:
    step = sandbox.step(bad)
    assert step.info["invalid_action"] and step.reward == 0.0 and not step.done, bad
  # A link out of the task directory cannot be used to read or write host files.
  assert sandbox.step("run ln -s /etc/hostname host").info["exit_code"] == 0
  assert "outside the task directory" in sandbox.step("view host").info["invalid_action"]
  assert "outside the task directory" in sandbox.step("write host\nx").info["invalid_action"]


@needs_namespaces
def test_commands_see_the_repository_read_only(lru_sandbox):
  sandbox = lru_sandbox
  sandbox.reset(swe.load_shipped_task("lru"))
  head = sandbox.step("run git log --format='%H %s'").observation
  # HEAD is the state after reset: the shipped base commit (the test patch is hidden).
  assert head.endswith(" base\n[exit code 0]") and head.count("\n") == 1
  sandbox.step(LRU_FIX)
  diff = sandbox.step("run git diff --stat; git status --short").observation
  assert diff == (" lrucache/cache.py | 1 +\n 1 file changed, 1 insertion(+)\n"
                  " M lrucache/cache.py\n[exit code 0]")
  assert sandbox.step("run git checkout -- lrucache/cache.py && git status --short").observation \
      == "[exit code 0]"
  commit = sandbox.step("run git -c user.name=a -c user.email=a@b commit -qam x")
  assert commit.info["exit_code"] != 0
  tamper = sandbox.step("run touch /tmp/task.git/refs/heads/x")
  assert "Read-only file system" in tamper.observation
  assert sandbox.step("run git log --format='%H %s'").observation == head


def test_step_limit_ends_the_episode_graded():
  sandbox = swe.make_sandbox(max_steps=2, **MODE)
  sandbox.reset(swe.load_shipped_task("lru"))
  assert not sandbox.step(LRU_FIX).done
  step = sandbox.step("view lrucache")
  assert step.done and step.truncated and step.info["success"] is True and step.reward == 1.0
  sandbox.close()


def test_bad_config_and_task_raise_clearly():
  with pytest.raises(ValueError, match="max_steps"):
    swe.make_sandbox(max_steps=0)
  with pytest.raises(ValueError, match="wall_seconds"):
    swe.make_sandbox(limits={"wall_seconds": -1})
  with pytest.raises(TypeError, match="SweTask"):
    swe.make_sandbox(**MODE).reset("lru")
  with pytest.raises(ValueError, match="split"):
    swe.make_tasks("validation", 1, 0)
  with pytest.raises(KeyError, match="shipped tasks"):
    swe.load_shipped_task("nope")
  with pytest.raises(ValueError, match="not a SWE sandbox snapshot"):
    swe.make_sandbox(**MODE).restore(base.Snapshot(b"garbage"))


# --------------------------------------------------------------------------- determinism

# The state before the forks has an untracked file, an empty directory and a `.git` directory
# (which git itself never tracks); all three must survive snapshots.
PREFIX = ["run printf 'draft\\n' > notes.txt && mkdir -p scratch/empty vendor/.git && "
          "echo '[core]' > vendor/.git/config"]
FORKS = [LRU_FIX, "run rm -r lrucache/memo.py scratch", "write lrucache/cache.py\nBROKEN = 1"]
CONTINUATION = ["run ls -R | sort; cat notes.txt vendor/.git/config; pwd; hostname; "
                "git status --short; git log --oneline",
                "view lrucache/cache.py 1 3", "submit"]


@pytest.fixture(scope="module")
def forked(lru_sandbox):
  """The lru sandbox after PREFIX, its snapshot, and the replay of each fork in that sandbox."""
  sandbox = lru_sandbox
  sandbox.reset(swe.load_shipped_task("lru"))
  for action in PREFIX:
    assert not sandbox.step(action).done
  snapshot = sandbox.snapshot()
  expected = [base.replay(sandbox, snapshot, [a] + CONTINUATION) for a in FORKS]
  return sandbox, snapshot, expected


@pytest.mark.slow
def test_forks_replay_byte_identically_in_a_fresh_sandbox(forked):
  sandbox, snapshot, expected = forked
  # The three forks are different branches with different outcomes.
  assert [(s[-1].reward, s[-1].info["success"]) for s in expected] == [
      (1.0, True), (0.0, False), (0.0, False)]
  assert len({tuple(s.observation for s in steps) for steps in expected}) == 3
  listing = expected[0][1].observation
  assert "draft\n[core]\n" in listing and "./scratch/empty:" in listing
  # A fresh sandbox that never saw the task replays them from the bytes alone, identically.
  fresh = swe.make_sandbox(max_steps=20, **MODE)
  for i, action in enumerate(FORKS):
    again = base.replay(fresh, base.Snapshot(snapshot.data), [action] + CONTINUATION)
    assert base.first_divergence(expected[i], again) is None, i
  # Equal states give equal bytes: restoring and snapshotting again reproduces the snapshot,
  # through the bytes and through the in-process handle.
  fresh.restore(base.Snapshot(snapshot.data))
  assert fresh.snapshot().data == snapshot.data
  sandbox.restore(snapshot)
  assert sandbox.snapshot().data == snapshot.data
  fresh.close()


@pytest.mark.slow
def test_forks_replay_byte_identically_in_worker_processes(forked):
  _, snapshot, expected = forked
  branches = ["fork0", "fork1", "fork2"]
  with pool_lib.SandboxPool.for_environment("swe", num_workers=2, timeout_s=60.0,
                                            max_steps=20, **MODE) as pool:
    restored = pool.restore_many({b: pickle.loads(pickle.dumps(snapshot)) for b in branches})
    assert all(r is None for r in restored.values()), restored
    assert {pool.worker_of(b) for b in branches} == {0, 1}
    got = [[] for _ in branches]
    for t in range(1 + len(CONTINUATION)):
      actions = {b: ([FORKS[i]] + CONTINUATION)[t] for i, b in enumerate(branches)}
      for b, step in pool.step_many(actions).items():
        assert isinstance(step, base.Step), step
        got[branches.index(b)].append(step)
  for i in range(3):
    assert base.first_divergence(expected[i], got[i]) is None, i
    assert [s.done for s in got[i]] == [False, False, False, True]


# ------------------------------------------------------------------- real SWE-bench instances


def _git(cwd, *args):
  subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, check=True,
                 capture_output=True, env={**os.environ, **workspace_lib._COMMIT_ENV})


def test_loader_reads_swebench_instance_json(tmp_path):
  clone = tmp_path / "repos" / "acme__mathlib"
  (clone / "mathlib").mkdir(parents=True)
  (clone / "tests").mkdir()
  (clone / "mathlib" / "__init__.py").write_text("def double(x):\n    return x + x + 1\n")
  (clone / "tests" / "test_double.py").write_text(
      "from mathlib import double\n\n\ndef test_zero():\n    assert double(0) in (0, 1)\n")
  _git(clone, "init", "-q")
  _git(clone, "add", ".")
  _git(clone, "commit", "-qm", "base")
  commit = subprocess.run(["git", "-c", "safe.directory=*", "rev-parse", "HEAD"], cwd=clone,
                          capture_output=True, text=True).stdout.strip()
  test_patch = ("diff --git a/tests/test_double.py b/tests/test_double.py\n"
                "--- a/tests/test_double.py\n+++ b/tests/test_double.py\n"
                "@@ -3,3 +3,7 @@ from mathlib import double\n \n def test_zero():\n"
                "     assert double(0) in (0, 1)\n+\n+\n+def test_two():\n"
                "+    assert double(2) == 4\n")
  instance = {  # the Hugging Face dataset form: test lists as JSON strings
      "repo": "acme/mathlib", "instance_id": "acme__mathlib-7", "base_commit": commit,
      "patch": ("diff --git a/mathlib/__init__.py b/mathlib/__init__.py\n"
                "--- a/mathlib/__init__.py\n+++ b/mathlib/__init__.py\n"
                "@@ -1,2 +1,2 @@\n def double(x):\n-    return x + x + 1\n+    return 2 * x\n"),
      "test_patch": test_patch, "problem_statement": "double(2) is 5",
      "hints_text": "", "created_at": "2024-01-01", "version": "0.1",
      "FAIL_TO_PASS": json.dumps(["tests/test_double.py::test_two"]),
      "PASS_TO_PASS": json.dumps(["tests/test_double.py::test_zero"]),
      "environment_setup_commit": commit}
  path = tmp_path / "instances.jsonl"
  path.write_text(json.dumps(instance) + "\n")
  [task] = swe.load_swebench_instances(str(path), str(tmp_path / "repos"))
  assert task.task_id == "acme__mathlib-7" and task.fail_to_pass == [
      "tests/test_double.py::test_two"]
  sandbox = swe.make_sandbox(**MODE)
  assert "double(2) is 5" in sandbox.reset(task)
  snapshot = sandbox.snapshot()
  assert sandbox.step("submit").info["success"] is False
  sandbox.restore(snapshot)
  sandbox.step("write mathlib/__init__.py\ndef double(x):\n    return 2 * x")
  assert sandbox.step("submit").info["success"] is True
  sandbox.close()
  with pytest.raises(base.TaskInputError, match="row 0 \\(instance acme__mathlib-7\\): field "
                                                "repo: needs a clone"):
    swe.load_swebench_instances(str(path), str(tmp_path / "elsewhere"))
  path.write_text(json.dumps({"instance_id": "x", "repo": "a/b"}))
  with pytest.raises(base.TaskInputError, match="row 0 \\(instance x\\): lacks fields base_commit"):
    swe.load_swebench_instances(str(path), str(tmp_path / "repos"))


def test_registered_environment():
  module = registry.get_environment("swe")
  tasks = module.make_tasks("test", 5, 3, max_steps=7)  # sandbox options are accepted
  with pytest.raises(TypeError, match="difficulty"):
    module.make_tasks("test", 1, 0, difficulty=2)
  assert len(tasks) == 5 and tasks[4] == tasks[0]
  assert isinstance(module.make_sandbox(**MODE), base.Sandbox)


# ------------------------------------------------------------------------------ confinement


def _jail_processes(uid):
  count = 0
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        if os.stat(f"/proc/{pid}").st_uid == uid:
          count += 1
      except FileNotFoundError:
        pass
  return count


def _children():
  out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(os.getpid())], capture_output=True,
                       text=True).stdout.split()
  return len(out) - 1  # minus ps itself


@pytest.fixture
def jail_dir():
  # Under a directory others may traverse: without namespaces, a root host's commands run as
  # an unprivileged uid, which must reach it.
  parent = tempfile.mkdtemp(prefix="bpo_jail_")
  os.chmod(parent, 0o755)
  work = os.path.join(parent, "work")
  os.mkdir(work)
  if os.geteuid() == 0:
    os.chown(work, confinement.default_uid(), confinement.default_uid())
  yield work
  shutil.rmtree(parent, ignore_errors=True)


def test_protections_are_reported():
  fallback = confinement.protections("rlimits-only")
  assert fallback["process_group_timeout"] and fallback["scrubbed_env"] and fallback["rlimits"]
  assert not fallback["network_namespace"] and not fallback["private_filesystem_view"]
  # Under root even the fallback runs commands as an unprivileged uid of their own.
  assert fallback["unprivileged_uid"] == (os.geteuid() == 0)
  assert fallback["process_limit"] and fallback["ends_every_descendant"]
  if NAMESPACES:
    assert all(v for k, v in confinement.protections().items()
               if k not in ("user_namespace", "total_memory_limit", "process_cgroup"))
  else:
    with pytest.raises(confinement.ConfinementError, match="rlimits-only"):
      confinement.protections("namespaces")
  with pytest.raises(ValueError, match="confinement must be one of"):
    confinement.protections("none")
  assert swe.protections_record(max_steps=3, **MODE) == {
      "confinement": MODE.get("confinement", "namespaces"),
      "protections": confinement.protections(MODE.get("confinement", "namespaces")),
      "not_protected": confinement.unprotected(MODE.get("confinement", "namespaces"))}


def test_command_output_and_exit_status(jail_dir):
  result = confinement.run_confined("echo out; echo err >&2; exit 3", jail_dir,
                                    namespaces=NAMESPACES)
  assert result.output == "out\nerr\n" and result.exit_code == 3 and not result.timed_out
  with pytest.raises(ValueError, match="NUL"):
    confinement.run_confined("echo \0", jail_dir, namespaces=NAMESPACES)


@needs_namespaces
def test_writes_outside_the_task_directory_are_contained(jail_dir, tmp_path):
  outside = tmp_path / "outside"
  outside.mkdir()
  os.chmod(outside, 0o777)
  victim = outside / "victim.txt"
  victim.write_text("original")
  os.chmod(victim, 0o666)
  near_repo = tempfile.mkdtemp(prefix=".swe_escape_", dir=os.path.dirname(__file__))
  try:
    os.chmod(near_repo, 0o777)
    before = sorted(os.listdir(outside)), sorted(os.listdir(near_repo))
    command = (f"echo pwned > {victim}; rm -f {victim}; touch {outside}/new; "
               f"touch {near_repo}/new; echo x > /etc/bpo_probe; mkdir /var/tmp/bpo_probe; "
               f"echo ok > inside.txt")
    result = confinement.run_confined(command, jail_dir)
    assert "Read-only file system" in result.output or "No such file" in result.output
    assert victim.read_text() == "original"
    assert (sorted(os.listdir(outside)), sorted(os.listdir(near_repo))) == before
    assert not os.path.exists("/etc/bpo_probe") and not os.path.exists("/var/tmp/bpo_probe")
    assert open(os.path.join(jail_dir, "inside.txt")).read() == "ok\n"
    # Host daemons' sockets (under /run) are hidden: a read-only mount alone would not stop
    # connecting to them.
    assert confinement.run_confined("ls -A /run | wc -l", jail_dir).output == "0\n"
  finally:
    os.rmdir(near_repo)


@needs_namespaces
def test_fork_bomb_is_contained(jail_dir):
  children = _children()
  limits = confinement.Limits(wall_seconds=2.0, max_processes=32)
  start = time.monotonic()
  result = confinement.run_confined("bomb() { bomb | bomb & }; bomb; sleep 30", jail_dir, limits)
  # It ends at the wall limit, or sooner when the bomb has taken every process slot before the
  # shell could start `sleep` (then the shell exits on "Cannot fork"); never after 30 s.
  assert (result.timed_out or result.exit_code != 0) and time.monotonic() - start < 10.0
  assert "fork" in result.output.lower()  # forks were refused at the process limit
  assert _jail_processes(confinement.default_uid()) == 0
  assert _children() == children


def test_infinite_loop_is_killed(jail_dir):
  start = time.monotonic()
  result = confinement.run_confined(
      "while :; do :; done", jail_dir, confinement.Limits(wall_seconds=2.0, cpu_seconds=1),
      namespaces=NAMESPACES)
  # Unconfined, the loop never ends; the bound leaves room for a loaded machine.
  assert result.exit_code < 0 and time.monotonic() - start < 10.0
  assert result.report().startswith("[")


def test_ten_gigabytes_of_output_are_cut_off(jail_dir):
  limits = confinement.Limits(wall_seconds=20.0, max_output_chars=1000,
                              kill_output_bytes=1 << 20, file_bytes=1 << 20)
  start = time.monotonic()
  result = confinement.run_confined("head -c 10000000000 /dev/zero | tr '\\0' y", jail_dir, limits,
                                    namespaces=NAMESPACES)
  assert result.output_limited and result.output_bytes < 2 << 20
  assert len(result.output) < 1100 and "characters truncated" in result.output
  to_file = confinement.run_confined("head -c 10000000000 /dev/zero > big; ls -l big", jail_dir,
                                     limits, namespaces=NAMESPACES)
  assert os.path.getsize(os.path.join(jail_dir, "big")) == 1 << 20
  assert "File too large" in to_file.output
  assert time.monotonic() - start < 10.0


@needs_namespaces
def test_network_is_unreachable(jail_dir):
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.setblocking(False)
  port = server.getsockname()[1]
  probe = ("import socket\n"
           "for address in [('127.0.0.1', %d), ('1.1.1.1', 80)]:\n"
           "  try:\n"
           "    socket.create_connection(address, timeout=2); print('connected')\n"
           "  except OSError as e:\n"
           "    print('refused', e.errno)\n" % port)
  result = confinement.run_confined(f"python -c \"{probe}\"", jail_dir)
  assert "connected" not in result.output and result.output.count("refused") == 2
  with pytest.raises(BlockingIOError):
    server.accept()
  server.close()


def test_host_environment_is_not_visible(jail_dir, monkeypatch):
  secret = secrets.token_hex(16)
  monkeypatch.setenv("BPO_SWE_SECRET", secret)
  env_before = dict(os.environ)
  result = confinement.run_confined("env", jail_dir, namespaces=NAMESPACES)
  assert secret not in result.output and "PYTHONHASHSEED=0" in result.output
  if NAMESPACES:
    # Only the command's own processes are visible, so no other process's environment is.
    result = confinement.run_confined(
        "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; cat /proc/$PPID/environ; "
        "ls /proc | grep -c '^[0-9]'", jail_dir)
    assert secret not in result.output and "BPO_SWE_SECRET" not in result.output
    assert int(result.output.split()[-1]) <= 3
  assert dict(os.environ) == env_before


@pytest.mark.slow
def test_command_dies_with_the_process_that_ran_it(jail_dir):
  # A sandbox worker killed at its timeout must not leave its command running.
  sleep = f"sleep 300.{secrets.randbelow(10**6):06d}"  # a command line no other process has
  host = subprocess.Popen(
      [sys.executable, "-c", "import sys; from bpo_jax.sandboxes.swe import confinement; "
       "confinement.run_confined(sys.argv[3], sys.argv[1], "
       "confinement.Limits(wall_seconds=300, cpu_seconds=300), namespaces=sys.argv[2] == '1')",
       jail_dir, "1" if NAMESPACES else "0", sleep],
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  uid = 1_000_000 + host.pid  # confinement.default_uid() of that process
  deadline = time.monotonic() + 30
  marker = None
  while time.monotonic() < deadline and not (marker and marker.stdout.strip()):
    time.sleep(0.05)
    marker = subprocess.run(["pgrep", "-f", f"^{sleep}$"], capture_output=True, text=True)
  assert marker.stdout.strip(), "the command never started"
  host.kill()
  host.wait()
  deadline = time.monotonic() + 5
  while time.monotonic() < deadline and (
      _jail_processes(uid) or _descendants_running(sleep, marker.stdout.split())):
    time.sleep(0.05)
  assert _jail_processes(uid) == 0
  assert not _descendants_running(sleep, marker.stdout.split())


def _descendants_running(command, pids):
  alive = []
  for pid in pids:
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if f.read().replace(b"\0", b" ").strip() == command.encode():
          alive.append(pid)
    except FileNotFoundError:
      pass
  return alive


def test_fallback_without_namespaces_still_limits(jail_dir):
  # What a host without root gets: rlimits, timeout of the whole process group, scrubbed env.
  limits = confinement.Limits(wall_seconds=1.5, file_bytes=1 << 16)
  result = confinement.run_confined("pwd; head -c 1000000 /dev/zero > big; id -u", jail_dir,
                                    limits, namespaces=False)
  assert result.output.startswith(os.path.realpath(jail_dir)) and "File too large" in result.output
  # A root host drops to the command's own unprivileged uid even here.
  uid = confinement.default_uid() if os.geteuid() == 0 else os.geteuid()
  assert result.output.split()[-1] == str(uid)
  assert os.path.getsize(os.path.join(jail_dir, "big")) == 1 << 16
  duration = f"30.{secrets.randbelow(10**6):06d}"  # a unique command line to look for
  children = _children()
  start = time.monotonic()
  result = confinement.run_confined(f"sleep {duration} & sleep {duration}", jail_dir, limits,
                                    namespaces=False)
  # It ends at the wall limit, or sooner when the bomb has taken every process slot before the
  # shell could start `sleep` (then the shell exits on "Cannot fork"); never after 30 s.
  assert (result.timed_out or result.exit_code != 0) and time.monotonic() - start < 10.0
  time.sleep(0.1)
  leftover = subprocess.run(["pgrep", "-f", f"sleep {duration}"], capture_output=True,
                            text=True).stdout
  assert leftover == "" and _children() == children


@needs_namespaces
def test_escape_attempts_through_the_sandbox_are_reported(lru_sandbox):
  sandbox = lru_sandbox
  sandbox.reset(swe.load_shipped_task("lru"))
  sandbox.limits = confinement.Limits(wall_seconds=1.5, cpu_seconds=1)
  try:
    loop = sandbox.step("run while :; do :; done")
    assert "killed" in loop.observation and loop.info["exit_code"] < 0
    write = sandbox.step("run echo x > /etc/bpo_probe")
    assert "Read-only file system" in write.observation and write.info["exit_code"] != 0
    sandbox.limits = confinement.Limits(file_bytes=1 << 20, disk_bytes=4 << 20)
    size = confinement.disk_usage(sandbox.workdir)
    fill = sandbox.step("run i=0; while :; do i=$((i+1)); head -c 1000000 /dev/zero > f$i; done")
    assert fill.info["disk_limited"] and "disk limit" in fill.observation
    assert "undone" in fill.observation
    assert confinement.disk_usage(sandbox.workdir) == size
  finally:
    sandbox.limits = confinement.Limits()
  assert not os.path.exists("/etc/bpo_probe")
