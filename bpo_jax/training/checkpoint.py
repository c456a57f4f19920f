"""Checkpoints for exact resume: the train state's arrays plus the loop's own state, via Orbax.

A checkpoint at iteration i holds everything the loop needs to continue as if it had never
stopped:

* `state`: a pytree of arrays (parameters, optimiser state), saved with
  `ocp.args.StandardSave` and restored into an abstract tree of the same structure, so the
  restored leaves have the shapes, dtypes and shardings the caller asks for;
* `loop`: a JSON object (`ocp.args.JsonSave`) with the iteration, the raw bits of the RNG key,
  the position in the training task order, and the metrics history (which the loop rewrites to
  its JSONL file on resume, so the file equals that of an uninterrupted run).

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoint as the latest one. A save that fails (a
full disk) removes its temporary directory and raises `workdir.WriteError`, one line; the
earlier checkpoints are untouched.

Integrity. Orbax reads a flipped byte in a data file back as a wrong value, silently (its chunks
carry no checksum), so once a save is complete process 0 writes `<step>/checksums.json`: the
SHA-256 of every file of the step (one read of the checkpoint, from the page cache). A
checkpoint restores only if every listed file has its digest and Orbax reads it, and the caller's
check of its loop state passes; a step without checksums.json (its writer killed between the
two, or written by a library without them) is restored unverified, with a warning.
`restore_latest` takes the latest checkpoint that restores: each one after it is named in one
logged line with its reason and, when training goes on from the earlier one, moved to
`<workdir>/unrestorable_checkpoints/` (kept for inspection; the run writes those steps again).
When none restores it raises `UnrestorableCheckpointError`, one line naming each.

Example:

  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=2)
  checkpointer.save(5, {"params": params, "opt_state": opt_state}, {"iteration": 5, ...})
  step = checkpointer.latest_step()                    # 5
  state, loop = checkpointer.restore(step, abstract_state)
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging as py_logging
import os
import re
import shutil
import sys
import time
from typing import Any, Callable

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

from bpo_jax.training import distributed
from bpo_jax.training import workdir as workdir_lib

CHECKSUMS = "checksums.json"


class UnrestorableCheckpointError(ValueError):
  """No checkpoint of a run restores (each corrupt or incomplete): one line naming each."""


def key_to_json(key: jax.Array) -> list[int]:
  """The raw uint32 words of a PRNG key (typed or raw), exactly, as a JSON-able list."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return [int(x) for x in np.asarray(key, np.uint32).reshape(-1)]


def key_from_json(words: list[int]) -> jax.Array:
  """The raw (uint32[2]) PRNG key of `key_to_json`'s words."""
  return jax.numpy.asarray(np.asarray(words, np.uint32))


class Checkpointer:
  """Saves and restores `(state pytree, loop dict)` pairs by iteration number."""

  def __init__(self, directory: str, keep: int = 2, create: bool = True):
    self.directory = os.path.abspath(directory)
    if not create and not os.path.isdir(self.directory):
      raise FileNotFoundError(f"no checkpoint directory at {self.directory!r}")
    # Synchronous saves: the loop goes on only once a checkpoint is complete. A save cut short
    # (the process killed) leaves a temporary directory, which is removed on the next start.
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                           enable_async_checkpointing=False,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, loop: dict) -> None:
    """Writes checkpoint `step`, waits until it is complete on disk and seals it with its
    checksums; a write that fails raises `workdir.WriteError` (module docstring)."""
    self._check_room(step, state)
    try:
      self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      loop=ocp.args.JsonSave(loop)))
      self.manager.wait_until_finished()
    except Exception as error:  # pylint: disable=broad-except
      code = os_error_code(error)
      if code is None:
        raise
      _quiet_sibling_writes()
      if distributed.is_primary():
        for name in os.listdir(self.directory):
          if name.startswith(f"{step}.") and "tmp" in name:
            shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
      raise self._write_error(step, code) from None
    if distributed.is_primary():
      step_dir = os.path.join(self.directory, str(step))
      workdir_lib.write_json(os.path.join(step_dir, CHECKSUMS), file_digests(step_dir))
    distributed.barrier(f"checkpoint {step} sealed")

  def _write_error(self, step: int, code: int, detail: str = "") -> workdir_lib.WriteError:
    return workdir_lib.WriteError(
        code, f"cannot write checkpoint {step} to {self.directory}: {os.strerror(code)}{detail}; "
        "the checkpoints before it are intact")

  def _check_room(self, step: int, state: Any) -> None:
    """Refuses a save that cannot fit before writing anything: the free space of the checkpoint
    directory's filesystem against the state's bytes, uncompressed (random weights and their
    Adam moments hardly compress). Process 0 decides for all. A save that starts and then runs
    out (the disk filled meanwhile) fails in `save`."""
    needed = sum(_nbytes(x) for x in jax.tree.leaves(state))
    free = None
    if distributed.is_primary():
      stats = os.statvfs(self.directory)
      free = stats.f_bavail * stats.f_frsize
    free = distributed.allgather_objects(free)[0]
    if free < needed:
      raise self._write_error(step, errno.ENOSPC, f" ({free / 2**20:.1f} MiB free, the state "
                              f"takes {needed / 2**20:.1f} MiB)")

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """The checkpoint `step` restored into `abstract_state`'s structure (ShapeDtypeStructs or
    arrays); returns `(state, loop)`. Raises `UnrestorableCheckpointError` when its files are
    not those it was saved with or Orbax cannot read them."""
    if step not in self.manager.all_steps():
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory!r}; "
                              f"have {self.all_steps()}")
    outcome = self._try_restore(step, abstract_state)
    if isinstance(outcome, str):
      raise UnrestorableCheckpointError(f"checkpoint {step} in {self.directory} does not "
                                        f"restore: {outcome}")
    return outcome

  def _try_restore(self, step: int, abstract_state: Any,
                   check: Callable[[int, dict], None] | None = None):
    """`(state, loop)`, or why checkpoint `step` does not restore (one line). The processes
    agree: a step any of them cannot read is unrestorable for all."""
    try:
      verify(os.path.join(self.directory, str(step)))
      abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
      restored = self.manager.restore(
          step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                        loop=ocp.args.JsonRestore()))
      outcome = restored.state, dict(restored.loop)
      if check is not None:
        check(step, outcome[1])
      why = None
    except Exception as error:  # pylint: disable=broad-except
      outcome = why = f"{type(error).__name__}: {' '.join(str(error).split())}"[:300]
    problems = [w for w in distributed.allgather_objects(why) if w]
    return problems[0] if problems else outcome

  def restore_latest(self, abstract_state: Any, check: Callable[[int, dict], None] | None = None,
                     set_aside: bool = False) -> tuple[int, Any, dict] | None:
    """`(step, state, loop)` of the latest checkpoint that restores (its loop state passing
    `check(step, loop)`, which raises ValueError), None when there is no checkpoint. Each later
    one is logged with its reason and, with `set_aside`, moved out of the checkpoint directory
    (module docstring). Raises `UnrestorableCheckpointError` when none restores."""
    rejected = []
    for step in sorted(self.all_steps(), reverse=True):
      outcome = self._try_restore(step, abstract_state, check)
      if not isinstance(outcome, str):
        if rejected and set_aside:
          self._set_aside([s for s, _ in rejected])
        return (step, *outcome)
      logging.warning("checkpoint %d in %s does not restore (%s); trying the one before it",
                      step, self.directory, outcome)
      rejected.append((step, outcome))
    if rejected:
      raise UnrestorableCheckpointError(
          f"no checkpoint in {self.directory} restores: " +
          "; ".join(f"checkpoint {s}: {why}" for s, why in rejected))
    return None

  def _set_aside(self, steps: list[int]) -> None:
    """Moves `steps` to unrestorable_checkpoints/ beside the checkpoint directory."""
    if distributed.is_primary():
      aside = os.path.join(os.path.dirname(self.directory), "unrestorable_checkpoints")
      os.makedirs(aside, exist_ok=True)
      for step in steps:
        target = os.path.join(aside, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(os.path.join(self.directory, str(step)), target)
        logging.warning("moved the unrestorable checkpoint %d to %s", step, target)
    distributed.barrier("unrestorable checkpoints set aside")
    self.manager.reload()

  def close(self) -> None:
    self.manager.close()


def _nbytes(leaf) -> int:
  """The bytes of an array leaf (a PRNG key's by its raw words), 0 for anything else."""
  if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  try:
    return int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
  except (AttributeError, TypeError):
    return 0


class _SiblingWriteFailures(py_logging.Filter):
  """Drops asyncio's report of the other writes of a failed save (each its own task, failed by
  the same OS error, "Task exception was never retrieved" with a traceback): the save's one
  line says it all."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not (error is not None and "never retrieved" in record.getMessage()
                and os_error_code(error) is not None)


def _quiet_sibling_writes() -> None:
  """After a failed save: its other writes' reports are dropped, and so are the callbacks of
  TensorStore writes that complete once Orbax has closed their event loop (each printed as a
  "RuntimeError: Event loop is closed" traceback through `sys.excepthook`)."""
  logger = py_logging.getLogger("asyncio")
  if not any(isinstance(f, _SiblingWriteFailures) for f in logger.filters):
    logger.addFilter(_SiblingWriteFailures())
  hook = sys.excepthook
  if getattr(hook, "quiet_closed_loops", False):
    return

  def quiet(kind, value, traceback):
    if not (kind is RuntimeError and str(value) == "Event loop is closed"):
      hook(kind, value, traceback)
  quiet.quiet_closed_loops = True
  sys.excepthook = quiet


def os_error_code(error: BaseException) -> int | None:
  """The OS error number behind a failed save, None when it is not an OS error: an OSError's
  own, or the `os_error_code='N'` TensorStore puts in its message (a ValueError)."""
  if isinstance(error, OSError) and error.errno:
    return error.errno
  found = re.search(r"os_error_code='(\d+)'", str(error))
  return int(found.group(1)) if found else None


def file_digests(directory: str) -> dict[str, str]:
  """{path relative to `directory`: SHA-256 hex digest} of every file under it but the
  checksums file itself."""
  digests = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      relative = os.path.relpath(path, directory)
      if relative == CHECKSUMS:
        continue
      digest = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          digest.update(block)
      digests[relative] = digest.hexdigest()
  return dict(sorted(digests.items()))


def verify(step_dir: str) -> None:
  """Raises ValueError naming the first file of a sealed checkpoint step that is missing or
  whose digest differs; a step without checksums passes, with a warning (module docstring)."""
  path = os.path.join(step_dir, CHECKSUMS)
  if not os.path.exists(path):
    if os.path.isdir(step_dir) and os.listdir(step_dir):
      logging.warning("checkpoint %s has no %s: restored unverified", step_dir, CHECKSUMS)
    return
  with open(path, encoding="utf-8") as f:
    expected = json.load(f)
  if not isinstance(expected, dict) or not expected:
    raise ValueError(f"{CHECKSUMS} lists no files")
  actual = file_digests(step_dir)
  for name, digest in expected.items():
    if name not in actual:
      raise ValueError(f"its file {name} is missing")
    if actual[name] != digest:
      raise ValueError(f"its file {name} is not the one saved (SHA-256 differs)")
