"""SWE confinement from any interpreter location, the task data out of the agent's view, no
silent downgrade, and infrastructure failures that fail the branch instead of scoring it."""

import dataclasses
import json
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

import bpo_jax
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import swe
from bpo_jax.sandboxes.swe import confinement
from bpo_jax.sandboxes.swe import grading
from bpo_jax.sandboxes.swe import sandbox as sandbox_lib
from bpo_jax.sandboxes.swe import tasks as tasks_lib

NAMESPACES = confinement.namespaces_available()  # raises if their set-up fails
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES, reason="host offers no namespaces (no root, no unprivileged user "
    "namespaces): only 'rlimits-only' runs here")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(bpo_jax.__file__)))
HOME = os.path.expanduser("~")
# Top-level entries the confinement's root holds besides the interpreter's directories.
SYSTEM_ENTRIES = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin",
                  "tmp", "usr"}

# Runs inside a virtualenv's interpreter: escape attempts through the sandbox's `run` action,
# then the reference fix; prints one JSON object.
DRIVER = r"""
import json, sys
from bpo_jax.sandboxes import swe
home, home_marker, tmp_marker, port = sys.argv[1:5]
sandbox = swe.make_sandbox(max_steps=40, show_tests=False)
sandbox.reset(swe.load_shipped_task("lru"))
def run(command):
  step = sandbox.step("run " + command)
  return {"output": step.observation, "exit_code": step.info["exit_code"]}
probe = ("import socket\nfor a in [('127.0.0.1', %s), ('1.1.1.1', 80)]:\n  try:\n"
         "    socket.create_connection(a, timeout=2); print('connected')\n"
         "  except OSError as e:\n    print('refused', e.errno)\n" % port)
out = {"prefix": sys.prefix, "base_prefix": sys.base_prefix, "protections": sandbox.protections}
out["uid"] = run("id -u")
out["shadow"] = run("cat /etc/shadow")
out["write_home"] = run(f"echo x > {home}/.bpo_escape_probe")
out["write_etc"] = run("echo x > /etc/bpo_escape_probe")
out["home_marker"] = run(f"ls -d {home_marker}")
out["tmp_marker"] = run(f"ls -d {tmp_marker}")
out["root"] = run("ls -A /")
out["network"] = run(f"python -c \"{probe}\"")
out["python"] = run("python -c 'import sys, pytest; print(sys.prefix)'")
for action in sandbox.expert_actions():
  step = sandbox.step(action)
out["reward"], out["success"] = step.reward, step.info["success"]
sandbox.close()
print(json.dumps(out))
"""


def _venv(parent: str) -> str:
  """A virtualenv of this interpreter under `parent` (system site-packages; nothing is
  downloaded)."""
  path = tempfile.mkdtemp(prefix=".bpo_venv_", dir=parent)
  subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", path],
                 check=True, capture_output=True)
  return path


@pytest.fixture(scope="module", params=["tmp", "home"])
def venv(request):
  parent = tempfile.gettempdir() if request.param == "tmp" else HOME
  if not os.access(parent, os.W_OK):
    pytest.skip(f"{request.param} directory is not writable")
  path = _venv(parent)
  yield path
  shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@needs_namespaces
def test_escape_attempts_from_a_virtualenv_are_contained(venv):
  token = secrets.token_hex(6)
  home_marker = os.path.join(HOME, f".bpo_marker_{token}")
  tmp_marker = os.path.join(tempfile.gettempdir(), f"bpo_marker_{token}")
  for marker in (home_marker, tmp_marker):
    os.mkdir(marker)
    os.chmod(marker, 0o755)
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.setblocking(False)
  try:
    proc = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-c", DRIVER, HOME, home_marker, tmp_marker,
         str(server.getsockname()[1])], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": REPO_ROOT}, cwd=tempfile.gettempdir())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    with pytest.raises(BlockingIOError):
      server.accept()
  finally:
    server.close()
    for marker in (home_marker, tmp_marker):
      os.rmdir(marker)
  # The driver ran in the virtualenv, and so do the commands: its python, with pytest.
  assert os.path.realpath(out["prefix"]) == os.path.realpath(venv)
  assert out["python"]["exit_code"] == 0 and out["python"]["output"].startswith(out["prefix"])
  assert all(v for k, v in out["protections"].items()
             if k not in ("user_namespace", "total_memory_limit", "process_cgroup")), out
  assert out["protections"]["user_namespace"] == (os.geteuid() != 0)
  uid = out["uid"]["output"].split("\n")[0]
  assert out["uid"]["exit_code"] == 0 and uid.isdigit() and int(uid) != 0
  assert out["shadow"]["exit_code"] != 0 and "root:" not in out["shadow"]["output"]
  for name in ("write_home", "write_etc"):
    assert out[name]["exit_code"] != 0, out[name]
  assert not os.path.exists(os.path.join(HOME, ".bpo_escape_probe"))
  assert not os.path.exists("/etc/bpo_escape_probe")
  for name in ("home_marker", "tmp_marker"):
    assert out[name]["exit_code"] != 0 and "No such file" in out[name]["output"], out[name]
  # Of the host's top-level directories only the system's and the interpreter's are there.
  listed = set(out["root"]["output"].split("\n")[:-1])
  interpreter = {os.path.realpath(p).split("/")[1] for p in (venv, out["base_prefix"])}
  assert listed <= SYSTEM_ENTRIES | interpreter, listed
  assert out["network"]["output"].count("refused") == 2, out["network"]
  assert "connected" not in out["network"]["output"]
  # And the task is still solved by its reference patch from there.
  assert out["reward"] == 1.0 and out["success"] is True


# ------------------------------------------------------------------------------- task data


@pytest.fixture
def lru():
  sandbox = swe.make_sandbox(max_steps=40, show_tests=False)
  task = swe.load_shipped_task("lru")
  sandbox.reset(task)
  yield sandbox, task
  sandbox.close()


@pytest.mark.slow
@needs_namespaces
def test_the_task_data_is_out_of_the_agents_view(lru):
  sandbox, task = lru
  instance = os.path.join(tasks_lib.TASKS_DIR, "lru", "instance.json")
  hidden_test = os.path.join(tasks_lib.TASKS_DIR, "lru", "repo", "tests", "test_cache.py")
  assert os.path.isfile(instance) and os.path.isfile(hidden_test)
  for command in (f"cat {instance}", f"grep -c move_to_end {instance}", f"cat {hidden_test}",
                  f"ls {tasks_lib.TASKS_DIR}/lru", f"ls -A {REPO_ROOT}"):
    step = sandbox.step(f"run {command}")
    assert step.info["exit_code"] != 0, (command, step.observation)
    assert "move_to_end" not in step.observation and "test_get_refreshes" not in step.observation
  # Every copy of the package, and the checkout around it, is empty or absent in the view.
  for path in confinement._hidden_paths():
    step = sandbox.step(f"run ls -A {path} 2>/dev/null | wc -l")
    assert step.observation == "0\n[exit code 0]", (path, step.observation)
  listed = sandbox.step("run ls -A /").observation.split("\n")[:-1]
  interpreter = {p.split("/")[1] for p in confinement._python_paths()}
  assert set(listed) <= SYSTEM_ENTRIES | interpreter, listed
  found = sandbox.step("run find / -path /proc -prune -o -name instance.json -print "
                       "2>/dev/null | head -3")
  assert found.observation.startswith("[exit code"), found.observation
  # Neither the fixed files nor the hidden tests are in the task's own repository.
  for blob in _new_blobs(task.instance["patch"]) + _new_blobs(task.instance["test_patch"]):
    step = sandbox.step(f"run git cat-file -e {blob}")
    assert step.info["exit_code"] != 0, (blob, step.observation)


def _new_blobs(patch):
  """The blob ids of the files a git patch writes (its `index old..new` lines)."""
  blobs = re.findall(r"^index [0-9a-f]+\.\.([0-9a-f]+)", patch, flags=re.M)
  assert blobs and all(len(b) == 40 for b in blobs)
  return blobs


INSTALLED_DRIVER = r"""
import json, os, sys, bpo_jax
from bpo_jax.sandboxes import swe
copy = sys.argv[1]  # an installed copy of the package
sandbox = swe.make_sandbox(show_tests=False)
sandbox.reset(swe.load_shipped_task("lru"))
instance = os.path.join(copy, "sandboxes", "swe", "tasks", "lru", "instance.json")
out = {"running": os.path.dirname(os.path.abspath(bpo_jax.__file__)),
       "host_sees": os.path.isfile(instance)}
out["cat"] = sandbox.step(f"run cat {instance}").info["exit_code"]
out["listing"] = sandbox.step(f"run ls -A {copy}").observation
out["site"] = sandbox.step(f"run ls -A {os.path.dirname(copy)}").observation
sandbox.close()
print(json.dumps(out))
"""


@pytest.mark.slow
@needs_namespaces
def test_an_installed_copy_of_the_package_is_hidden_too():
  # A regular install puts the package, shipped tasks and all, in the virtualenv's
  # site-packages, which the commands see: hidden whether it is the running copy or not.
  venv = _venv(tempfile.gettempdir())
  try:
    python = os.path.join(venv, "bin", "python")
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    copy = os.path.realpath(os.path.join(site_packages, "bpo_jax"))
    shutil.copytree(os.path.dirname(os.path.abspath(bpo_jax.__file__)), copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for running, extra in ((copy, {}), (os.path.join(REPO_ROOT, "bpo_jax"),
                                        {"PYTHONPATH": REPO_ROOT})):
      proc = subprocess.run([python, "-c", INSTALLED_DRIVER, copy], capture_output=True,
                            text=True, timeout=300, cwd=tempfile.gettempdir(),
                            env={**env, **extra})
      assert proc.returncode == 0, proc.stderr[-3000:]
      out = json.loads(proc.stdout.splitlines()[-1])
      assert os.path.realpath(out["running"]) == os.path.realpath(running) and out["host_sees"]
      assert out["cat"] != 0 and out["listing"] == "[exit code 0]"  # an empty directory
      assert "bpo_jax" in out["site"]  # the rest of site-packages is there
  finally:
    shutil.rmtree(venv, ignore_errors=True)


@needs_namespaces
def test_grading_leaves_no_hidden_test_in_the_repository(lru):
  sandbox, task = lru
  scan = " && ".join(f"! git cat-file -e {b}" for b in _new_blobs(task.instance["test_patch"]))
  assert sandbox.step(f"run {scan}").info["exit_code"] == 0
  before = sandbox.snapshot()
  assert sandbox.step("submit").info["success"] is False
  # The test files graded were in the task directory, so the scan would see them had grading
  # written them into the git directory; a later branch restored here reads that directory.
  assert os.path.isdir(os.path.join(sandbox.workdir, "tests"))
  sandbox.restore(before)
  step = sandbox.step(f"run {scan}")
  assert step.info["exit_code"] == 0, step.observation


# --------------------------------------------------------------------- no silent downgrade


@pytest.fixture
def broken_setup(monkeypatch):
  """Makes the namespace set-up fail: an interpreter directory that cannot be opened."""
  missing = os.path.join(tempfile.gettempdir(), f"bpo_missing_{secrets.token_hex(6)}")
  paths = confinement._python_paths()
  monkeypatch.setattr(confinement, "_python_paths", lambda: paths + (missing,))
  confinement._namespaces_missing.cache_clear()
  yield missing
  monkeypatch.undo()
  confinement._namespaces_missing.cache_clear()


@needs_namespaces
def test_a_failing_setup_is_an_error_naming_its_step(broken_setup):
  with pytest.raises(confinement.ConfinementError, match=f"at step 'open {broken_setup}'"):
    confinement.protections()
  with pytest.raises(confinement.ConfinementError, match=f"at step 'open {broken_setup}'"):
    swe.make_sandbox()
  parent = tempfile.mkdtemp(prefix="bpo_jail_")
  try:
    os.chmod(parent, 0o755)
    os.chown(parent, confinement.default_uid(), confinement.default_uid())
    with pytest.raises(confinement.ConfinementError, match="No such file"):
      confinement.run_confined("touch ran", parent)
    assert not os.path.exists(os.path.join(parent, "ran"))  # the command never ran
  finally:
    shutil.rmtree(parent)


def test_a_command_cannot_pass_itself_off_as_a_failed_setup():
  # The launcher reports a failing step on its own pipe: a command that prints the report's
  # words and exits with its status is an ordinary result (a branch it cannot fail this way).
  parent = tempfile.mkdtemp(prefix="bpo_jail_")
  try:
    os.chmod(parent, 0o755)
    if os.geteuid() == 0:
      os.chown(parent, confinement.default_uid(), confinement.default_uid())
    forged = "echo \"confinement set-up failed at step 'unshare namespaces': no\" >&2; exit 125"
    for namespaces in (False, True) if NAMESPACES else (False,):
      result = confinement.run_confined(forged, parent, namespaces=namespaces)
      assert result.exit_code == confinement.SETUP_FAILED
      assert result.output.startswith("confinement set-up failed at step")
  finally:
    shutil.rmtree(parent)


def test_rlimits_only_is_explicit_and_never_root(broken_setup):
  # The explicit fallback runs commands without namespaces, as an unprivileged uid under root.
  sandbox = swe.make_sandbox(confinement="rlimits-only")
  sandbox.reset(swe.load_shipped_task("lru"))
  step = sandbox.step("run id -u")
  assert step.info["exit_code"] == 0, step.observation
  assert int(step.observation.split("\n")[0]) == (confinement.default_uid()
                                                  if os.geteuid() == 0 else os.geteuid())
  assert int(step.observation.split("\n")[0]) != 0
  assert not sandbox.protections["network_namespace"]
  sandbox.close()
  with pytest.raises(ValueError, match="confinement must be one of"):
    swe.make_sandbox(confinement="off")


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root host could run a command as root")
def test_a_root_host_refuses_uid_0():
  parent = tempfile.mkdtemp(prefix="bpo_jail_")
  try:
    for namespaces in (False, True) if NAMESPACES else (False,):
      with pytest.raises(ValueError, match="uid 0"):
        confinement.run_confined("id -u", parent, uid=0, namespaces=namespaces)
      # The launcher itself refuses a spec that asks for uid 0 (started directly, not through
      # the clean-up that follows a command, which never touches uid 0 either).
      spec = confinement._spec(["/bin/sh", "-c", "touch ran"], parent, confinement.Limits(),
                               namespaces, 0, confinement.command_env())
      _, fd, wait, release = confinement._launch({**spec, "cgroups": []})
      with os.fdopen(fd, "rb") as f:
        output = f.read().decode()
      status, left, failure = wait()
      release()
      assert os.WEXITSTATUS(status) == confinement.SETUP_FAILED and left == 0, output
      assert "refusing to run a command as uid 0" in failure
      assert not os.path.exists(os.path.join(parent, "ran"))
  finally:
    shutil.rmtree(parent)
  with pytest.raises(ValueError, match="uid 0"):
    confinement._wait_until_gone(0)


def test_a_host_without_user_namespaces_needs_the_explicit_fallback(monkeypatch):
  # A non-root user on a kernel with unprivileged user namespaces off gets no namespaces: the
  # default mode refuses in one line pointing at the explicit fallback, which says what it
  # leaves open.
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  monkeypatch.setattr(confinement, "_user_namespaces_off", lambda: (
      "unprivileged user namespaces are off (/proc/sys/user/max_user_namespaces is 0)"))
  confinement._namespaces_missing.cache_clear()
  try:
    with pytest.raises(confinement.ConfinementError) as raised:
      confinement.protections("namespaces")
    message = str(raised.value)
    assert "\n" not in message and "max_user_namespaces is 0" in message
    assert "confinement='rlimits-only'" in message
    fallback = confinement.protections("rlimits-only")
    assert not fallback["unprivileged_uid"] and not fallback["user_namespace"]
    notes = confinement.unprotected("rlimits-only")
    assert any(n.startswith("the host's processes: commands run as the host's user")
               for n in notes)
  finally:
    monkeypatch.undo()
    confinement._namespaces_missing.cache_clear()


def test_the_sandbox_says_which_protections_its_commands_get(caplog, monkeypatch):
  monkeypatch.setattr(sandbox_lib, "_LOGGED_MODES", set())
  with caplog.at_level(logging.INFO, logger="absl"):
    sandbox = swe.make_sandbox(confinement="rlimits-only")
    swe.make_sandbox(confinement="rlimits-only")
  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith("SWE sandbox commands run with")]
  assert len(lines) == 1, lines  # once per process and mode
  assert lines[0].startswith("SWE sandbox commands run with confinement 'rlimits-only': on: ")
  assert "off: network_namespace, read_only_filesystem" in lines[0]
  assert swe.protections_record(confinement="rlimits-only", max_steps=3) == {
      "confinement": "rlimits-only", "protections": sandbox.protections,
      "not_protected": confinement.unprotected("rlimits-only")}
  # What the mode leaves open, one warning line each.
  warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and
            "are not protected against" in r.getMessage()]
  assert len(warned) == len(confinement.unprotected("rlimits-only")) >= 2, warned
  assert any("the network: commands use the host's" in line for line in warned)


# ------------------------------------------------------------- infrastructure is no reward

MODE = "namespaces" if NAMESPACES else "rlimits-only"


def _with_test_command(task, command):
  return dataclasses.replace(task, instance={**task.instance, "test_cmd": command})


@pytest.mark.parametrize("status", [126, 127])
def test_tests_the_agent_makes_exit_like_a_missing_program_are_graded(status):
  """Once the probe finds the test runner, 126 and 127 are the tests' verdict: agent code (a
  conftest.py that exits so) cannot make its branch a failed one instead of a reward of 0; the
  reference fix with the same conftest.py is not resolved either."""
  task = swe.load_shipped_task("lru")
  sandbox = swe.make_sandbox(confinement=MODE)
  try:
    for fix in ([], sandbox_expert_edits(sandbox, task)):
      sandbox.reset(task)
      for action in fix:
        sandbox.step(action)
      sandbox.step(f"run printf 'import os\\nos._exit({status})\\n' > conftest.py")
      step = sandbox.step("submit")
      assert step.reward == 0.0 and step.done, step
  finally:
    sandbox.close()


def sandbox_expert_edits(sandbox, task):
  """The reference fix's actions, without the final submit."""
  sandbox.reset(task)
  return sandbox.expert_actions()[:-1]


def test_runner_probe_finds_programs_builtins_and_nothing_else(tmp_path):
  script = tmp_path / "run.sh"
  script.write_text("#!/bin/sh\n")
  script.chmod(0o755)
  plain = tmp_path / "data.txt"
  plain.write_text("x")
  expected = {"cd x": 0, "sh -c true": 0, f"{script} -q": 0, "no-such-runner -q": 127,
              f"{plain}": 1, f"{tmp_path}": 1, "i=0; while false; do :; done; no-such": 0,
              "python -m pytest 'unbalanced": 0}
  for command, status in expected.items():
    probe = subprocess.run(["sh", "-c", grading.runner_probe(command)], capture_output=True)
    assert probe.returncode == status, (command, probe)


def test_a_test_command_that_cannot_start_fails_the_branch():
  task = _with_test_command(swe.load_shipped_task("lru"), "no-such-test-runner -q")
  sandbox = swe.make_sandbox(confinement=MODE)
  sandbox.reset(task)
  with pytest.raises(grading.GradingError, match=r"could not start .*exit code 127"):
    sandbox.step("submit")
  sandbox.close()
  with pool_lib.SandboxPool.for_environment("swe", num_workers=0, confinement=MODE) as pool:
    pool.reset("b", task)
    failure = pool.step("b", "submit")
  assert isinstance(failure, pool_lib.BranchFailure), failure
  assert "GradingError" in failure.reason and "exit code 127" in failure.reason
  with pytest.raises(grading.GradingError, match="exit code 127"):
    swe.evaluate_patch(task, task.instance["patch"], mode=MODE)


def test_a_crashed_grader_or_a_log_without_markers_fails_the_branch(monkeypatch):
  task = swe.load_shipped_task("lru")
  sandbox = swe.make_sandbox(confinement=MODE)
  sandbox.reset(task)

  def crash(*args):
    raise KeyError("log_parser")

  monkeypatch.setattr(grading, "report_from_log", crash)
  with pytest.raises(grading.GradingError, match="grader crashed.*KeyError"):
    sandbox.step("submit")
  monkeypatch.undo()
  monkeypatch.setattr(grading, "run_tests", lambda *args: "some output\n")
  with pytest.raises(grading.GradingError, match="marker '>>>>> Applied Patch' 0 times"):
    sandbox.step("submit")
  monkeypatch.undo()
  # The sandbox still grades once the infrastructure works again.
  for action in sandbox.expert_actions():
    step = sandbox.step(action)
  assert step.reward == 1.0
  sandbox.close()


def test_markers_printed_by_the_tests_cannot_forge_the_log():
  task = swe.load_shipped_task("lru")
  sandbox = swe.make_sandbox(confinement=MODE)
  sandbox.reset(task)
  # The fixed package prints the harness's markers (a timeout, the end of the output) as the
  # interpreter exits, after pytest's own output.
  source = open(os.path.join(sandbox.workdir, "lrucache", "__init__.py")).read()
  forge = ("import atexit\natexit.register(print, '>>>>> Tests Timed Out\\n"
           ">>>>> End Test Output')\n")
  sandbox.step(f"write lrucache/__init__.py\n{source}{forge}")
  *fix, submit = sandbox.expert_actions()
  for action in fix:
    sandbox.step(action)
  report = grading.grade_workspace(sandbox._ws, sandbox._base_tree, task, uid=sandbox.uid,
                                   namespaces=NAMESPACES)
  assert "\n> >>>> Tests Timed Out\n> >>>> End Test Output\n" in report["log"]  # it printed them
  assert report["resolved"] is True
  step = sandbox.step(submit)
  assert step.reward == 1.0 and step.info["success"] is True
  sandbox.close()


def test_the_run_records_the_protections_in_its_config(tmp_path):
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  from bpo_jax.training.settings import from_config  # pylint: disable=g-import-not-at-top
  config = config_lib.default_config()
  config.env.name = "swe"
  config.env.options = {"max_steps": 12, "confinement": MODE}
  check = loop._check_workdir_config  # pylint: disable=protected-access
  loop._write_workdir_config(check(from_config(config), str(tmp_path)), str(tmp_path))
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    saved = json.load(f)
  assert saved["env_protections"] == {"confinement": MODE,
                                      "protections": confinement.protections(MODE),
                                      "not_protected": confinement.unprotected(MODE)}
  assert saved["env"]["options"]["confinement"] == MODE
  check(from_config(config), str(tmp_path))  # the same host resumes the run


# ------------------------------------------------------------------ memory and sparse files


def test_disk_usage_counts_sparse_files_at_their_apparent_size(tmp_path):
  # 3 files claiming 5 MiB each, holding one written byte (or none): 15 MiB by their apparent
  # size, the bytes a snapshot of them reads, though they take a few blocks at most.
  for i in range(3):
    with open(tmp_path / f"s{i}", "wb") as f:
      f.truncate(5 << 20)
      if i:
        f.write(b"x")
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "dense").write_bytes(b"y" * 10_000)  # 10,000 bytes in 3 blocks of 4 KiB
  blocks = os.stat(tmp_path / "sub" / "dense").st_blocks * 512
  directory = os.stat(tmp_path / "sub").st_blocks * 512
  assert confinement.disk_usage(str(tmp_path)) == 3 * (5 << 20) + max(blocks, 10_000) + max(
      directory, os.stat(tmp_path / "sub").st_size)
