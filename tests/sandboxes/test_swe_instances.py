"""Real-format SWE-bench instances selected by config: a tiny clone built here, its own Python
environment built once, graded by swebench's report, hidden tests unreadable before submit."""

import json
import os
import subprocess

import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import swe
from bpo_jax.sandboxes.swe import confinement
from bpo_jax.sandboxes.swe import instances as instances_lib
from bpo_jax.sandboxes.swe import workspace as workspace_lib

NAMESPACES = confinement.namespaces_available()
MODE = {} if NAMESPACES else {"confinement": "rlimits-only"}
TEST_CMD = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_double.py"
BUGGY = "def double(x):\n    return x + x + 1\n"
FIXED = "def double(x):\n    return 2 * x\n"
HIDDEN = "\n\ndef test_two():\n    from tinydep import FACTOR\n    assert double(2) == FACTOR * 2\n"
# The environment's one install step: a module only that environment has (the hidden test imports
# it, so a pass proves the tests ran with its interpreter), and a line per build.
INSTALL = ["python -c \"import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], "
           "'tinydep.py').write_text('FACTOR = 2\\n')\"", 'echo built >> "$VIRTUAL_ENV/builds.log"']


def _git(cwd, *args):
  return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, check=True,
                        capture_output=True, text=True,
                        env={**os.environ, **workspace_lib._COMMIT_ENV}).stdout.strip()


def _diff(clone, a, b, *paths):
  return subprocess.run(["git", "-c", "safe.directory=*", "diff", a, b, "--", *paths], cwd=clone,
                        check=True, capture_output=True, text=True).stdout


@pytest.fixture
def instance_files(tmp_path):
  """repos/acme__mathlib: a base commit (the bug) and a later one (fix + hidden test), the later
  one being the environment's setup commit, as in SWE-bench; an instance row in swebench 5's
  form (eval_script, log_parser) and a specs file with the install steps."""
  clone = tmp_path / "repos" / "acme__mathlib"
  (clone / "mathlib").mkdir(parents=True)
  (clone / "tests").mkdir()
  (clone / "mathlib" / "__init__.py").write_text(BUGGY)
  test = "from mathlib import double\n\n\ndef test_zero():\n    assert double(0) in (0, 1)\n"
  (clone / "tests" / "test_double.py").write_text(test)
  _git(clone, "init", "-q")
  _git(clone, "add", ".")
  _git(clone, "commit", "-qm", "base")
  base = _git(clone, "rev-parse", "HEAD")
  (clone / "mathlib" / "__init__.py").write_text(FIXED)
  (clone / "tests" / "test_double.py").write_text(test + HIDDEN)
  _git(clone, "commit", "-qam", "fix")
  fix = _git(clone, "rev-parse", "HEAD")
  script = "\n".join(["#!/bin/bash", "set -uxo pipefail", "cd /testbed",
                      ": '>>>>> Start Test Output'", TEST_CMD, ": '>>>>> End Test Output'"])
  row = {"repo": "acme/mathlib", "instance_id": "acme__mathlib-7", "base_commit": base,
         "patch": _diff(clone, base, fix, "mathlib"),
         "test_patch": _diff(clone, base, fix, "tests"),
         "problem_statement": "double(2) is 5", "hints_text": "", "version": "0.1",
         "FAIL_TO_PASS": json.dumps(["tests/test_double.py::test_two"]),
         "PASS_TO_PASS": json.dumps(["tests/test_double.py::test_zero"]),
         "environment_setup_commit": fix, "eval_script": script, "log_parser": "parse_log_pytest",
         "eval_type": "pass_and_fail"}
  (tmp_path / "verified.jsonl").write_text(json.dumps(row) + "\n")
  (tmp_path / "specs.json").write_text(json.dumps({"acme/mathlib": {"0.1": {"install": INSTALL}}}))
  options = {"instances": str(tmp_path / "verified.jsonl"), "repos_dir": str(tmp_path / "repos"),
             "envs_dir": str(tmp_path / "envs"), "specs": str(tmp_path / "specs.json")}
  return {"options": options, "row": row, "fix": fix, "tmp": tmp_path}


def test_selected_by_config_env_built_once_graded_by_swebench(instance_files):
  options = {**instance_files["options"], **MODE}
  [task] = swe.make_tasks("train", 1, 0, **options)
  assert task.task_id == "acme__mathlib-7" and task.instance["test_cmd"] == TEST_CMD
  assert task.instance["install"] == INSTALL
  builds = os.path.join(options["envs_dir"], "acme__mathlib-" + instance_files["fix"][:12],
                        "builds.log")
  first = swe.make_sandbox(max_steps=8, **options)
  first.reset(task)
  assert open(builds).read() == "built\n"
  # Commands use the environment's interpreter: the module only it has imports.
  assert "2" in first.step("run python -c 'import tinydep; print(tinydep.FACTOR)'").observation
  step = first.step("submit")  # the base commit as it is: test_two fails
  assert step.reward == 0.0 and step.info["success"] is False
  status = step.info["report"]["tests_status"]
  assert status["FAIL_TO_PASS"] == {"success": [], "failure": ["tests/test_double.py::test_two"]}
  assert status["PASS_TO_PASS"]["success"] == ["tests/test_double.py::test_zero"]
  first.close()
  second = swe.make_sandbox(max_steps=8, **options)
  second.reset(task)
  assert open(builds).read() == "built\n"  # reused, not rebuilt
  for action in second.expert_actions():
    step = second.step(action)
  assert step.done and step.reward == 1.0 and step.info["success"] is True
  assert step.info["report"]["tests_status"]["FAIL_TO_PASS"]["success"] == [
      "tests/test_double.py::test_two"]
  second.close()
  assert swe.evaluate_patch(task, task.instance["patch"], mode=MODE.get(
      "confinement", "namespaces"))["resolved"] is True
  assert swe.evaluate_patch(task, "", mode=MODE.get(
      "confinement", "namespaces"))["resolved"] is False
  assert open(builds).read() == "built\n"


@pytest.mark.skipif(not NAMESPACES, reason="without namespaces commands see the host's files")
def test_hidden_tests_unreadable_before_submit(instance_files):
  options = instance_files["options"]
  [task] = swe.make_tasks("test", 1, 0, **options)
  sandbox = swe.make_sandbox(max_steps=20, **options)
  sandbox.reset(task)
  fix = instance_files["fix"]
  env_dir = os.path.join(options["envs_dir"], "acme__mathlib-" + fix[:12])
  looks = [
      "run cat tests/test_double.py",
      f"run git cat-file -p {fix}",               # the clone's later commit: not in the store
      "run git log --all --format=%H",
      f"run cat {instance_files['tmp']}/repos/acme__mathlib/tests/test_double.py",
      f"run grep -rl test_two {env_dir} /tmp 2>&1; ls {env_dir}",
      "view tests/test_double.py",
  ]
  seen = [sandbox.step(action).observation for action in looks]
  assert all("test_two" not in text for text in seen), seen
  assert sandbox.step("search_dir test_two").observation.startswith('0 lines holding "test_two"')
  assert fix not in seen[2] and task.instance["base_commit"] in seen[2]
  assert "No such file" in seen[3]
  assert "test_two" not in open(os.path.join(sandbox.workdir, "tests", "test_double.py")).read()
  assert sandbox.step("submit").info["success"] is False
  # Grading applied the hidden test and took it away again.
  assert "test_two" not in open(os.path.join(sandbox.workdir, "tests", "test_double.py")).read()
  sandbox.close()


def test_bad_input_is_one_clear_error(instance_files):
  options, row, tmp = instance_files["options"], instance_files["row"], instance_files["tmp"]

  def fails(match, **changes):
    with pytest.raises(ValueError, match=match):
      swe.make_tasks("train", 1, 0, **{**options, **changes})

  def with_row(**fields):
    path = tmp / "bad.jsonl"
    path.write_text(json.dumps({k: v for k, v in {**row, **fields}.items() if v is not None}))
    return str(path)

  fails("env.options.instances = '.*nowhere.jsonl': no such file",
        instances=str(tmp / "nowhere.jsonl"))
  fails(r"bad.jsonl: row 0 \(instance acme__mathlib-7\): lacks field environment_setup_commit$",
        instances=with_row(environment_setup_commit=None))
  fails(r"row 0 \(instance acme__mathlib-7\): field repo: acme/other is not in "
        "env.options.repos_dir", instances=with_row(repo="acme/other"))
  fails("field base_commit: 0123456789abcdef0123 is not a commit of the clone",
        instances=with_row(base_commit="0123456789abcdef0123"))
  fails(r"row 0 \(instance acme__mathlib-7\): field log_parser: none for acme/mathlib version "
        r"0.1, no log_parser; give eval_script \(or test_cmd\) and log_parser",
        instances=with_row(log_parser=None))
  fails("env.options.envs_dir", envs_dir=None)
  with pytest.raises(ValueError, match="env.options.repos_dir is given without env.options.inst"):
    swe.make_tasks("train", 1, 0, repos_dir=options["repos_dir"])
  with pytest.raises(ValueError, match="does not bracket one test command"):
    instances_lib.eval_script_command("pytest")


def test_without_swebench_the_error_says_how_to_install_it(instance_files, monkeypatch):
  real = instances_lib.importlib.util.find_spec
  monkeypatch.setattr(instances_lib.importlib.util, "find_spec",
                      lambda name: None if name == "swebench" else real(name))
  with pytest.raises(base.TaskInputError, match=r"needs swebench .*pip install 'bpo_jax\[swe\]'"):
    swe.make_tasks("train", 1, 0, **instance_files["options"])


def test_unreadable_log_is_a_grading_error(instance_files):
  [task] = swe.make_tasks("train", 1, 0, **instance_files["options"])
  broken = swe.SweTask(task_id=task.task_id, git_source=task.git_source, envs_dir=task.envs_dir,
                       instance={**task.instance, "log_parser": "parse_log_nonesuch"})
  with pytest.raises(swe.GradingError, match="grader crashed"):
    swe.evaluate_patch(broken, "", mode=MODE.get("confinement", "namespaces"))


def test_swe_qwen2_5_config_validates_and_refuses_dummy_paths(tmp_path):
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from experiments.configs import swe_qwen2_5  # pylint: disable=g-import-not-at-top
  config = swe_qwen2_5.get_config()
  config_lib.validate(config)
  assert config.env.name == "swe" and config.model.lora_rank > 0
  options = config.env.options.to_dict()  # as a run passes them: plain values
  with pytest.raises(base.TaskInputError, match="env.options.instances is empty"):
    swe.make_tasks("train", 1, 0, **options)
  options.update(instances=str(tmp_path / "verified.jsonl"), repos_dir=str(tmp_path / "repos"),
                 envs_dir=str(tmp_path / "envs"))
  with pytest.raises(base.TaskInputError, match="env.options.repos_dir = .*repos': no such dir"):
    swe.make_tasks("train", 1, 0, **options)
  (tmp_path / "repos").mkdir()
  with pytest.raises(base.TaskInputError, match="verified.jsonl': no such file"):
    swe.make_tasks("train", 1, 0, **options)
  config.model.checkpoint = str(tmp_path / "qwen")
  with pytest.raises(config_lib.ConfigError, match="model.checkpoint = .*qwen': no such dir"):
    config_lib.validate(config)
  swe.make_sandbox(**{**options, **MODE}).close()  # the sandbox takes the same options


def test_two_workers_build_one_environment_once(instance_files, tmp_path):
  import threading  # pylint: disable=g-import-not-at-top
  [task] = swe.make_tasks("train", 1, 0, **instance_files["options"])
  slow = {**task.instance, "install": ["sleep 0.3", 'echo built >> "$VIRTUAL_ENV/builds.log"']}
  results = []
  workers = [threading.Thread(target=lambda: results.append(
      swe.ensure_env(str(tmp_path / "shared_envs"), slow, task.git_source))) for _ in range(2)]
  for w in workers:
    w.start()
  for w in workers:
    w.join()
  assert sorted(r.built_now for r in results) == [False, True]
  assert open(os.path.join(results[0].path, "builds.log")).read() == "built\n"
  with pytest.raises(ValueError, match="built with another install spec"):
    swe.ensure_env(str(tmp_path / "shared_envs"), {**slow, "install": []}, task.git_source)
  broken = {**task.instance, "install": ["exit 3"]}
  with pytest.raises(swe.EnvBuildError, match="install step 'exit 3' failed"):
    swe.ensure_env(str(tmp_path / "other_envs"), broken, task.git_source)
  assert os.listdir(tmp_path / "other_envs") == ["acme__mathlib-" + instance_files["fix"][:12]
                                                 + ".lock"]  # the half-built one removed
  # At reset or grading a failed build is infrastructure: a GradingError, never a reward.
  unbuildable = swe.SweTask(task_id=task.task_id, instance=broken, git_source=task.git_source,
                            envs_dir=str(tmp_path / "other_envs"))
  with pytest.raises(swe.GradingError, match="install step 'exit 3' failed"):
    swe.evaluate_patch(unbuildable, "", mode=MODE.get("confinement", "namespaces"))
