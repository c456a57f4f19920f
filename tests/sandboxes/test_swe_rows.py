"""SWE-bench rows checked at load: each bad field is one line naming the row and the field
(exit status 2 from experiments/run.py); the checks read the clone without writing it, run once
per row content, and the reference fix is kept per patch content, not per instance id."""

import json
import os
import subprocess
import sys

import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import swe
from bpo_jax.sandboxes.swe import rows as rows_lib
from bpo_jax.sandboxes.swe import sandbox as sandbox_lib
from bpo_jax.sandboxes.swe import tasks as tasks_lib
from bpo_jax.sandboxes.swe import workspace as workspace_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST = "from mathlib import double\n\n\ndef test_zero():\n    assert double(0) in (0, 1)\n"
HIDDEN = "\n\ndef test_two():\n    assert double(2) == 4\n"


def _git(cwd, *args):
  return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, check=True,
                        capture_output=True, text=True,
                        env={**os.environ, **workspace_lib._COMMIT_ENV}).stdout


@pytest.fixture
def clone(tmp_path):
  """repos/acme__mathlib (base: the bug; a later commit: the fix and a hidden test) and a good
  row of it."""
  repo = tmp_path / "repos" / "acme__mathlib"
  (repo / "mathlib").mkdir(parents=True)
  (repo / "tests").mkdir()
  (repo / "mathlib" / "__init__.py").write_text("def double(x):\n    return x + x + 1\n")
  (repo / "tests" / "test_double.py").write_text(TEST)
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "commit", "-qm", "base")
  base_commit = _git(repo, "rev-parse", "HEAD").strip()
  (repo / "mathlib" / "__init__.py").write_text("def double(x):\n    return 2 * x\n")
  (repo / "tests" / "test_double.py").write_text(TEST + HIDDEN)
  _git(repo, "commit", "-qam", "fix")
  fix = _git(repo, "rev-parse", "HEAD").strip()
  _git(repo, "checkout", "-q", base_commit)
  row = {"repo": "acme/mathlib", "instance_id": "acme__mathlib-7", "base_commit": base_commit,
         "patch": _git(repo, "diff", base_commit, fix, "--", "mathlib"),
         "test_patch": _git(repo, "diff", base_commit, fix, "--", "tests"),
         "problem_statement": "double(2) is 5", "version": "0.1",
         "FAIL_TO_PASS": json.dumps(["tests/test_double.py::test_two"]),
         "PASS_TO_PASS": json.dumps(["tests/test_double.py::test_zero"]),
         "environment_setup_commit": fix, "log_parser": "parse_log_pytest",
         "test_cmd": tasks_lib.DEFAULT_TEST_COMMAND}
  return {"repo": repo, "row": row, "tmp": tmp_path}


def _options(clone, *rows):
  path = clone["tmp"] / "rows.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return {"instances": str(path), "repos_dir": str(clone["tmp"] / "repos"),
          "envs_dir": str(clone["tmp"] / "envs")}


def _load(clone, *rows):
  return swe.make_tasks("train", len(rows), 0, **_options(clone, *rows))


def test_locate_reads_the_test_id_forms():
  assert rows_lib.locate("a/test_x.py::TestC::test_f[1-a::b]") == ("a/test_x.py", "TestC")
  assert rows_lib.locate("a/test_x.py::test_f[x]") == ("a/test_x.py", "test_f")
  assert rows_lib.locate("a/test_x.py") == ("a/test_x.py", None)
  assert rows_lib.locate("test_f (app.tests.C)") == (None, "test_f")
  assert rows_lib.locate("test_issue_12") == (None, "test_issue_12")
  assert rows_lib.locate("A docstring, as Django prints it.") == (None, None)


def _broken_hunk(patch):
  """`patch` with a context line the base does not have."""
  changed = patch.replace("\n ", "\n #", 1)  # the first context line
  assert changed != patch
  return changed


BAD_FIELDS = {
    # field changes -> what the line says after "row 0 (instance acme__mathlib-7): "
    "problem statement null": ({"problem_statement": None},
                               "field problem_statement: must be a non-empty string, got null"),
    "patch a number": ({"patch": 3}, "field patch: must be a non-empty string, got a number"),
    "empty test patch": ({"test_patch": ""},
                         "field test_patch: must be a non-empty string, got an empty string"),
    "tests not JSON": ({"FAIL_TO_PASS": "[tests"}, "field FAIL_TO_PASS: not a JSON list of test"
                                                   " ids"),
    "tests of numbers": ({"PASS_TO_PASS": [1]}, "field PASS_TO_PASS: entry 0 must be a test id "
                                                "(a non-empty string), got a number"),
    "no failing test": ({"FAIL_TO_PASS": []}, "field FAIL_TO_PASS: names no test"),
    "version null": ({"version": None}, "field version: must be a string, got null"),
    "unknown eval type": ({"eval_type": "sometimes"}, "field eval_type: must be one of "
                                                      "['pass_and_fail', 'fail_only']"),
    "unknown log parser": ({"log_parser": "parse_log_nonesuch"},
                           "field log_parser: swebench has no parser 'parse_log_nonesuch'"),
    "gold patch does not apply": ("patch", "field patch: does not apply at the base commit "
                                           "(error: patch failed: mathlib/__init__.py:1)"),
    "test patch does not apply": ("test_patch", "field test_patch: does not apply at the base "
                                                "commit (error: patch failed: "),
    "unknown test function": ({"FAIL_TO_PASS": ["tests/test_double.py::test_three"]},
                              "field FAIL_TO_PASS: tests/test_double.py::test_three not found "
                              "in the repository after the test patch"),
    "unknown test file": ({"FAIL_TO_PASS": ["tests/test_none.py::test_two", "test_two",
                                            "test_four (tests.test_double.T)"]},
                          "field FAIL_TO_PASS: tests/test_none.py::test_two, test_four "
                          "(tests.test_double.T) not found"),
    "setup commit null": ({"environment_setup_commit": None},
                          "field environment_setup_commit: None is not a commit"),
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_bad_row_is_one_line_naming_row_and_field(clone, case):
  change, expected = BAD_FIELDS[case]
  row = dict(clone["row"])
  if isinstance(change, str):
    row[change] = _broken_hunk(row[change])
  else:
    row.update(change)
  with pytest.raises(base.TaskInputError) as raised:
    _load(clone, row)
  message = str(raised.value)
  assert message.startswith(f"{clone['tmp'] / 'rows.jsonl'}: row 0 (instance acme__mathlib-7): "
                            + expected), message
  assert "\n" not in message


def test_rows_are_named_by_index_and_the_good_ones_load(clone):
  good = clone["row"]
  # The id forms that are found: a parametrized pytest id, a bare name, a unittest id, and a
  # docstring line (not located, so not checked).
  tests = ["tests/test_double.py::test_two[3]", "test_two", "test_two (tests.test_double.T)",
           "Doubles two."]
  [task] = _load(clone, {**good, "FAIL_TO_PASS": tests})
  assert task.fail_to_pass == tests and task.instance["log_parser"] == "parse_log_pytest"
  with pytest.raises(base.TaskInputError, match=r"rows.jsonl: row 1 \(instance other-1\): "
                                                r"field problem_statement: must be a non-empty"):
    _load(clone, good, {**good, "instance_id": "other-1", "problem_statement": None})
  with pytest.raises(base.TaskInputError, match=r"rows.jsonl: row 1: must be a JSON object, got "
                                                r"a list$"):
    _load(clone, good, [good])
  with pytest.raises(base.TaskInputError, match=r"rows.jsonl: row 0: lacks fields repo, "):
    _load(clone, {"instance_id": 7})


def test_checks_write_nothing_and_run_once_per_content(clone, monkeypatch):
  objects = clone["repo"] / ".git" / "objects"
  before = sorted(str(p) for p in objects.rglob("*"))
  runs = []
  real = rows_lib._git_runner
  monkeypatch.setattr(rows_lib, "_git_runner", lambda *a: runs.append(a) or real(*a))
  good = clone["row"]
  _load(clone, good)
  assert len(runs) == 1
  _load(clone, good)  # the same content: not checked again
  assert len(runs) == 1
  other = {**good, "FAIL_TO_PASS": ["test_two"]}  # the same id, other content: checked
  _load(clone, other)
  assert len(runs) == 2
  assert sorted(str(p) for p in objects.rglob("*")) == before  # the clone's store untouched
  assert _git(clone["repo"], "status", "--porcelain") == ""


def test_library_loader_checks_rows_too(clone):
  path = clone["tmp"] / "rows.json"
  path.write_text(json.dumps([clone["row"], {**clone["row"], "test_patch": _broken_hunk(
      clone["row"]["test_patch"])}]))
  with pytest.raises(base.TaskInputError, match=r"rows.json: row 1 \(instance acme__mathlib-7\): "
                                                r"field test_patch: does not apply"):
    swe.load_swebench_instances(str(path), str(clone["tmp"] / "repos"))


def test_every_shipped_task_passes_the_row_checks(tmp_path):
  for name in swe.shipped_task_names():
    task = swe.load_shipped_task(name)
    ws = workspace_lib.Workspace(str(tmp_path / name))
    tree = tasks_lib.materialize(task, ws)
    rows_lib.check_row(task.instance, ws.gitdir, tree, f"shipped task {name}")
    ws.close()


def test_reference_fix_is_kept_per_patch_not_per_id(clone):
  """Two rows with one instance id and different fixes each get their own fixed files."""
  [first] = _load(clone, clone["row"])
  patch = clone["row"]["patch"].replace("return 2 * x", "return x * 2")
  [second] = _load(clone, {**clone["row"], "patch": patch})
  assert first.task_id == second.task_id and first.instance["patch"] != patch
  fixed = [dict(sandbox_lib._reference_files(t))["mathlib/__init__.py"] for t in (first, second)]
  assert fixed == [b"def double(x):\n    return 2 * x\n", b"def double(x):\n    return x * 2\n"]


@pytest.mark.slow
def test_run_exits_2_with_one_line_for_a_bad_row(clone):
  options = _options(clone, {**clone["row"], "problem_statement": None})
  workdir = clone["tmp"] / "workdir"
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "run.py"),
       f"--config={os.path.join(ROOT, 'experiments', 'configs', 'swe_qwen2_5.py')}",
       f"--workdir={workdir}", *(f"--config.env.options.{k}={v}" for k, v in options.items())],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert lines == [f"error: {options['instances']}: row 0 (instance acme__mathlib-7): field "
                   "problem_statement: must be a non-empty string, got null"], result.stderr
  assert not workdir.exists()


def test_a_linked_worktree_is_a_clone_too(clone):
  """repos_dir may hold a `git worktree` of the repository: its objects are the main one's."""
  worktree = clone["tmp"] / "worktrees" / "acme__mathlib"
  _git(clone["repo"], "worktree", "add", "-q", "--detach", str(worktree),
       clone["row"]["base_commit"])
  options = {**_options(clone, clone["row"]), "repos_dir": str(worktree.parent)}
  [task] = swe.make_tasks("train", 1, 0, **options)
  assert rows_lib.git_dir_of(task.git_source) == str(clone["repo"] / ".git")
