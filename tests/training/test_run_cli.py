"""experiments/run.py: every invalid configuration gives its message, exit status 2, no traceback.

Each case runs the script in a subprocess; all of them fail before any compute (no JAX program
is compiled), so they take about a second each.
"""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
QUICKSTART = os.path.join(ROOT, "experiments", "configs", "quickstart.py")


def _run(*args, cwd=ROOT):
  result = subprocess.run([sys.executable, RUN, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
  return result.returncode, result.stderr


def _assert_clean_failure(args, expected):
  code, stderr = _run(*args)
  assert code == 2, stderr
  assert "Traceback" not in stderr, stderr
  assert expected in stderr, stderr
  return stderr


def _write(path, text):
  path.write_text(textwrap.dedent(text))
  return str(path)


@pytest.mark.parametrize("override,expected", [
    # An unknown key names the key and the keys that exist there.
    ("--config.train.lr=0.1", "error: train.lr: unknown key; known keys under 'train': "),
    # A wrong type names the key and the type.
    ("--config.rollout.k=two", "error: rollout.k = 'two': must be of type int"),
])
def test_unknown_key_or_wrong_type_override(tmp_path, override, expected):
  _assert_clean_failure([f"--config={QUICKSTART}", f"--workdir={tmp_path / 'w'}", override],
                        expected)
  assert not (tmp_path / "w").exists()  # nothing was started


@pytest.mark.parametrize("overrides, expected_lines", [
    # Values outside the allowed ones.
    (["--config.rollout.k=1", "--config.rollout.estimator=ppo", "--config.env.name=nethack"],
     ["rollout.k = 1: must be >= 2 (a fork needs at least two siblings)",
      "rollout.estimator = 'ppo': must be one of 'bpo', 'rloo', 'grpo', 'gigpo'",
      "env.name = 'nethack': must be one of ["]),
    # GRPO's std conventions and GiGPO's discount.
    (["--config.rollout.group_std_ddof=2", "--config.rollout.gigpo_step_gamma=1.5"],
     ["rollout.group_std_ddof = 2: must be in [0, 1] (0 = population std, 1 = unbiased)",
      "rollout.gigpo_step_gamma = 1.5: must be in [0.0, 1.0]"]),
    # Budgets that cannot hold one tree.
    (["--config.rollout.max_leaves=1", "--config.rollout.max_env_steps=1"],
     ["rollout.max_leaves = 1: cannot hold one fork of rollout.k = 2 siblings",
      "rollout.max_env_steps = 1: cannot hold one step of each of rollout.k = 2 branches"]),
])
def test_invalid_values_and_budgets_are_all_reported_at_once(tmp_path, overrides,
                                                             expected_lines):
  # The validation reports every problem in one message, one line per key.
  stderr = _assert_clean_failure(
      [f"--config={QUICKSTART}", f"--workdir={tmp_path / 'w'}", *overrides],
      "error: invalid configuration:\n")
  for expected in expected_lines:
    assert expected in stderr
  assert not (tmp_path / "w").exists()


def test_budgets_the_chat_format_cannot_hold(tmp_path):
  # Path budgets are counted in the template's tokens, so they are checked once the tokenizer
  # is trained; no model is built, and the workdir the failed run created is gone.
  stderr = _assert_clean_failure(
      [f"--config={QUICKSTART}:tiny", f"--workdir={tmp_path / 'w'}",
       "--config.model.max_length=64", "--config.rollout.max_tree_tokens=100"],
      "error: invalid configuration:\n")
  assert "model.max_length = 64: cannot hold one path of env.max_turns = 4 steps (up to " in stderr
  assert "rollout.max_tree_tokens = 100: cannot hold one path of env.max_turns = 4" in stderr
  assert not (tmp_path / "w").exists()


def test_checkpoint_without_a_tokenizer(tmp_path):
  (tmp_path / "ckpt").mkdir()
  _assert_clean_failure(
      [f"--config={QUICKSTART}:tiny", f"--workdir={tmp_path / 'w'}",
       f"--config.model.checkpoint={tmp_path / 'ckpt'}"],
      f"error: {tmp_path / 'ckpt'}: no tokenizer files")
  assert not (tmp_path / "w").exists()  # nothing half-written


def test_failed_build_in_an_existing_workdir_keeps_its_files(tmp_path):
  # A workdir that was there before keeps what it held, and gets no config.json of the run
  # that could not be built.
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine")
  (tmp_path / "ckpt").mkdir()
  _assert_clean_failure(
      [f"--config={QUICKSTART}:tiny", f"--workdir={workdir}",
       f"--config.model.checkpoint={tmp_path / 'ckpt'}"],
      f"error: {tmp_path / 'ckpt'}: no tokenizer files")
  assert sorted(os.listdir(workdir)) == ["notes.txt"]


def test_eval_without_checkpoint_directory(tmp_path):
  workdir = tmp_path / "never_trained"
  _assert_clean_failure([f"--config={QUICKSTART}", f"--workdir={workdir}", "--mode=eval"],
                        f"workdir = '{workdir}': no checkpoint directory")


def test_missing_config_file_and_workdir(tmp_path):
  _assert_clean_failure([f"--config={tmp_path / 'absent.py'}", f"--workdir={tmp_path}"],
                        f"--config={tmp_path / 'absent.py'}: no such file")
  _assert_clean_failure([f"--config={QUICKSTART}"], "error: --workdir is required")
  _assert_clean_failure([f"--workdir={tmp_path}"], "error: --config is required")


def test_config_file_with_unknown_key_and_wrong_type(tmp_path):
  unknown = _write(tmp_path / "unknown.py", """
      from bpo_jax.training import config as config_lib
      def get_config():
        c = config_lib.default_config()
        c.rollout.unlock()
        c.rollout.num_forks = 3
        return c
      """)
  _assert_clean_failure([f"--config={unknown}", f"--workdir={tmp_path / 'w'}"],
                        "rollout.num_forks: unknown key; known keys under 'rollout': ")
  wrong_type = _write(tmp_path / "wrong_type.py", """
      import ml_collections
      from bpo_jax.training import config as config_lib
      def get_config():
        c = ml_collections.ConfigDict(config_lib.default_config().to_dict(), type_safe=False)
        c.train.iterations = "many"
        return c
      """)
  _assert_clean_failure([f"--config={wrong_type}", f"--workdir={tmp_path / 'w'}"],
                        "train.iterations = 'many': must be of type int, got str")
  broken = _write(tmp_path / "broken.py", """
      from bpo_jax.training import config as config_lib
      def get_config():
        c = config_lib.default_config()
        c.train.iterations = "many"   # a type-safe ConfigDict refuses this while loading
        return c
      """)
  _assert_clean_failure([f"--config={broken}", f"--workdir={tmp_path / 'w'}"],
                        f"--config={broken}: the file does not give a configuration")


def test_workdir_of_another_experiment(tmp_path):
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "config.json").write_text('{"seed": 123}')
  # Validation passes; the loop refuses to resume a different experiment before computing.
  stderr = _assert_clean_failure([f"--config={QUICKSTART}", f"--workdir={workdir}"],
                                 "seed: the workdir")
  assert "holds a run with seed = 123, not 0" in stderr


def test_environment_that_cannot_run_is_one_line_and_leaves_nothing(tmp_path):
  # Tests that cannot start (here forced; on a host, e.g. an interpreter the unprivileged uid
  # cannot reach) stop the run with the reason, exit status 1, no traceback and no workdir.
  workdir = tmp_path / "w"
  script = textwrap.dedent(f"""
      import runpy, sys
      from bpo_jax.sandboxes.swe import grading
      def cannot_start(*args, **kwargs):
        raise grading.GradingError("the tests could not start: python: Permission denied")
      grading.run_tests = cannot_start
      sys.argv = [{RUN!r}, "--config={os.path.join(ROOT, 'experiments', 'configs', 'swe.py')}:tiny",
                  "--workdir={workdir}", "--config.env.num_workers=0"]
      runpy.run_path({RUN!r}, run_name="__main__")
      """)
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 1, result.stderr
  assert "Traceback" not in result.stderr, result.stderr
  assert ("error: the swe environment cannot run here: the tests could not start: python: "
          "Permission denied") in result.stderr
  assert not workdir.exists()
