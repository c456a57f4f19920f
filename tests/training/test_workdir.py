"""The workdir as its run's record (training/workdir.py): settings, lock, whole files.

* Files are written whole: on a full filesystem (a small tmpfs) a write fails with one line and
  the file keeps its old content; no temporary file is left.
* The lock: a second run on a locked workdir is refused with one line and exit status 2; a lock
  left by a killed holder is taken over (logged); one process cannot take its own lock twice.
* The record: a workdir with checkpoints and no config.json, or an unreadable one, is refused
  with one line; the keys a training command line set are taken from the record by later
  commands; flags that contradict it are refused naming the keys.
* The README's path: train from a tiny HF checkpoint with `--config.model.checkpoint=CK`,
  resume, export and evaluate without repeating the flag.
"""

import contextlib
import json
import logging as py_logging
import os
import re
import signal
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from bpo_jax.training import config as config_lib
from bpo_jax.training import metrics
from bpo_jax.training import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
QUICKSTART = os.path.join(ROOT, "experiments", "configs", "quickstart.py")


@contextlib.contextmanager
def small_filesystem(path, kilobytes):
  """A tmpfs of `kilobytes` mounted at `path` for the block (unmounted after); skips the test
  when this host cannot mount one (not root, or no tmpfs)."""
  os.makedirs(path, exist_ok=True)
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs",
                            str(path)], capture_output=True, text=True, check=False)
  if mounted.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}); the "
                "full-disk tests need one")
  try:
    yield str(path)
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory, leave_bytes=0):
  """Fills the filesystem of `directory` up to `leave_bytes` free; returns the filler's path."""
  path = os.path.join(directory, "filler")
  fd = os.open(path, os.O_WRONLY | os.O_CREAT)
  try:
    while True:
      free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
      if free <= leave_bytes:
        break
      os.write(fd, b"\0" * min(1 << 16, max(4096, free - leave_bytes)))
  except OSError:
    pass
  finally:
    os.close(fd)
  return path


def _run(*args, timeout=600):
  return subprocess.run([sys.executable, RUN, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)


def _one_line_refusal(result, expected, status=2):
  assert result.returncode == status, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and expected in errors[0], result.stderr[-3000:]
  return errors[0]


# ----------------------------------------------------------------------------- whole files


def test_write_json_replaces_whole_and_leaves_no_temporary(tmp_path):
  path = str(tmp_path / "summary.json")
  workdir_lib.write_json(path, {"a": 1})
  workdir_lib.write_json(path, {"a": 2, "b": [1, 2]})
  with open(path, encoding="utf-8") as f:
    assert json.load(f) == {"a": 2, "b": [1, 2]}
  assert os.listdir(tmp_path) == ["summary.json"]


def test_a_full_disk_keeps_the_old_file_and_says_so_in_one_line(tmp_path):
  with small_filesystem(tmp_path / "fs", 64) as fs:
    path = os.path.join(fs, "config.json")
    workdir_lib.write_json(path, {"old": True})
    fill(fs)
    with pytest.raises(workdir_lib.WriteError) as error:
      workdir_lib.write_json(path, {"new": "x" * 100_000})
    assert error.value.strerror == f"cannot write {path}: No space left on device"
    with open(path, encoding="utf-8") as f:
      assert json.load(f) == {"old": True}
    assert sorted(os.listdir(fs)) == ["config.json", "filler"]


def test_a_metrics_line_cut_short_is_not_read(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"iteration": 1}\n{"iteration": 2}\n{"iterat')
  assert metrics.read_jsonl(str(path)) == [{"iteration": 1}, {"iteration": 2}]
  path.write_text('{"iteration": 1}\n{"iteration": 2}')  # whole, without its newline
  assert metrics.read_jsonl(str(path)) == [{"iteration": 1}, {"iteration": 2}]


def test_the_metrics_file_is_rewritten_from_the_checkpoint_history(tmp_path):
  """A resumed run's file holds the checkpoint's records and none written after it."""
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"iteration": 1}\n{"iteration": 2}\n{"iteration": 3}\n{"iter')
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False, progress_bar=False,
                                 history=[{"iteration": 1}, {"iteration": 2}])
  writer.write({"iteration": 3, "phase": "train", "loss": 0.5})
  writer.close()
  assert metrics.read_jsonl(str(path)) == [{"iteration": 1}, {"iteration": 2},
                                           {"iteration": 3, "phase": "train", "loss": 0.5}]


# ----------------------------------------------------------------------------- the lock


def _holder(workdir):
  """A process holding `workdir`'s lock until killed."""
  process = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(f"""
          import time
          from bpo_jax.training import workdir
          assert workdir.try_lock({workdir!r}, "train") is None
          print("locked", flush=True)
          time.sleep(600)
          """)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  assert process.stdout.readline().strip() == "locked"
  return process


@pytest.mark.slow
def test_a_second_run_on_a_locked_workdir_is_refused_in_one_line(tmp_path):
  workdir = str(tmp_path / "w")
  os.makedirs(workdir)
  holder = _holder(workdir)
  try:
    result = _run(f"--config={QUICKSTART}:tiny", f"--workdir={workdir}")
    line = _one_line_refusal(result, f"workdir {workdir!r} is in use by another run (pid "
                                     f"{holder.pid} on host ")
    assert "(train, since " in line and line.endswith("wait until it ends or use another workdir")
    assert result.stderr.strip() == line  # refused before anything else logs (JAX is not loaded)
  finally:
    holder.kill()
    holder.wait()
  assert sorted(os.listdir(workdir)) == ["run.lock"]  # the refused run wrote nothing


@pytest.mark.slow
def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, caplog):
  caplog.set_level(py_logging.WARNING)
  workdir = str(tmp_path)
  holder = _holder(workdir)
  assert "is in use by another run" in workdir_lib.try_lock(workdir, "eval")
  os.kill(holder.pid, signal.SIGKILL)
  holder.wait()
  assert workdir_lib.try_lock(workdir, "eval") is None
  assert any(f"took over the lock of pid {holder.pid} on host " in r.getMessage()
             and "which ended without releasing it" in r.getMessage() for r in caplog.records)
  # One process cannot hold it twice (record locks never conflict within a process).
  assert f"pid {os.getpid()}, this process" in workdir_lib.try_lock(workdir, "train")
  workdir_lib.unlock(workdir)
  assert not os.path.exists(os.path.join(workdir, workdir_lib.LOCK))  # released: no holder left
  caplog.clear()
  assert workdir_lib.try_lock(workdir, "train") is None
  assert not caplog.records
  workdir_lib.unlock(workdir)


def test_lock_run_with_one_process_holds_and_releases(tmp_path):
  with workdir_lib.lock_run(str(tmp_path), "train"):
    assert "in use" in workdir_lib.try_lock(str(tmp_path), "eval")
    with pytest.raises(workdir_lib.WorkdirError, match="is in use by another run"):
      with workdir_lib.lock_run(str(tmp_path), "eval"):
        pass
  assert workdir_lib.try_lock(str(tmp_path), "eval") is None
  workdir_lib.unlock(str(tmp_path))


# ----------------------------------------------------------------------------- the record


def test_flag_keys():
  assert workdir_lib.flag_keys(
      ["run.py", "--config=x.py:tiny", "--config.model.checkpoint=/a=b", "--workdir=w",
       "--noconfig.log.tensorboard", "--config.train.iterations", "3"]) == [
           "model.checkpoint", "log.tensorboard", "train.iterations"]


def test_apply_record_takes_the_training_flags_unless_set_again(tmp_path):
  config = config_lib.default_config()
  record = json.loads(json.dumps(config.to_dict()))
  record["model"]["checkpoint"] = "/checkpoints/qwen"
  record["train"]["learning_rate"] = 0.5
  record["eval"]["num_tasks"] = 3
  record[workdir_lib.FLAG_KEYS] = ["model.checkpoint", "eval.num_tasks"]
  (tmp_path / "config.json").write_text(json.dumps(record))
  config.lock()
  applied = workdir_lib.apply_record(config, str(tmp_path), ["eval.num_tasks"])
  assert applied.model.checkpoint == "/checkpoints/qwen"
  assert applied.eval.num_tasks == 64  # set again on this command line: its value stands
  assert applied.train.learning_rate == 2e-4  # not a flag of the run: compared, not taken
  assert workdir_lib.apply_record(ml_collections.ConfigDict({"a": 1}), str(tmp_path / "none"),
                                  []).a == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_checkpoints_without_a_record_are_refused(tmp_path, mode):
  """Their settings are unknown: a BPO run's checkpoints would resume as whatever the command
  line says (an RLOO run with another learning rate)."""
  workdir = tmp_path / "w"
  os.makedirs(workdir / "checkpoints" / "1")
  _one_line_refusal(_run(f"--config={QUICKSTART}:tiny", f"--workdir={workdir}",
                         f"--mode={mode}", "--config.rollout.estimator=rloo"),
                    f"workdir {str(workdir)!r} has checkpoints but no config.json recording the "
                    "run's settings; restore that file or use a new workdir")


@pytest.mark.slow
def test_an_unreadable_record_is_refused(tmp_path):
  workdir = tmp_path / "w"
  os.makedirs(workdir)
  (workdir / "config.json").write_text("")
  _one_line_refusal(_run(f"--config={QUICKSTART}:tiny", f"--workdir={workdir}"),
                    f"{workdir / 'config.json'}: the run's record does not read (JSONDecodeError")


# ----------------------------------------------------------------------------- README's path


def _hf_config_file(tmp_path):
  path = tmp_path / "tiny_hf.py"
  path.write_text(textwrap.dedent("""
      from experiments.configs import base

      def get_config():
        config = base.tiny(base.rooms("bpo"), iterations=2)
        config.model.max_length = 640  # the family's chat template takes more tokens per path
        config.warm_start.num_trajectories = 0
        return config
      """))
  return str(path)


@pytest.mark.slow
def test_train_from_an_hf_checkpoint_then_resume_export_and_eval_without_the_flag(tmp_path):
  from tests.training import test_reference_lora_export as hf  # pylint: disable=g-import-not-at-top
  checkpoint = hf._hf_checkpoint(tmp_path / "hf")  # pylint: disable=protected-access
  config, workdir = _hf_config_file(tmp_path), str(tmp_path / "run")
  result = _run(f"--config={config}", f"--workdir={workdir}",
                f"--config.model.checkpoint={checkpoint}", "--stop_after=1")
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)[workdir_lib.FLAG_KEYS] == ["model.checkpoint"]
  # Resumed without the flag: the record's checkpoint, not a from-scratch model.
  result = _run(f"--config={config}", f"--workdir={workdir}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "after iteration 2" in result.stdout
  export_dir = str(tmp_path / "export")
  result = _run(f"--config={config}", f"--workdir={workdir}", "--mode=export",
                f"--export_dir={export_dir}")
  assert result.returncode == 0, result.stderr[-3000:]
  # The checkpoint's shape, eos ids and logits: the record's checkpoint was exported.
  recorded = hf._load_config(config)  # pylint: disable=protected-access
  recorded.model.checkpoint = checkpoint
  hf.check_export(recorded, workdir, checkpoint, export_dir)
  result = _run(f"--config={config}", f"--workdir={workdir}", "--mode=eval",
                "--config.eval.num_tasks=2")  # an evaluation setting may differ
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(workdir, "eval.json"), encoding="utf-8") as f:
    evaluated = json.load(f)
  assert evaluated["iteration"] == 2 and evaluated["num_tasks"] == 2
  # A flag that contradicts the record: one line naming the key, for eval as for a resume.
  for mode in ("eval", "train"):
    result = _run(f"--config={config}", f"--workdir={workdir}", f"--mode={mode}",
                  "--config.train.learning_rate=0.5")
    line = _one_line_refusal(result, "error: invalid configuration:")
    assert re.search(rf"train.learning_rate: the workdir {re.escape(repr(workdir))} holds a "
                     r"run with train.learning_rate = [0-9.e-]+, not 0.5 \(use a new workdir, or "
                     r"the same settings to resume\)$", line), result.stderr
