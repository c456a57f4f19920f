"""SWE tasks: a repository, a problem statement and the tests that grade a fix.

A task carries a SWE-bench instance (`instance_id`, `repo`, `base_commit`, `problem_statement`,
`patch` (reference fix), `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, `log_parser`, ...) and the
source of its repository at `base_commit`: either the files themselves (the tasks shipped under
`tasks/<name>/`) or a local git clone holding that commit (real SWE-bench instances; nothing is
downloaded).

    tasks = make_tasks("train", num=4, seed=0)
    tasks[0].task_id         # "bpo_jax__csv_split-1"
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import subprocess
from typing import Any, Mapping, Sequence

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes.swe import rows as rows_lib
from bpo_jax.sandboxes.swe import workspace as workspace_lib

TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")
# How the tests run when an instance names no command: SWE-bench's pytest flags; the test files
# of the test patch are appended, as SWE-bench's harness does.
DEFAULT_TEST_COMMAND = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider"
SPLITS = ("train", "test")
# SweSandbox's constructor arguments, accepted (and ignored) by make_tasks.
SANDBOX_OPTIONS = frozenset({"limits", "grading_limits", "max_steps", "show_tests",
                             "max_view_lines", "window_lines", "root",
                             "confinement"})
REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
             "FAIL_TO_PASS", "PASS_TO_PASS")


@dataclasses.dataclass(frozen=True)
class SweTask:
  """One SWE task; picklable, `task_id` is the instance id.

  files: (path, git mode, content) of the repository at `base_commit`, or empty when
    `git_source` names a local clone that holds `base_commit`.
  """

  task_id: str
  instance: Mapping[str, Any]
  files: tuple[tuple[str, str, bytes], ...] = ()
  git_source: str | None = None
  envs_dir: str | None = None

  @property
  def has_env(self) -> bool:
    """Whether its tests run in an environment of its own (envs.py), not this interpreter's."""
    return bool(self.envs_dir and self.git_source)

  @property
  def problem_statement(self) -> str:
    return self.instance["problem_statement"]

  @property
  def test_command(self) -> str:
    return self.instance.get("test_cmd") or DEFAULT_TEST_COMMAND

  def grading_command(self, test_files: Sequence[str]) -> str:
    """The command that runs the hidden tests: an eval script's command as it is, else the test
    command followed by the test patch's files."""
    if self.instance.get("test_cmd_exact"):
      return self.test_command
    return " ".join([self.test_command] + list(test_files))

  @property
  def fail_to_pass(self) -> list[str]:
    return list(self.instance["FAIL_TO_PASS"])

  @property
  def pass_to_pass(self) -> list[str]:
    return list(self.instance["PASS_TO_PASS"])


# Fields that must hold a non-empty string.
TEXT_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
# Optional fields that, when given, must be strings.
OPTIONAL_TEXT_FIELDS = ("log_parser", "test_cmd", "eval_script")
EVAL_TYPES = ("pass_and_fail", "fail_only")  # swebench's EvalType values


def json_type(value: Any) -> str:
  """How JSON names the type of a parsed value ("null", "a list", ...), for error messages."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "a boolean"
  return {dict: "an object", list: "a list", str: "a string", int: "a number",
          float: "a number"}.get(type(value), type(value).__name__)


def _test_ids(value: Any, key: str, where: str) -> list[str]:
  """A FAIL_TO_PASS / PASS_TO_PASS field: a list of test ids, or the JSON text of one (as the
  HF datasets store it)."""
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise base.TaskInputError(f"{where}: field {key}: not a JSON list of test ids "
                                f"({e})") from None
  if not isinstance(value, list):
    raise base.TaskInputError(f"{where}: field {key}: must be a list of test ids, got "
                              f"{json_type(value)}")
  for j, test in enumerate(value):
    if not isinstance(test, str) or not test:
      raise base.TaskInputError(f"{where}: field {key}: entry {j} must be a test id (a non-empty "
                                f"string), got {json_type(test)}")
  return value


def normalize_instance(instance: Mapping[str, Any], where: str | None = None) -> dict[str, Any]:
  """Checks an instance's SWE-bench fields and their types; decodes the JSON-string test lists
  of the HF datasets; fills `log_parser` ("parse_log_pytest") and `eval_type`
  ("pass_and_fail").

  Raises:
    base.TaskInputError (a ValueError): one line, `where` (default: the instance id) and the
      field, e.g. "instance x: field problem_statement: must be a string, got null".
  """
  if not isinstance(instance, Mapping):
    raise base.TaskInputError(f"{where or 'a SWE-bench instance'}: must be a JSON object, got "
                              f"{json_type(instance)}")
  where = where or f"instance {instance.get('instance_id', '<no instance_id>')}"
  missing = [key for key in REQUIRED if key not in instance]
  if missing:
    raise base.TaskInputError(f"{where}: lacks field{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(missing)}")
  for key in TEXT_FIELDS + OPTIONAL_TEXT_FIELDS:
    value = instance.get(key)
    if key in OPTIONAL_TEXT_FIELDS and value is None:
      continue
    if not isinstance(value, str) or not value.strip():
      got = "an empty string" if isinstance(value, str) else json_type(value)
      raise base.TaskInputError(f"{where}: field {key}: must be a non-empty string, got {got}")
  out = dict(instance)
  for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
    out[key] = _test_ids(out[key], key, where)
  if not out["FAIL_TO_PASS"]:
    raise base.TaskInputError(f"{where}: field FAIL_TO_PASS: names no test (a fix would be "
                              "graded by nothing)")
  out.setdefault("log_parser", "parse_log_pytest")
  out.setdefault("eval_type", "pass_and_fail")
  if out["eval_type"] not in EVAL_TYPES:
    raise base.TaskInputError(f"{where}: field eval_type: must be one of {list(EVAL_TYPES)}, got "
                              f"{out['eval_type']!r}")
  return out


def _read_files(root: str) -> tuple[tuple[str, str, bytes], ...]:
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".pytest_cache"))
    for name in sorted(filenames):
      full = os.path.join(dirpath, name)
      mode = "100755" if os.access(full, os.X_OK) else "100644"
      with open(full, "rb") as f:
        files.append((os.path.relpath(full, root).replace(os.sep, "/"), mode, f.read()))
  return tuple(sorted(files))


def shipped_task_names() -> list[str]:
  """Names of the tasks shipped with the package."""
  return sorted(name for name in os.listdir(TASKS_DIR)
                if os.path.isfile(os.path.join(TASKS_DIR, name, "instance.json")))


def load_shipped_task(name: str) -> SweTask:
  """The shipped task `name` (a directory under `tasks/`)."""
  if name not in shipped_task_names():
    raise KeyError(f"unknown SWE task {name!r}; shipped tasks: {', '.join(shipped_task_names())}")
  with open(os.path.join(TASKS_DIR, name, "instance.json"), encoding="utf-8") as f:
    instance = normalize_instance(json.load(f))
  return SweTask(task_id=instance["instance_id"], instance=instance,
                 files=_read_files(os.path.join(TASKS_DIR, name, "repo")))


def make_tasks(split: str, num: int, seed: int, **config) -> list[SweTask]:
  """`num` shipped tasks of `split` ("train": 8 tasks, "test": 4, disjoint) in a seeded order.

  The split's tasks are shuffled with `seed` and repeated in that order when `num` exceeds them.
  `config` may hold the sandbox's options (one options dict often configures both); they do not
  change the tasks. Any other key is an error.
  """
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
  if not isinstance(num, int) or num < 0:
    raise ValueError(f"num must be a non-negative integer, got {num!r}")
  unknown = set(config) - SANDBOX_OPTIONS
  if unknown:
    raise TypeError(f"make_tasks got unknown config keys: {', '.join(sorted(unknown))}; "
                    f"known (sandbox options): {', '.join(sorted(SANDBOX_OPTIONS))}")
  tasks = [load_shipped_task(name) for name in shipped_task_names()]
  tasks = [t for t in tasks if t.instance.get("split") == split]
  random.Random(seed).shuffle(tasks)
  return [tasks[i % len(tasks)] for i in range(num)]


def read_rows(path: str, what: str = "env.options.instances") -> list[dict[str, Any]]:
  """The rows of a JSON list, a JSON object or a JSON-lines file.

  Raises:
    base.TaskInputError: the file is missing or is neither JSON nor JSON lines.
  """
  if not path:
    raise base.TaskInputError(f"{what} is empty: give a JSON or JSON-lines file")
  if not os.path.isfile(path):
    raise base.TaskInputError(f"{what} = {path!r}: no such file")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  try:
    data = json.loads(text)
  except json.JSONDecodeError:
    try:
      data = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
      raise base.TaskInputError(f"{what} = {path!r} is neither JSON nor JSON lines: {e}") from e
  return data if isinstance(data, list) else [data]


def load_swebench_instances(path: str, repos_dir: str,
                            instance_ids: Sequence[str] | None = None) -> list[SweTask]:
  """Tasks from real SWE-bench instance JSON (a list, one object, or JSON lines).

  Each instance's repository must already be cloned (no network) at
  `repos_dir/<owner>__<name>` (the instance's `repo` with "/" as "__") and hold `base_commit`.

  Tests run with this interpreter (the repository's dependencies must be installed in it; a run
  selects instances with their own environments and specs through `instances.py` instead) and,
  unless the instance names a `test_cmd`, with SWE-bench's pytest command on the test patch's
  files, read by the instance's `log_parser` (default `parse_log_pytest`). Repositories that
  SWE-bench tests another way (django's runtests.py, sympy's bin/test) need `test_cmd` and
  `log_parser` in their instance JSON.

  Each row is checked as a run's rows are (`rows.check_row`: the log parser, both patches at the
  base commit, the FAIL_TO_PASS tests after the test patch).

  Raises:
    base.TaskInputError (a ValueError): one line naming the row and the field: malformed JSON
      or instance, a requested id that is absent, a missing clone or base commit, a patch that
      does not apply.
  """
  instances = []
  for i, row in enumerate(read_rows(path, "instances file")):
    name = row.get("instance_id") if isinstance(row, Mapping) else None
    where = f"{path}: row {i}" + (f" (instance {name})" if isinstance(name, str) else "")
    instances.append((where, normalize_instance(row, where)))
  if instance_ids is not None:
    by_id = {i["instance_id"]: (w, i) for w, i in instances}
    absent = [i for i in instance_ids if i not in by_id]
    if absent:
      raise base.TaskInputError(f"instances not in {path}: {', '.join(absent)}")
    instances = [by_id[i] for i in instance_ids]
  tasks = []
  for where, instance in instances:
    clone = os.path.join(repos_dir, instance["repo"].replace("/", "__"))
    if not os.path.isdir(clone):
      raise base.TaskInputError(f"{where}: field repo: needs a clone of {instance['repo']} at "
                                f"{clone}")
    found = re.fullmatch(r"[0-9a-fA-F]{7,40}", instance["base_commit"]) and subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", clone, "cat-file", "-e",
         f"{instance['base_commit']}^{{commit}}"], capture_output=True).returncode == 0
    if not found:
      raise base.TaskInputError(f"{where}: field base_commit: the clone at {clone} lacks "
                                f"{instance['base_commit']}")
    rows_lib.check_row(instance, rows_lib.git_dir_of(clone), instance["base_commit"], where)
    tasks.append(SweTask(task_id=instance["instance_id"], instance=instance,
                         git_source=os.path.abspath(clone)))
  return tasks


def materialize(task: SweTask, workspace) -> str:
  """Fills an empty `workspace.Workspace` with the task's repository; returns the base tree id.

  Shipped tasks write their files; a task from a clone gets the files of `base_commit` (git
  archive), stored in the workspace's own object store: nothing of the clone's other commits
  (the fix, the hidden tests) is reachable from the task directory or its git directory.
  """
  if task.files:
    workspace.write_files(task.files)
    tree = workspace.write_tree()
  elif task.git_source:
    workspace_lib.extract_commit(task.git_source, task.instance["base_commit"], workspace.workdir)
    tree = workspace.write_tree()
  else:
    raise ValueError(f"task {task.task_id} has neither files nor a git source")
  workspace.fix_ownership()
  return tree
