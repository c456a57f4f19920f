"""A workdir is one run's record: its settings, a lock, and small files written whole.

* **The record.** `<workdir>/config.json` holds the run's configuration (`config.to_plain`, the
  sandbox's protections) and, under `"command_line_keys"`, the keys its command lines set with
  `--config.KEY=V`. A later command on the workdir (a resume, `--mode=eval`, `--mode=export`)
  takes those keys' values from the record unless it sets them itself (`apply_record`), so
  `--config=FILE` with FILE the training's configuration file is enough: a run trained with
  `--config.model.checkpoint=CK` is evaluated and exported without repeating it. Any other
  difference between the command's configuration and the record (a flag, or an edited file) is
  refused by the loop, naming the keys, unless the mode may change that key
  (`loop.RESUMABLE_CHANGES`, `loop.EVAL_CHANGES`). A workdir with checkpoints and no record is
  refused (`require_record`): its checkpoints' settings are unknown.
* **The lock.** One run at a time per workdir (`lock_run`). It is a POSIX record lock
  (`fcntl.lockf`) on `<workdir>/run.lock`, held by process 0 of a run for the run's duration:
  the kernel releases it when the process ends however it ends (kill -9 included), so a lock
  left by a killed run is never stale and is taken over at once; it is not inherited by the
  sandbox workers the run forks, which may outlive it for a moment; it works on NFS (lockd),
  unlike `flock` on older kernels. Within one process such locks never conflict, so the process
  also keeps the set of workdirs it holds. The file holds the holder's pid, host and mode: a
  refused run names them. A run removes the file as it releases the lock, so a file still
  naming a holder was left by a run that did not end normally, which is logged when its lock is
  taken over. The other processes of a multi-process run share the workdir under process 0's
  lock: they learn its outcome from process 0 and never lock themselves, so they cannot refuse
  each other. On a filesystem without locks the run goes on unguarded, with a warning.
* **Whole files.** `write_text` / `write_json` write a temporary file in the same directory,
  fsync it, and rename it over the target (`os.replace`, atomic on POSIX), then fsync the
  directory: a reader sees the old file or the new one, never a part, whatever kills the
  writer or fills the disk. A write that fails raises `WriteError`, one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import tempfile
import time
from typing import Any, Iterator, Sequence

from absl import logging

CONFIG = "config.json"
LOCK = "run.lock"
FLAG_KEYS = "command_line_keys"


class WorkdirError(ValueError):
  """A workdir a command cannot use (in use, no record of its checkpoints' run): one line."""


class WriteError(OSError):
  """A file of the run could not be written (a full disk, a read-only filesystem): one line."""


# ----------------------------------------------------------------------------- whole files


def write_text(path: str, text: str) -> None:
  """Writes `text` to `path` whole or not at all (module docstring)."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
  except OSError as error:
    with contextlib.suppress(OSError):
      os.unlink(temporary)
    raise WriteError(error.errno, f"cannot write {path}: {error.strerror or error}") from None
  _fsync_directory(directory)


def write_json(path: str, obj: Any) -> None:
  write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _fsync_directory(directory: str) -> None:
  """Makes a rename in `directory` durable (a no-op where directories cannot be opened)."""
  with contextlib.suppress(OSError):
    fd = os.open(directory, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)


# ----------------------------------------------------------------------------- the record


def read_record(workdir: str) -> dict | None:
  """The run's record (config.json), None when the workdir has none."""
  path = os.path.join(workdir, CONFIG)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError) as error:
    raise WorkdirError(f"{path}: the run's record does not read ({type(error).__name__}: "
                       f"{' '.join(str(error).split())}); restore it or use a new workdir") from None
  if not isinstance(record, dict):
    raise WorkdirError(f"{path}: the run's record is not a JSON object; restore it or use a new "
                       "workdir")
  return record


def config_record(settings) -> dict:
  """What config.json records of a run's `Settings`: its values as the JSON file holds them
  (tuples as lists) and the sandbox's protections, where the environment has any."""
  from bpo_jax.sandboxes import registry  # pylint: disable=g-import-not-at-top
  record = json.loads(json.dumps(settings.to_plain()))
  env = registry.get_environment(settings.env.name)
  if hasattr(env, "protections_record"):  # what the sandbox's commands are confined by
    record["env_protections"] = env.protections_record(**dict(settings.env.options))
  return record


def has_checkpoints(workdir: str) -> bool:
  directory = os.path.join(workdir, "checkpoints")
  return os.path.isdir(directory) and bool(os.listdir(directory))


def require_record(workdir: str) -> dict | None:
  """The record; refuses a workdir whose checkpoints have none (their run's settings unknown)."""
  record = read_record(workdir)
  if record is None and has_checkpoints(workdir):
    raise WorkdirError(f"workdir {workdir!r} has checkpoints but no {CONFIG} recording the run's "
                       "settings; restore that file or use a new workdir")
  return record


def flag_keys(argv: Sequence[str]) -> list[str]:
  """The configuration keys a command line sets: `--config.a.b=v`, `--config.a.b v`,
  `--noconfig.a.b` (a false bool) all give "a.b"."""
  keys = []
  for arg in argv:
    for prefix in ("--config.", "--noconfig."):
      if arg.startswith(prefix):
        keys.append(arg[len(prefix):].split("=", 1)[0])
  return keys


def flatten(d: dict, prefix: str = "") -> dict:
  """{dotted key: value} of nested dicts."""
  out = {}
  for k, v in d.items():
    out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def apply_record(config, workdir: str, keys_set: Sequence[str]):
  """`config` with the values the record holds for the keys its run's command lines set
  (`FLAG_KEYS`), except those `keys_set` sets again; unchanged without a record. Example: a run
  trained with `--config.model.checkpoint=CK`, evaluated with `--config=FILE --mode=eval`,
  evaluates with `model.checkpoint = CK`."""
  record = read_record(workdir)
  if record is None:
    return config
  values = flatten({k: v for k, v in record.items() if k != FLAG_KEYS})
  for key in record.get(FLAG_KEYS, ()):
    if key in keys_set or key not in values:
      continue
    _set(config, key, values[key])
  return config


def _set(config, key: str, value) -> None:
  *parents, leaf = key.split(".")
  with config.unlocked() if hasattr(config, "unlocked") else contextlib.nullcontext():
    node = config
    for part in parents:
      node = node[part]
    if isinstance(node.get(leaf), tuple) and isinstance(value, list):
      value = tuple(value)
    try:
      node[leaf] = value
    except TypeError:  # a value of another type than the file's (e.g. a path for None)
      del node[leaf]
      node[leaf] = value


def record_keys(record: dict | None, keys_set: Sequence[str]) -> list[str]:
  """The keys a run's command lines have set so far: the record's and this command's."""
  return sorted(set((record or {}).get(FLAG_KEYS, ())) | set(keys_set))


# ----------------------------------------------------------------------------- the lock

_HELD: dict[str, int] = {}  # realpath of a workdir -> the lock file's descriptor


def _holder(fd: int) -> str:
  """The lock file's holder as words, "" when it holds none."""
  try:
    os.lseek(fd, 0, os.SEEK_SET)
    holder = json.loads(os.read(fd, 4096).decode("utf-8") or "null")
  except (OSError, ValueError):
    return ""
  if not isinstance(holder, dict):
    return ""
  return (f"pid {holder.get('pid')} on host {holder.get('host')} ({holder.get('mode')}, since "
          f"{holder.get('since')})")


def _in_use(workdir: str, holder: str) -> str:
  return (f"workdir {workdir!r} is in use by another run "
          f"({holder or 'its holder has not written its name yet'}); wait until it ends or use "
          "another workdir")


def in_use(workdir: str) -> str | None:
  """Why `workdir` cannot take a run now (one line), or None: another process holds its lock.
  A check that takes nothing, for the command line before it loads JAX; the run itself then
  takes the lock (`lock_run`), which decides."""
  try:
    fd = os.open(os.path.join(workdir, LOCK), os.O_RDWR)
  except OSError:  # no lock file (no run holds it), or one this user cannot take: lock_run says
    return None
  try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as error:
    if error.errno in (errno.EACCES, errno.EAGAIN):
      return _in_use(workdir, _holder(fd))
    return None
  finally:
    os.close(fd)  # releases the test lock, if it was taken
  return None


def try_lock(workdir: str, mode: str) -> str | None:
  """Takes `workdir`'s lock for this process; returns None, or why it cannot (one line)."""
  key = os.path.realpath(workdir)
  if key in _HELD:
    return _in_use(workdir, f"pid {os.getpid()}, this process")
  path = os.path.join(workdir, LOCK)
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as error:
    raise WriteError(error.errno, f"cannot write {path}: {error.strerror or error}") from None
  try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as error:
    holder = _holder(fd)
    os.close(fd)
    if error.errno in (errno.EACCES, errno.EAGAIN):
      return _in_use(workdir, holder)
    logging.warning("workdir %s: its filesystem takes no locks (%s); runs on it are not guarded "
                    "from each other", workdir, error.strerror)
    return None
  if not _same_file(fd, path):  # its holder removed it while releasing: lock the next one
    os.close(fd)
    return try_lock(workdir, mode)
  left = _holder(fd)
  if left:
    logging.warning("workdir %s: took over the lock of %s, which ended without releasing it",
                    workdir, left)
  record = {"pid": os.getpid(), "host": socket.gethostname(), "mode": mode,
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}
  with contextlib.suppress(OSError):  # the name is for messages; the lock holds without it
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
    os.fsync(fd)
  _HELD[key] = fd
  return None


def _same_file(fd: int, path: str) -> bool:
  try:
    a, b = os.fstat(fd), os.stat(path)
  except OSError:
    return False
  return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def unlock(workdir: str) -> None:
  """Releases this process's lock of `workdir` and removes the file, so that a lock file found
  with a holder's name in it was left by a run that did not end normally. The file goes before
  the lock: a run that opened it meanwhile finds it removed once it has the lock, and retries."""
  fd = _HELD.pop(os.path.realpath(workdir), None)
  if fd is None:
    return
  with contextlib.suppress(OSError):
    os.unlink(os.path.join(workdir, LOCK))
  os.close(fd)  # closing the descriptor releases the record lock


@contextlib.contextmanager
def lock_run(workdir: str, mode: str) -> Iterator[None]:
  """Holds `workdir`'s lock for a run of all its processes (module docstring): process 0 takes
  it, and every process raises the same `WorkdirError` when it cannot."""
  from bpo_jax.training import distributed  # pylint: disable=g-import-not-at-top
  primary = distributed.is_primary()
  refused = try_lock(workdir, mode) if primary else None
  refused = distributed.allgather_objects(refused)[0]
  if refused:
    raise WorkdirError(refused)
  try:
    yield
  finally:
    if primary:
      unlock(workdir)
