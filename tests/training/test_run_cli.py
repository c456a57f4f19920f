"""experiments/run.py: every bad input gives its one line, exit status 2, no traceback.

Each case runs the script in a subprocess. The configuration cases fail before any compute (no
JAX program is compiled), so they take about a second each; the checkpoint cases fail while the
model loads, and one tiny run checks that updates that stay non-finite stop the run.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.training.test_validation import read_only_directory

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


def test_a_configuration_error_is_reported_before_jax_loads(tmp_path):
  # The validation reads the configuration, the estimator table and the environment registry
  # only: a typo costs the interpreter's start, not JAX's import.
  code = textwrap.dedent(f"""
      import runpy, sys
      sys.argv = [{RUN!r}, "--config={QUICKSTART}", "--workdir={tmp_path / 'w'}",
                  "--config.rollout.estimator=ppo"]
      try:
        runpy.run_path({RUN!r}, run_name="__main__")
      except SystemExit as exit:
        loaded = [m for m in ("jax", "flax", "scipy", "transformers") if m in sys.modules]
        print(exit.code, loaded)
      """)
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
  assert result.stdout.split("\n")[0] == "2 []", result.stdout + result.stderr[-2000:]
  assert "rollout.estimator = 'ppo': must be one of 'bpo', 'rloo', 'grpo', 'gigpo'" in (
      result.stderr)


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_checkpoint_without_a_tokenizer(tmp_path):
  (tmp_path / "ckpt").mkdir()
  _assert_clean_failure(
      [f"--config={QUICKSTART}:tiny", f"--workdir={tmp_path / 'w'}",
       f"--config.model.checkpoint={tmp_path / 'ckpt'}"],
      f"error: {tmp_path / 'ckpt'}: no tokenizer files")
  assert not (tmp_path / "w").exists()  # nothing half-written


@pytest.mark.slow
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


@pytest.mark.slow
def test_workdir_of_another_experiment(tmp_path):
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "config.json").write_text('{"seed": 123}')
  # Validation passes; the loop refuses to resume a different experiment before computing.
  stderr = _assert_clean_failure([f"--config={QUICKSTART}", f"--workdir={workdir}"],
                                 "seed: the workdir")
  assert "holds a run with seed = 123, not 0" in stderr


@pytest.mark.slow
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


# ----------------------------------------------------------------------------- bad input table
#
# Each bad input: its one line on stderr, exit status 2, no traceback, and no workdir left
# behind. Every float key's NaN and Inf are validated in-process (tests/training/
# test_validation.py enumerates them from the schema); the command line is tried with a
# representative few, the sizes, the workdirs and the checkpoints.

_GAMMA_WHY = "(a step without siblings inherits its parent's baseline divided by gamma)"


def _task_count_over_the_bounds():
  """A billion training tasks, or more where this host's memory floor would hold a billion."""
  from bpo_jax.training import bounds  # pylint: disable=g-import-not-at-top
  return max(10**9, bounds.host_memory_bytes() // bounds.TASK_BYTES_FLOOR + 1)


_CONFIG_TABLE = [
    ("--config.rollout.temperature=nan",
     "rollout.temperature = nan: must be a finite number"),
    ("--config.rollout.gamma=nan", "rollout.gamma = nan: must be a finite number"),
    ("--config.rollout.gamma=0", f"rollout.gamma = 0.0: must be in (0, 1] {_GAMMA_WHY}"),
    ("--config.train.learning_rate=inf", "train.learning_rate = inf: must be a finite number"),
    ("--config.eval.confidence=-inf", "eval.confidence = -inf: must be a finite number"),
    ("--config.train.kl_coef=nan", "train.kl_coef = nan: must be a finite number"),
    ("--config.model.max_length=1073741824",
     "model.max_length = 1073741824: a KV cache of 64 rows x 1073741824 slots x 1536 bytes"),
    (f"--config.env.num_train_tasks={_task_count_over_the_bounds()}",
     "env.num_train_tasks"),
]


def _one_error_line(stderr: str) -> str:
  """The run's one error line; every other line of stderr is an absl log line."""
  lines = [line for line in stderr.splitlines() if line.strip()]
  errors = [line for line in lines if not re.match(r"[IWE]\d{4} ", line)]
  assert len(errors) == 1 and errors[0].startswith("error: "), stderr
  return errors[0]


@pytest.mark.parametrize("override,expected", _CONFIG_TABLE,
                         ids=[o.split("=")[0][len("--config."):] for o, _ in _CONFIG_TABLE])
def test_bad_values_table(tmp_path, override, expected):
  workdir = tmp_path / "w"
  code, stderr = _run(f"--config={QUICKSTART}", f"--workdir={workdir}", override)
  assert code == 2 and "Traceback" not in stderr, stderr
  # Validation fails before anything starts: stderr is that one line alone.
  assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr
  assert stderr.startswith(f"error: invalid configuration: {expected}"), stderr
  if "must be <=" in stderr or "num_train_tasks" in expected:
    assert "must be <=" in stderr  # the size's bound is named
  assert not workdir.exists()


def test_workdir_that_is_a_file(tmp_path):
  (tmp_path / "w").write_text("not a directory")
  code, stderr = _run(f"--config={QUICKSTART}", f"--workdir={tmp_path / 'w'}")
  assert code == 2 and "Traceback" not in stderr, stderr
  assert stderr == (f"error: invalid configuration: workdir = '{tmp_path / 'w'}': exists and is "
                    "not a directory\n")
  assert (tmp_path / "w").read_text() == "not a directory"


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_read_only_workdir(tmp_path, mode):
  # Training writes everything there, an evaluation its eval.json: both are refused before any
  # compute rather than losing their result at the end.
  with read_only_directory(tmp_path / "ro", subdirs=["checkpoints"]) as workdir:
    code, stderr = _run(f"--config={QUICKSTART}", f"--workdir={workdir}", f"--mode={mode}")
  assert code == 2 and "Traceback" not in stderr, stderr
  assert stderr.count("\n") == 1, stderr
  assert stderr.startswith(f"error: invalid configuration: workdir = '{workdir}': cannot write "
                           "there: "), stderr


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
  """A tiny Qwen2 checkpoint with its chat tokenizer (a run can start from it)."""
  from bpo_jax.testing import chat_tokenizers  # pylint: disable=g-import-not-at-top
  from bpo_jax.testing import hf_checkpoints  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp("hf"))
  with open(os.path.join(ROOT, "tests", "fixtures", "chat_templates", "qwen2_5.jinja"),
            encoding="utf-8") as f:
    template = f.read()
  tok = chat_tokenizers.family_tokenizer("qwen2", ["go north and open the door"] * 4, template,
                                         vocab_size=300)
  hf_checkpoints.make_hf_checkpoint("qwen2", path, vocab_size=max(len(tok), 320),
                                    max_position_embeddings=1024)
  chat_tokenizers.save_family_tokenizer(tok, "qwen2", path)
  return path


def _corrupt_random_bytes(path):
  with open(path, "wb") as f:
    f.write(np.random.default_rng(0).bytes(4096))
  return f"error: '{path}' is not a safetensors file: its header length "


def _corrupt_nan_weight(path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  tensors = load_file(path)
  name = "model.layers.1.mlp.down_proj.weight"
  tensors[name][3, 5] = np.nan
  save_file(tensors, path, metadata={"format": "pt"})
  return (f"error: tensor '{name}' in '{path}' has 1 NaN or Inf value(s) of "
          f"{tensors[name].size} as float32")


@pytest.mark.slow
@pytest.mark.parametrize("corrupt", [_corrupt_random_bytes, _corrupt_nan_weight],
                         ids=["random_bytes", "nan_weight"])
def test_checkpoint_that_cannot_start_a_run(tmp_path, hf_checkpoint, corrupt):
  checkpoint = tmp_path / "ckpt"
  shutil.copytree(hf_checkpoint, checkpoint)
  expected = corrupt(str(checkpoint / "model.safetensors"))
  workdir = tmp_path / "w"
  code, stderr = _run(f"--config={QUICKSTART}:tiny", f"--workdir={workdir}",
                      f"--config.model.checkpoint={checkpoint}", "--config.model.max_length=640")
  assert code == 2 and "Traceback" not in stderr, stderr
  assert _one_error_line(stderr).startswith(expected), stderr
  assert not workdir.exists()  # the run created it, and removed it when it could not start


@pytest.mark.slow
def test_a_run_whose_updates_stay_non_finite_stops(tmp_path):
  # A learning rate of 1e30 (finite, so valid) sends the weights past float32 in the first
  # update (Adam continues the warm start's moments): every later loss is NaN, its update
  # skipped, and the third in a row stops the run before its last iteration.
  workdir = tmp_path / "w"
  code, stderr = _run(f"--config={QUICKSTART}:tiny", f"--workdir={workdir}",
                      "--config.train.learning_rate=1e30", "--config.train.iterations=5",
                      "--config.warm_start.steps=1", "--config.checkpoint.every=100",
                      "--config.log.tensorboard=false")
  assert code == 1 and "Traceback" not in stderr, stderr
  line = _one_error_line(stderr)
  assert line.startswith("error: iterations 2-4: the loss or gradient was not finite in 3 "
                         "updates in a row, each skipped (last loss nan, grad_norm nan); the run "
                         "stops (train.max_skipped_updates = 3)"), stderr
  with open(workdir / "metrics.jsonl", encoding="utf-8") as f:
    train = [r for r in map(json.loads, f) if r.get("phase") == "train"]
  assert [(r["iteration"], r["skipped"]) for r in train] == [(1, 0.0), (2, 1.0), (3, 1.0),
                                                            (4, 1.0)]
  assert not (workdir / "summary.json").exists()  # no success line for a run that stopped
