"""Real SWE-bench instances selected by config: rows, local clones, and each row's test spec.

    env.options.instances = "verified.jsonl"    # SWE-bench rows (JSON list, object or lines)
    env.options.repos_dir = "repos"             # clones at repos/<owner>__<name>
    env.options.envs_dir = "envs"               # per-instance Python environments (envs.py)
    env.options.specs = "specs.json"            # optional: {"owner/name": {"version": spec}}
    env.options.eval_instances = "..."          # optional: the "test" split's rows

A row needs SWE-bench Verified's fields (repo, instance_id, base_commit, patch, test_patch,
FAIL_TO_PASS, PASS_TO_PASS, version, environment_setup_commit; problem_statement). Its test
spec (how its tests run and are read) comes, key by key, from the row itself, else from the
`specs` entry of its repository and version:

  * `eval_script`: the harness script that swebench (>= 5) ships with each instance; the
    commands between its start and end markers are the test command, run as they are.
  * `test_cmd`: a test command instead; the test patch's files are appended to it, as
    swebench's harness does for pytest repositories.
  * `log_parser`: a name in swebench's PARSER_REGISTRY (e.g. "parse_log_pytest",
    "parse_log_django"); `eval_type`: "pass_and_fail" (default) or "fail_only".
  * `install`: shell commands that build its environment (envs.py); `system_site_packages`,
    `with_pip`: how its virtualenv is made.

A row with no test command or no log parser from either source is an error naming it, and so
is a row that `rows.check_row` refuses (a log parser swebench lacks, a patch or test patch that
does not apply at the base commit, a FAIL_TO_PASS test absent after the test patch): one
`TaskInputError` line naming the file, the row (index and instance id) and the field. The "train"
split is the rows of `instances`, the "test" split those of `eval_instances` (default: the same
rows), each shuffled with the seed and repeated to `num`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
from typing import Any, Mapping

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes.swe import rows as rows_lib
from bpo_jax.sandboxes.swe import tasks as tasks_lib

OPTIONS = frozenset({"instances", "eval_instances", "repos_dir", "envs_dir", "specs"})
SPEC_KEYS = ("test_cmd", "log_parser", "eval_type", "install", "system_site_packages",
             "with_pip")
REAL_REQUIRED = tasks_lib.REQUIRED + ("version", "environment_setup_commit")
_START, _END = ">>>>> Start Test Output", ">>>>> End Test Output"
_HEX = re.compile(r"^[0-9a-fA-F]{7,40}$")


def eval_script_command(script: str) -> str:
  """The commands between an eval script's start and end markers (the tests it runs)."""
  lines = script.splitlines()
  starts = [i for i, line in enumerate(lines) if _START in line]
  ends = [i for i, line in enumerate(lines) if _END in line]
  if len(starts) != 1 or len(ends) != 1 or ends[0] <= starts[0] + 1:
    raise base.TaskInputError("its eval_script does not bracket one test command with the "
                              f"harness's {_START!r} / {_END!r} markers")
  return "\n".join(line for line in lines[starts[0] + 1:ends[0]] if line.strip())


def resolve_spec(row: Mapping[str, Any], specs: Mapping[str, Any],
                 where: str | None = None) -> dict[str, Any]:
  """The row with its test spec filled in (see the module docstring).

  Raises:
    base.TaskInputError: no test command or no log parser for the row, or a malformed spec,
      in one line starting with `where` (default: the instance id) and naming the field.
  """
  where = where or f"instance {row['instance_id']}"
  entry = specs.get(row["repo"], {}).get(str(row["version"]), {})
  out = dict(row)
  for key in SPEC_KEYS:
    if key not in out and key in entry:
      out[key] = entry[key]
  if out.get("eval_script"):
    try:
      out["test_cmd"] = eval_script_command(out["eval_script"])
    except ValueError as e:
      raise base.TaskInputError(f"{where}: field eval_script: {e}") from e
    out["test_cmd_exact"] = True
  missing = [key for key in ("test_cmd", "log_parser") if not out.get(key)]
  if missing:
    raise base.TaskInputError(
        f"{where}: field {missing[0]}: none for {row['repo']} version {row['version']}, no "
        f"{' and no '.join(missing)}; give eval_script (or test_cmd) and log_parser in the row "
        "or in env.options.specs")
  install = out.setdefault("install", [])
  if not isinstance(install, list) or not all(isinstance(s, str) for s in install):
    raise base.TaskInputError(f"{where}: field install: must be a list of shell commands")
  return out


def _check_clone(row: Mapping[str, Any], repos_dir: str, where: str) -> str:
  clone = os.path.join(repos_dir, row["repo"].replace("/", "__"))
  if not os.path.isdir(clone):
    raise base.TaskInputError(f"{where}: field repo: {row['repo']} is not in "
                              f"env.options.repos_dir (no clone at {clone})")
  for key in ("base_commit", "environment_setup_commit"):
    commit = row[key]
    if not isinstance(commit, str) or not _HEX.match(commit) or subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", clone, "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True).returncode != 0:
      raise base.TaskInputError(f"{where}: field {key}: {commit} is not a commit of the clone at "
                                f"{clone}")
  return os.path.abspath(clone)


def _read_specs(specs_path: str | None) -> Mapping[str, Any]:
  """{repo: {version: spec}} of `env.options.specs` ({} without one)."""
  if not specs_path:
    return {}
  rows = tasks_lib.read_rows(specs_path, "env.options.specs")
  specs = rows[0] if len(rows) == 1 else None
  if not isinstance(specs, dict):
    raise base.TaskInputError(f"env.options.specs = {specs_path!r}: must be a JSON object")
  for repo, versions in specs.items():
    if not isinstance(versions, dict) or not all(isinstance(v, dict) for v in versions.values()):
      raise base.TaskInputError(f"env.options.specs = {specs_path!r}: entry {repo!r} must map "
                                "each version to a JSON object of spec keys")
  return specs


def load_row(row: Any, specs: Mapping[str, Any], repos_dir: str, where: str,
             envs_dir: str | None) -> tasks_lib.SweTask:
  """One row as a task: its fields and their types, its test spec, its clone and commits, and
  `rows.check_row` (log parser, both patches, FAIL_TO_PASS tests).

  Raises:
    base.TaskInputError: one line, `where` and the field at fault.
  """
  if not isinstance(row, Mapping):
    raise base.TaskInputError(f"{where}: must be a JSON object, got {tasks_lib.json_type(row)}")
  missing = [key for key in REAL_REQUIRED if key not in row]
  if missing:
    raise base.TaskInputError(f"{where}: lacks field{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(missing)}")
  tasks_lib.normalize_instance(row, where)  # the fields' types, before the spec reads them
  if isinstance(row["version"], bool) or not isinstance(row["version"], (str, int, float)):
    raise base.TaskInputError(f"{where}: field version: must be a string, got "
                              f"{tasks_lib.json_type(row['version'])}")
  instance = tasks_lib.normalize_instance(resolve_spec(row, specs, where), where)
  clone = _check_clone(instance, repos_dir, where)
  rows_lib.check_row(instance, rows_lib.git_dir_of(clone), instance["base_commit"], where)
  return tasks_lib.SweTask(task_id=instance["instance_id"], instance=instance, git_source=clone,
                           envs_dir=os.path.abspath(envs_dir) if envs_dir else None)


def _check_swebench() -> None:
  if importlib.util.find_spec("swebench") is None:
    raise base.TaskInputError("env.options.instances needs swebench for its log parsers and "
                              "report: pip install 'bpo_jax[swe]'")


def load_tasks(path: str, repos_dir: str, specs_path: str | None = None,
               envs_dir: str | None = None) -> list[tasks_lib.SweTask]:
  """Every row of `path` as a task, checked against its clone and given its test spec.

  Raises:
    base.TaskInputError (a ValueError): one line naming the first bad input (file, field,
      clone, commit, spec).
  """
  _check_swebench()
  if not repos_dir or not os.path.isdir(repos_dir):
    raise base.TaskInputError(f"env.options.repos_dir = {repos_dir!r}: no such directory")
  specs = _read_specs(specs_path)
  tasks = []
  for i, row in enumerate(tasks_lib.read_rows(path)):
    name = row.get("instance_id") if isinstance(row, Mapping) else None
    where = f"{path}: row {i}" + (f" (instance {name})" if isinstance(name, str) else "")
    tasks.append(load_row(row, specs, repos_dir, where, envs_dir))
  if not tasks:
    raise base.TaskInputError(f"{path}: no instances")
  return tasks


def make_tasks(split: str, num: int, seed: int, instances: str, repos_dir: str | None = None,
               eval_instances: str | None = None, envs_dir: str | None = None,
               specs: str | None = None) -> list[tasks_lib.SweTask]:
  """`num` tasks of `split` from the instance files (see the module docstring)."""
  path = instances if split == "train" else (eval_instances or instances)
  if not path:
    raise base.TaskInputError("env.options.instances is empty: give "
                              "--config.env.options.instances=<json or jsonl file>")
  if not envs_dir:
    raise base.TaskInputError("env.options.instances needs env.options.envs_dir (where each "
                              "instance's Python environment is built)")
  tasks = load_tasks(path, repos_dir or "", specs, envs_dir)
  random.Random(seed).shuffle(tasks)
  return [tasks[i % len(tasks)] for i in range(num)]

