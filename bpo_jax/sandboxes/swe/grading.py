"""Grading a task directory the way SWE-bench's harness does, with `swebench`'s own report.

SWE-bench evaluates a prediction by applying the model's patch at `base_commit`, resetting the
files the test patch touches to their base version, applying the test patch, running the test
command on those test files, and reading the log (between its start/end markers) with the
instance's log parser; `get_eval_report` then requires every FAIL_TO_PASS and PASS_TO_PASS test
to pass. Here the model's patch is the task directory's diff from the base tree, the tests run
inside the confinement, and the log is written in the harness's format so that `swebench`'s
`get_eval_report` grades it unchanged.

Only the grading half of `swebench` is used (log parsers and report); its Docker harness and
dataset download are not needed.

Infrastructure is never a verdict: a test command that cannot start (Python that does not start, or
its program not found or not executable in the confined environment, probed before the tests:
`runner_probe`; or a confinement that cannot be set up), a log without the harness's markers, a grader that
crashes, a git or OS error (a full disk), a test patch that does not apply (the test files are
put back as at the base first, clearing whatever the agent put in their way, and the patch
applies there: `rows.check_row` checks it at load), or a disk with under `MIN_FREE_BYTES` free
before or after the tests raises `GradingError`, which fails the branch (see
sandboxes/pool.py) instead of scoring it. Once the probe has found the program, every exit
status of the tests is a verdict, 126 and 127 included: code the agent wrote (a conftest.py that
exits 127) cannot turn its own failure into a failed branch. Harness markers printed by the tests
themselves are defanged, so the command's output cannot forge or cut the harness's own lines. Grading leaves no
trace of the test patch in the task's git directory (commands can read it), not even a copy that
the tests or the agent's code made while they ran, so tests hidden from the agent stay hidden.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import tempfile
from typing import Any

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes.swe import confinement
from bpo_jax.sandboxes.swe import envs as envs_lib
from bpo_jax.sandboxes.swe import tasks as tasks_lib
from bpo_jax.sandboxes.swe import workspace as workspace_lib

# Tests get more room than agent commands: a truncated log would lose the summary lines.
GRADING_LIMITS = confinement.Limits(wall_seconds=60.0, cpu_seconds=60, max_output_chars=2_000_000,
                                    kill_output_bytes=8 << 20)
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
# Free space the task directory's disk must have before and after the tests run.
MIN_FREE_BYTES = 1 << 20


class GradingError(base.EnvironmentFailure):
  """The tests could not be run or read: an infrastructure failure, not a verdict on the patch."""


def patched_files(patch: str) -> list[str]:
  """Paths a git-format patch touches (its `b/` side), in order."""
  return list(dict.fromkeys(b for _, b in _DIFF_HEADER.findall(patch)))


def _swebench():
  # swebench's harness imports docker and friends; load it only when grading.
  from swebench.harness import constants, grading  # pylint: disable=g-import-not-at-top
  from swebench import types  # pylint: disable=g-import-not-at-top
  return constants, grading, types


def _clear_way(workdir: str, path: str) -> None:
  """Removes what stands where the test file `path` goes: a file or link in place of one of its
  directories, a directory or link in place of the file. Nothing is followed, so a link the
  agent made cannot point the hidden tests, or their removal, outside the task directory."""
  parts = path.split("/")
  if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
    raise GradingError(f"the test patch names the path {path!r}, which leaves the task directory")
  current = workdir
  for part in parts[:-1]:
    current = os.path.join(current, part)
    if not os.path.lexists(current):
      return
    if os.path.islink(current) or not os.path.isdir(current):
      os.unlink(current)
      return
  current = os.path.join(current, parts[-1])
  if os.path.islink(current):
    os.unlink(current)
  elif os.path.isdir(current):
    shutil.rmtree(current)


def _reset_test_files(ws: workspace_lib.Workspace, tree: str, test_files: list[str]) -> None:
  """Puts each of `test_files` back as it is in `tree` (removed if not there), from the object
  store, so no other version of them is ever written into it; whatever the agent put in their
  way goes first, so the test patch then applies as it does at the base."""
  for path in test_files:
    _clear_way(ws.workdir, path)
    # Literal pathspecs and NUL-separated names: a path with glob characters or non-ASCII
    # letters names that one file.
    listed = ws.git("--literal-pathspecs", "ls-tree", "-r", "-z", "--name-only", tree, "--",
                    path).decode("utf-8", errors="surrogateescape").split("\0")
    if path in listed:
      ws.git("--literal-pathspecs", "checkout", tree, "--", path)
    elif os.path.lexists(os.path.join(ws.workdir, path)):
      os.unlink(os.path.join(ws.workdir, path))


def check_free_space(path: str, task_id: str, when: str) -> None:
  """Raises GradingError when the filesystem of `path` has under MIN_FREE_BYTES free: a run
  of the tests there may fail for want of space, and its verdict would not be the patch's."""
  st = os.statvfs(path)
  free = st.f_bavail * st.f_frsize
  if free < MIN_FREE_BYTES:
    raise GradingError(f"the disk of the task directory of {task_id} has {free} bytes free "
                       f"{when} (under {MIN_FREE_BYTES}): no verdict")


def _defang(output: str) -> str:
  """The harness's markers start lines with ">>>>>"; the tests' own such lines get a space."""
  return re.sub(r"^>>>>>", "> >>>>", output, flags=re.M)


def env_access(env: envs_lib.PythonEnv | None, workdir: str, namespaces: bool) -> dict:
  """`run_confined` arguments that give a command the environment `env` (none for None): its
  `bin` first on PATH, the task directory on PYTHONPATH, the environment reachable."""
  if env is None:
    return {}
  pythonpath = confinement.CONFINED_WORKDIR if namespaces else workdir
  return {"env": env.command_env(pythonpath), "reachable": [env.path]}


def runner_probe(command: str) -> str:
  """A shell command that exits 0 iff the infrastructure can start `command`'s tests: Python
  starts in isolated mode (`-I`: nothing of the task directory or the environment variables is
  read, so agent code cannot fail it), and where the command begins with a program name,
  `command -v` finds it (a builtin or keyword, or an executable regular file). A compound
  command (`i=0; while ...`) is probed for Python alone."""
  checks = ["python -I -c pass"]
  try:
    words = shlex.split(command)
  except ValueError:  # unbalanced quotes: no program name to probe
    words = []
  if words and re.fullmatch(r"[\w./+-]+", words[0]):
    quoted = shlex.quote(words[0])
    # A builtin prints its name; a program, a path to check for execute permission.
    checks.append(f'p=$(command -v {quoted}) && case "$p" in */*) [ -x "$p" ] && [ -f "$p" ];; '
                  'esac')
  return " && ".join(f"{{ {check}; }}" for check in checks)


def run_tests(ws: workspace_lib.Workspace, base_tree: str, task: tasks_lib.SweTask,
              limits: confinement.Limits = GRADING_LIMITS, uid: int | None = None,
              namespaces: bool = True, env: envs_lib.PythonEnv | None = None) -> str:
  """Resets the test patch's files, applies it, runs the tests (with the instance's environment
  `env`, else this interpreter); returns the harness-format log.

  The working directory is left with the test patch applied; callers restore their tree.

  Raises:
    GradingError: the test command could not start or could not be confined.
  """
  constants, _, _ = _swebench()
  test_patch = task.instance["test_patch"]
  test_files = patched_files(test_patch)
  _reset_test_files(ws, base_tree, test_files)
  try:
    ws.git("apply", "--whitespace=nowarn", "-", input=test_patch.encode())
  except workspace_lib.GitError as e:
    # The test files were just put back as at the base, where the patch applies (checked at
    # load): a failure here is the host's, not the agent's.
    raise GradingError(f"the test patch of {task.task_id} does not apply: {e}") from e
  ws.fix_ownership()
  check_free_space(ws.workdir, task.task_id, "before the tests")
  lines = [constants.APPLY_PATCH_PASS]
  command = task.grading_command(test_files)
  confined = functools.partial(confinement.run_confined, cwd=ws.workdir, limits=limits, uid=uid,
                               namespaces=namespaces, **env_access(env, ws.workdir, namespaces))
  try:
    probe = confined(runner_probe(command))
    if probe.exit_code:
      raise GradingError(f"the test command of {task.task_id} could not start (`{command}`: "
                         f"exit code {probe.exit_code} finding its program)")
    result = confined(command)
  except confinement.ConfinementError as e:
    raise GradingError(f"the tests of {task.task_id} could not run: {e}") from e
  check_free_space(ws.workdir, task.task_id, "after the tests")
  lines += [constants.START_TEST_OUTPUT, _defang(result.output), constants.END_TEST_OUTPUT,
            f"{constants.TEST_EXIT_CODE}: {result.exit_code}"]
  if result.timed_out:
    lines.append(constants.TESTS_TIMEOUT)
  elif result.output_limited:
    lines.append(constants.TESTS_ERROR)
  return "\n".join(lines) + "\n"


def _check_log(log: str) -> None:
  constants, _, _ = _swebench()
  for marker in (constants.APPLY_PATCH_PASS, constants.START_TEST_OUTPUT,
                 constants.END_TEST_OUTPUT, constants.TEST_EXIT_CODE):
    if log.count(marker) != 1:
      raise GradingError(f"the test log holds the harness marker {marker!r} {log.count(marker)} "
                         "times, not once")


def report_from_log(task: tasks_lib.SweTask, model_patch: str, log: str) -> dict[str, Any]:
  """`swebench.harness.grading.get_eval_report` for this task's log."""
  _, grading, types = _swebench()
  instance = task.instance
  spec = types.TestSpec(
      instance_id=instance["instance_id"], image="", eval_script_list=[],
      repo=instance["repo"], version=str(instance.get("version", "")),
      FAIL_TO_PASS=task.fail_to_pass, PASS_TO_PASS=task.pass_to_pass,
      log_parser=instance["log_parser"], eval_type=instance["eval_type"])
  prediction = {"instance_id": instance["instance_id"], "model_name_or_path": "bpo_jax",
                "model_patch": model_patch}
  with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
    f.write(log)
    f.flush()
    report = grading.get_eval_report(spec, prediction, f.name, include_tests_status=True)
  return report[instance["instance_id"]]


def grade_workspace(ws: workspace_lib.Workspace, base_tree: str, task: tasks_lib.SweTask,
                    limits: confinement.Limits = GRADING_LIMITS, uid: int | None = None,
                    namespaces: bool = True,
                    env: envs_lib.PythonEnv | None = None) -> dict[str, Any]:
  """Grades the working directory's current state; leaves the directory as it found it.

  Returns swebench's report for the instance (`resolved`, `tests_status`, ...) plus
  `model_patch` (the diff graded) and `log`.

  Raises:
    GradingError: the tests could not be run or read (infrastructure, not the patch): among
      others a git or OS error (a full disk), a test patch that does not apply, under
      MIN_FREE_BYTES free on the task directory's disk before or after the tests.
  """
  try:
    tree = ws.write_tree()
    model_patch = ws.diff(base_tree, tree)
    try:
      log = run_tests(ws, base_tree, task, limits, uid, namespaces, env)
    finally:
      # Not `checkout_tree`, which would store the files as they are now (the hidden tests,
      # and whatever the tests wrote) where commands of later branches could read them.
      ws.discard_changes(tree)
  except (workspace_lib.GitError, OSError) as e:
    raise GradingError(f"grading {task.task_id} failed: {type(e).__name__}: {e}") from e
  _check_log(log)
  try:
    report = report_from_log(task, model_patch, log)
  except Exception as e:  # pylint: disable=broad-except
    raise GradingError(f"the grader crashed on the log of {task.task_id}: "
                       f"{type(e).__name__}: {e}") from e
  return {**report, "model_patch": model_patch, "log": log}


def evaluate_patch(task: tasks_lib.SweTask, patch: str,
                   limits: confinement.Limits = GRADING_LIMITS,
                   mode: str = "namespaces") -> dict[str, Any]:
  """Grades `patch` (git format; "" for none) applied to the task's base in a scratch directory,
  with commands confined in `mode` (see confinement.py).

  Raises:
    ValueError: the patch does not apply to the base.
    GradingError: the tests could not be run or read.
  """
  uid = confinement.default_uid() if confinement.protections(mode)["unprivileged_uid"] else None
  with tempfile.TemporaryDirectory(prefix="bpo_swe_grade_") as parent:
    os.chmod(parent, 0o755)
    ws = workspace_lib.Workspace(parent, owner_uid=uid)
    base_tree = tasks_lib.materialize(task, ws)
    if patch:
      try:
        ws.git("apply", "--whitespace=nowarn", "-", input=patch.encode())
      except workspace_lib.GitError as e:
        raise ValueError(f"patch does not apply to task {task.task_id}: {e}") from e
    env = task_env(task)
    return grade_workspace(ws, base_tree, task, limits, uid, mode == "namespaces", env)


def task_env(task: tasks_lib.SweTask) -> envs_lib.PythonEnv | None:
  """The task's own environment (built on first use), or None: this interpreter's.

  Raises:
    GradingError: the environment could not be built (infrastructure, not the patch).
  """
  if not task.has_env:
    return None
  try:
    return envs_lib.ensure_env(task.envs_dir, task.instance, task.git_source)
  except envs_lib.EnvBuildError as e:
    raise GradingError(str(e)) from e
