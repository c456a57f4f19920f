"""Control groups per command: one total memory bound and one process bound for all of a
command's processes, and a kill of whatever is left in them when the command returns.

Where this process may create control groups below its own (root, or a hierarchy delegated to
its user: the group directory writable by it), each command gets fresh groups, one per
controller, named `bpo-<PID namespace>-<host pid>-<n>`:

  memory  cgroup v1: memory.limit_in_bytes = memory.memsw.limit_in_bytes = M (swap does not
          extend it); v2: memory.max = M, memory.swap.max = 0. M = `Limits.memory_bytes`; past
          it the kernel's OOM killer ends one of the command's processes.
  pids    pids.max = `Limits.max_processes` (the launcher that waits for the command included).

The launcher (`_jail.py`) writes its pid into each group's cgroup.procs before it starts the
command, so every descendant is in them; an unprivileged command cannot move itself out (it has
no write access to the groups above, and in namespaces it does not see /sys at all). When the
command returns, `CommandGroups.end` kills every process still in them (cgroup.kill on v2, else
SIGKILL to each listed process until the list is empty) and removes them.

Where no hierarchy with the controller is writable, `available()` leaves it out and callers say
so (the memory bound is then per process: RLIMIT_AS).
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time

CONTROLLERS = ("memory", "pids")
_PREFIX = "bpo-"
_COUNTER = itertools.count()


def _mounts() -> list[tuple[str, str, str, list[str]]]:
  """(mount point, root inside the hierarchy, fstype, super options) of cgroup mounts."""
  found = []
  with open("/proc/self/mountinfo", encoding="utf-8") as f:
    for line in f:
      left, _, right = line.partition(" - ")
      fields, tail = left.split(), right.split()
      if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
        found.append((fields[4].encode().decode("unicode_escape"), fields[3], tail[0],
                      tail[2].split(",")))
  return found


def _own_groups() -> dict[str, str]:
  """{controller or "" for the v2 hierarchy: this process's group path} (/proc/self/cgroup)."""
  groups = {}
  with open("/proc/self/cgroup", encoding="utf-8") as f:
    for line in f:
      parts = line.rstrip("\n").split(":", 2)
      if len(parts) == 3:
        for name in parts[1].split(",") if parts[1] else [""]:
          groups[name] = parts[2]
  return groups


def _directory(mount: str, root: str, path: str) -> str | None:
  """Where group `path` of a hierarchy mounted at `mount` (showing its `root`) is, if shown."""
  if root != "/" and path != root and not path.startswith(root.rstrip("/") + "/"):
    return None
  relative = path[len(root):] if root != "/" else path
  return os.path.join(mount, relative.lstrip("/"))


def _writable(directory: str | None) -> bool:
  return bool(directory) and os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)


def _find(controller: str) -> tuple[str, str] | None:
  """(directory under which to create groups, "v1" or "v2") for `controller`, or None."""
  own, mounts = _own_groups(), _mounts()
  for mount, root, fstype, options in mounts:
    if fstype == "cgroup" and controller in options and controller in own:
      directory = _directory(mount, root, own[controller])
      if _writable(directory):
        return os.path.normpath(directory), "v1"
  for mount, root, fstype, _ in mounts:
    if fstype == "cgroup2" and "" in own:
      directory = _directory(mount, root, own[""])
      try:
        with open(os.path.join(directory or "", "cgroup.subtree_control"), encoding="utf-8") as f:
          enabled = f.read().split()
      except OSError:
        continue
      if controller in enabled and _writable(directory):
        return os.path.normpath(directory), "v2"
  return None


@functools.lru_cache(maxsize=None)
def _available(pid: int) -> dict[str, tuple[str, str]]:
  del pid  # the cache key: a forked child looks again
  found = {}
  for controller in CONTROLLERS:
    try:
      place = _find(controller)
    except OSError:
      place = None
    if place is not None and _works(place[0]):
      found[controller] = place
      _sweep(place[0])
  return found


def available() -> dict[str, tuple[str, str]]:
  """{controller: (parent directory, "v1" or "v2")} for each controller of `CONTROLLERS` under
  which this process can create a command's group."""
  return _available(os.getpid())


def _works(parent: str) -> bool:
  """Whether a group can really be made (and removed) under `parent`."""
  probe = os.path.join(parent, f"{_PREFIX}{_pid_namespace()}-{os.getpid()}-probe")
  try:
    os.mkdir(probe)
    os.rmdir(probe)
    return True
  except OSError:
    return False


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _pid_namespace() -> str:
  """This process's PID namespace (its inode): pids in group names mean something only in it."""
  try:
    return str(os.stat("/proc/self/ns/pid").st_ino)
  except OSError:
    return "0"


def _sweep(parent: str) -> None:
  """Removes groups left by host processes of this PID namespace that died mid-command (a
  killed sandbox worker); groups named from another namespace are left alone."""
  try:
    names = os.listdir(parent)
  except OSError:
    return
  for name in names:
    fields = name[len(_PREFIX):].split("-")
    if (name.startswith(_PREFIX) and len(fields) == 3 and fields[0] == _pid_namespace() and
        fields[1].isdigit() and not _alive(int(fields[1]))):
      _remove(os.path.join(parent, name), deadline=time.monotonic() + 1.0)


def _write(path: str, value: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write(value)


def _pids(group: str) -> list[int]:
  try:
    with open(os.path.join(group, "cgroup.procs"), encoding="utf-8") as f:
      return [int(line) for line in f if line.strip()]
  except OSError:
    return []


def _remove(group: str, deadline: float) -> bool:
  """Kills every process in `group` and removes it; False if that did not happen by
  `deadline`."""
  kill_file = os.path.join(group, "cgroup.kill")
  while True:
    if os.path.exists(kill_file):
      try:
        _write(kill_file, "1")
      except OSError:
        pass
    for pid in _pids(group):
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    try:
      os.rmdir(group)
      return True
    except FileNotFoundError:
      return True
    except OSError:
      if time.monotonic() > deadline:
        return False
      time.sleep(0.002)


class CommandGroups:
  """The groups of one command: made with its limits, ended once it has returned.

  `procs_files` are the cgroup.procs files the launcher writes its pid into; `controllers`
  names the controllers that are bounding it.
  """

  def __init__(self, memory_bytes: int, max_processes: int):
    self.groups: dict[str, str] = {}
    name = f"{_PREFIX}{_pid_namespace()}-{os.getpid()}-{next(_COUNTER)}"
    try:
      for controller, (parent, version) in available().items():
        group = os.path.join(parent, name)
        os.mkdir(group)
        self.groups[controller] = group
        if controller == "pids":
          _write(os.path.join(group, "pids.max"), str(max_processes))
        elif version == "v1":
          _write(os.path.join(group, "memory.limit_in_bytes"), str(memory_bytes))
          if os.path.exists(os.path.join(group, "memory.memsw.limit_in_bytes")):
            _write(os.path.join(group, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        else:
          _write(os.path.join(group, "memory.max"), str(memory_bytes))
          if os.path.exists(os.path.join(group, "memory.swap.max")):
            _write(os.path.join(group, "memory.swap.max"), "0")
    except OSError as e:
      self.end()
      raise OSError(f"could not make the command's control group ({e})") from e

  @property
  def controllers(self) -> tuple[str, ...]:
    return tuple(sorted(self.groups))

  @property
  def procs_files(self) -> list[str]:
    return [os.path.join(g, "cgroup.procs") for g in self.groups.values()]

  def end(self, timeout: float = 5.0) -> list[str]:
    """Kills what is left in the groups and removes them; returns those that could not be."""
    deadline = time.monotonic() + timeout
    left = [g for g in self.groups.values() if not _remove(g, deadline)]
    self.groups = {}
    return left
