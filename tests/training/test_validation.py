"""config.validate before any compute: finite floats, gamma's range, sizes, the workdir.

Every float key of the schema (`config.float_keys()`, enumerated from `default_config()`) is
tried with NaN, +Inf and -Inf: each is refused in one line naming the key, and nothing else is
reported. The range of `rollout.gamma` is compared with what the estimators accept. The
workdir checks use a read-only tmpfs mount when the tests run as root (permission bits do not
stop root) and a directory without write permission otherwise.
"""

import contextlib
import os
import subprocess

import ml_collections
import pytest

from bpo_jax import estimators
from bpo_jax.training import bounds
from bpo_jax.training import config as config_lib


def _problems(config, mode="train", workdir=None) -> list[str]:
  try:
    config_lib.validate(config, mode, workdir)
  except config_lib.ConfigError as error:
    return error.problems
  return []


def _schema_floats(node, prefix=""):
  """The float leaves of a plain dict, found independently of `float_keys`."""
  for key, value in node.items():
    if isinstance(value, dict):
      if prefix + key != "env.options":
        yield from _schema_floats(value, f"{prefix}{key}.")
    elif isinstance(value, float):
      yield prefix + key


def test_float_keys_are_every_float_of_the_schema():
  keys = config_lib.float_keys()
  assert keys == list(_schema_floats(config_lib.to_plain(config_lib.default_config())))
  assert {"train.learning_rate", "rollout.gamma", "rollout.temperature", "eval.confidence",
          "env.timeout_s", "model.lora_alpha", "warm_start.target_temperature"} <= set(keys)
  assert len(keys) == len(set(keys)) == 22


def _set(config, path, value):
  node = config
  *parents, last = path.split(".")
  for part in parents:
    node = node[part]
  node[last] = value


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("key", config_lib.float_keys())
def test_every_float_key_refuses_nan_and_inf_in_one_line(key, value):
  config = config_lib.default_config()
  _set(config, key, value)
  problems = _problems(config)
  # One line, naming the key; no second complaint about its range.
  assert problems == [f"{key} = {value!r}: must be a finite number"]
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate(config)
  assert str(error.value) == f"invalid configuration: {key} = {value!r}: must be a finite number"
  assert "\n" not in str(error.value)


def test_nan_in_an_environment_option_is_refused():
  config = config_lib.default_config()
  config.env.name = "frozenlake"
  config.env.options = ml_collections.ConfigDict({"slip": float("nan")})
  assert _problems(config) == ["env.options.slip = nan: must be a finite number"]


def test_several_non_finite_keys_are_reported_together():
  config = config_lib.default_config()
  config.rollout.temperature = float("nan")
  config.train.learning_rate = float("inf")
  config.rollout.gamma = 0.0
  assert _problems(config) == [
      "rollout.temperature = nan: must be a finite number",
      "train.learning_rate = inf: must be a finite number",
      "rollout.gamma = 0.0: must be in (0, 1] (a step without siblings inherits its parent's "
      "baseline divided by gamma)"]


@pytest.mark.parametrize("gamma", [-0.5, 0.0, 1e-300, 1e-6, 0.5, 0.95, 1.0, 1.0 + 2**-52, 2.0])
def test_gamma_range_is_the_one_the_estimators_accept(gamma):
  config = config_lib.default_config()
  config.rollout.gamma = gamma
  refused = bool(_problems(config))
  try:
    estimators._check_gamma(gamma)  # pylint: disable=protected-access
    estimator_refuses = False
  except ValueError:
    estimator_refuses = True
  assert refused == estimator_refuses == (not 0.0 < gamma <= 1.0)


def test_a_timeout_beyond_what_python_waits_take():
  config = config_lib.default_config()
  config.env.timeout_s = 1e300
  (problem,) = _problems(config)
  assert problem.startswith("env.timeout_s = 1e+300: must be in (0, 9.22337e+09]")


def test_the_new_key_stops_after_three_skipped_updates_by_default():
  assert config_lib.default_config().train.max_skipped_updates == 3
  config = config_lib.default_config()
  config.train.max_skipped_updates = -1
  assert _problems(config) == ["train.max_skipped_updates = -1: must be >= 0 (0 = never stop)"]


# ----------------------------------------------------------------------------- sizes


def test_max_length_past_int32_and_past_memory():
  config = config_lib.default_config()
  config.model.max_length = 2**31
  assert _problems(config) == [
      "model.max_length = 2147483648: must be <= 2147483647 (positions and cache lengths are "
      "int32)"]
  config.model.max_length = 2**30
  (problem,) = _problems(config)
  # 64 rows (eval.num_tasks) x 2^30 slots x 1536 bytes = 96 TiB, beyond any host.
  assert problem.startswith("model.max_length = 1073741824: a KV cache of 64 rows x 1073741824 "
                            "slots x 1536 bytes (3 layers, 2 KV heads, head_dim 32, keys and "
                            "values, float32) takes 96.0 TiB, more than this host's ")
  memory = bounds.host_memory_bytes()
  assert problem.endswith(f"must be <= {memory // (64 * 1536)} here")


def test_a_billion_training_tasks():
  config = config_lib.default_config()
  config.env.num_train_tasks = 10**9
  memory = bounds.host_memory_bytes()
  problems = _problems(config)
  if (10**9 + 64) * bounds.TASK_BYTES_FLOOR <= memory:
    pytest.skip(f"this host holds {memory} bytes: a billion tasks are within its memory floor")
  assert problems == [
      f"env.num_train_tasks + env.num_eval_tasks = {10**9 + 64}: the run holds every task (at "
      f"least {bounds.TASK_BYTES_FLOOR} bytes each), "
      f"{bounds._size((10**9 + 64) * bounds.TASK_BYTES_FLOOR)}, more than this host's "  # pylint: disable=protected-access
      f"{bounds._size(memory)} of memory; must be <= {memory // bounds.TASK_BYTES_FLOOR} here"]  # pylint: disable=protected-access


def test_the_dry_run_leaves_out_this_hosts_memory():
  config = config_lib.default_config()
  config.model.max_length = 2**30
  config_lib.validate(config, host_memory=False)  # a pod's sizes are not this host's
  config.model.max_length = 2**31
  with pytest.raises(config_lib.ConfigError, match="int32"):
    config_lib.validate(config, host_memory=False)


# ----------------------------------------------------------------------------- the workdir


@contextlib.contextmanager
def read_only_directory(path, subdirs=()):
  """`path` as a directory nothing may be written in (holding `subdirs`): a read-only tmpfs
  when running as root, mode 0555 otherwise."""
  os.makedirs(path)
  if os.geteuid() != 0:
    for name in subdirs:
      os.makedirs(os.path.join(path, name))
    os.chmod(path, 0o555)
    try:
      yield str(path)
    finally:
      os.chmod(path, 0o755)
    return
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
                           capture_output=True, text=True, check=False)
  if mounted.returncode:
    pytest.skip(f"root cannot mount a tmpfs here ({mounted.stderr.strip()}), and permission "
                "bits do not stop root from writing")
  try:
    for name in subdirs:
      os.makedirs(os.path.join(path, name))
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
    yield str(path)
  finally:
    subprocess.run(["umount", str(path)], check=True)


def test_workdir_that_is_a_file_or_under_a_file(tmp_path):
  (tmp_path / "f").write_text("x")
  config = config_lib.default_config()
  assert _problems(config, "train", str(tmp_path / "f")) == [
      f"workdir = '{tmp_path / 'f'}': exists and is not a directory"]
  assert _problems(config, "train", str(tmp_path / "f" / "run")) == [
      f"workdir = '{tmp_path / 'f' / 'run'}': '{tmp_path / 'f'}', a path above it, is not a "
      "directory"]


def test_read_only_workdir_for_training_and_evaluation(tmp_path):
  config = config_lib.default_config()
  with read_only_directory(tmp_path / "ro", subdirs=["checkpoints"]) as workdir:
    (problem,) = _problems(config, "train", workdir)
    assert problem.startswith(f"workdir = '{workdir}': cannot write there: ")
    assert "Read-only file system" in problem or "Permission denied" in problem
    # An evaluation writes eval.json there: refused before it computes anything.
    assert _problems(config, "eval", workdir) == [problem]
    # Export only reads the workdir.
    assert _problems(config, "export", workdir) == []
    (nested,) = _problems(config, "train", os.path.join(workdir, "a", "b"))
    assert nested.startswith(f"workdir = '{workdir}/a/b': cannot write there (where it would "
                             f"be created, '{workdir}'): ")


def test_a_writable_workdir_is_left_as_it_was(tmp_path):
  config = config_lib.default_config()
  config_lib.validate(config, "train", str(tmp_path / "new" / "run"))
  assert os.listdir(tmp_path) == []  # not created, and the write probe removed
  (tmp_path / "old").mkdir()
  (tmp_path / "old" / "notes.txt").write_text("mine")
  config_lib.validate(config, "train", str(tmp_path / "old"))
  assert os.listdir(tmp_path / "old") == ["notes.txt"]
