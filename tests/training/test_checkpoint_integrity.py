"""Checkpoints that do not restore: each corruption is named and the one before it is used.

Three checkpoints of a small state (random floats, which Orbax cannot compress: a flipped byte
lands in the raw values) are saved; the latest is then damaged one way at a time. The latest
that restores must be the one before it, with the values it was saved with, exactly; the
damaged step is named in the log line and, with `set_aside`, moved out of the checkpoint
directory. With every checkpoint damaged the error is one line naming each.
"""

import glob
import json
import logging as py_logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax.training import checkpoint as checkpoint_lib


def _state(step):
  rng = np.random.default_rng(step)
  return {"w": jnp.asarray(rng.normal(size=(64, 64)).astype(np.float32)),
          "b": jnp.asarray(rng.normal(size=(7,)).astype(np.float32))}


def _save(directory, steps=(0, 1, 2)):
  checkpointer = checkpoint_lib.Checkpointer(directory, keep=len(steps))
  for step in steps:
    checkpointer.save(step, _state(step), {"iteration": step})
  checkpointer.close()


def _largest_data_file(step_dir):
  files = [f for f in glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
           if os.path.isfile(f)]
  return max(files, key=os.path.getsize)


def _truncate(path):
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:len(data) // 2])


def _flip(path):
  with open(path, "rb") as f:
    data = bytearray(f.read())
  data[len(data) // 2] ^= 0xFF
  with open(path, "wb") as f:
    f.write(bytes(data))


def _damage(step_dir, how):
  if how == "truncated data file":
    _truncate(_largest_data_file(step_dir))
  elif how == "flipped bytes":
    _flip(_largest_data_file(step_dir))
  elif how == "truncated manifest":
    _truncate(os.path.join(step_dir, "state", "manifest.ocdbt"))
  elif how == "invalid loop metadata":
    with open(os.path.join(step_dir, "loop", "metadata"), "w", encoding="utf-8") as f:
      f.write('{"iteration": ')
  elif how == "emptied step directory":
    shutil.rmtree(step_dir)
    os.makedirs(step_dir)
  else:
    raise ValueError(how)


DAMAGES = ("truncated data file", "flipped bytes", "truncated manifest", "invalid loop metadata",
           "emptied step directory")


def _restore_latest(directory, **kwargs):
  checkpointer = checkpoint_lib.Checkpointer(directory)
  try:
    return checkpointer.restore_latest(jax.tree.map(jnp.zeros_like, _state(0)), **kwargs)
  finally:
    checkpointer.close()


@pytest.fixture(name="caplog_warnings")
def _caplog_warnings(caplog):
  caplog.set_level(py_logging.WARNING)
  return caplog


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path, how, caplog_warnings):
  directory = str(tmp_path / "checkpoints")
  _save(directory)
  _damage(os.path.join(directory, "2"), how)
  step, state, loop = _restore_latest(directory, set_aside=True)
  assert step == 1 and loop == {"iteration": 1}
  for name, value in _state(1).items():
    np.testing.assert_array_equal(np.asarray(state[name]), np.asarray(value))
  messages = [r.getMessage() for r in caplog_warnings.records]
  named = [m for m in messages if m.startswith(f"checkpoint 2 in {directory} does not restore")]
  assert len(named) == 1 and "\n" not in named[0], messages
  # Set aside, kept for inspection: the run goes on from checkpoint 1 and writes 2 again.
  assert sorted(os.listdir(directory)) == ["0", "1"]
  assert [n.split("-")[0] for n in os.listdir(tmp_path / "unrestorable_checkpoints")] == ["2"]
  _save(directory, steps=(2,))
  assert _restore_latest(directory)[0] == 2


def test_a_flipped_byte_is_caught_only_by_the_checksums(tmp_path):
  """The reason for checksums.json: without it Orbax reads the flipped value back silently."""
  directory = str(tmp_path / "checkpoints")
  _save(directory)
  _damage(os.path.join(directory, "2"), "flipped bytes")
  os.remove(os.path.join(directory, "2", checkpoint_lib.CHECKSUMS))
  step, state, _ = _restore_latest(directory)
  assert step == 2
  assert not np.array_equal(np.asarray(state["w"]), np.asarray(_state(2)["w"]))


def test_without_set_aside_nothing_moves(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save(directory)
  _damage(os.path.join(directory, "2"), "truncated data file")
  assert _restore_latest(directory)[0] == 1  # evaluation and export read, never move
  assert sorted(os.listdir(directory)) == ["0", "1", "2"]


def test_the_loop_state_check_rejects_a_checkpoint(tmp_path):
  def check(step, loop):
    if step == 2:
      raise ValueError("its RNG key does not match this configuration's seed")
  directory = str(tmp_path / "checkpoints")
  _save(directory)
  assert _restore_latest(directory, check=check)[0] == 1


@pytest.mark.parametrize("how", DAMAGES)
def test_no_checkpoint_left_is_one_line_naming_each(tmp_path, how):
  directory = str(tmp_path / "checkpoints")
  _save(directory, steps=(0, 1))
  for step in (0, 1):
    _damage(os.path.join(directory, str(step)), how)
  with pytest.raises(checkpoint_lib.UnrestorableCheckpointError) as error:
    _restore_latest(directory, set_aside=True)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"no checkpoint in {directory} restores: checkpoint 1: ")
  assert "; checkpoint 0: " in message
  assert sorted(os.listdir(directory)) == ["0", "1"]  # nothing to go on from: nothing moved


def test_restore_of_a_named_step_is_one_line(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save(directory)
  _damage(os.path.join(directory, "1"), "flipped bytes")
  checkpointer = checkpoint_lib.Checkpointer(directory)
  with pytest.raises(checkpoint_lib.UnrestorableCheckpointError,
                     match=r"^checkpoint 1 in .* does not restore: ValueError: its file "
                           r"state/.* is not the one saved \(SHA-256 differs\)$"):
    checkpointer.restore(1, _state(0))
  checkpointer.close()


def test_checksums_list_every_file_of_the_step(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save(directory, steps=(0,))
  step_dir = os.path.join(directory, "0")
  with open(os.path.join(step_dir, checkpoint_lib.CHECKSUMS), encoding="utf-8") as f:
    listed = json.load(f)
  files = {os.path.relpath(os.path.join(root, name), step_dir)
           for root, _, names in os.walk(step_dir) for name in names}
  assert set(listed) == files - {checkpoint_lib.CHECKSUMS}
  assert listed == checkpoint_lib.file_digests(step_dir)


def test_the_os_error_behind_a_failed_save():
  assert checkpoint_lib.os_error_code(OSError(28, "No space left on device")) == 28
  assert checkpoint_lib.os_error_code(ValueError(
      "RESOURCE_EXHAUSTED: Error writing \"w/0.0\" in OCDBT database: Failed to write 26140 "
      "bytes to file 8: No space left on device [os_error_code='28']")) == 28
  assert checkpoint_lib.os_error_code(ValueError("tree structures do not match")) is None


def test_a_save_that_runs_out_of_room_is_one_line_and_leaves_the_earlier_ones(tmp_path,
                                                                             monkeypatch):
  """The disk fills while Orbax writes (the room check before the save passed): one line, no
  temporary directory, the checkpoint before it restores."""
  from tests.training import test_workdir  # pylint: disable=g-import-not-at-top
  with test_workdir.small_filesystem(tmp_path / "fs", 1024) as fs:
    directory = os.path.join(fs, "checkpoints")
    _save(directory, steps=(0,))
    test_workdir.fill(fs, leave_bytes=8 << 10)
    checkpointer = checkpoint_lib.Checkpointer(directory, keep=3)
    monkeypatch.setattr(checkpointer, "_check_room", lambda step, state: None)
    with pytest.raises(OSError) as error:
      checkpointer.save(1, _state(1), {"iteration": 1})
    assert error.value.strerror == (f"cannot write checkpoint 1 to {directory}: No space left on "
                                    "device; the checkpoints before it are intact")
    assert os.listdir(directory) == ["0"]
    monkeypatch.undo()
    with pytest.raises(OSError, match=r"No space left on device \(0\.0 MiB free, the state takes "
                                      r"0\.0 MiB\)"):
      checkpointer.save(1, _state(1), {"iteration": 1})
    checkpointer.close()
    step, state, _ = _restore_latest(directory)
    assert step == 0
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(_state(0)["w"]))
