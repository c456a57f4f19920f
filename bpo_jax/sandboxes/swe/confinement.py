"""Runs shell commands confined to one writable directory.

Every command gets, in both modes: its own session and process group (killed as a whole at the
wall-clock timeout), CPU-time / address-space / file-size / open-file / process-count rlimits,
an environment rebuilt from a short whitelist (nothing of the host's is inherited), stdin from
/dev/null, its output truncated (the process group is killed once it has printed
`kill_output_bytes`), and a disk limit on the writable directory (watched while it runs; sparse
files count at their apparent size). Nothing a command starts outlives its call: the launcher
server is a child subreaper, so a process that left the command's session (`setsid`, a daemon's
double fork) becomes its child once its parent is gone, and it kills all of them before it
reports the command's end. The command dies with the process that started it. A root process
never runs a command as uid 0: it drops to an unprivileged uid private to the host process.

Where the host lets this process create control groups (`cgroups.py`: root, or a delegated
hierarchy), each command also runs in its own memory and pids groups: `memory_bytes` bounds all
of its processes together and `max_processes` their number, and whatever is left in the groups
is killed when it returns. Elsewhere memory is bounded per process only (RLIMIT_AS), and
`unprotected()` says so.

Two modes (`MODES`), chosen by the caller, never by the host:

* "namespaces" (the default): the command also runs in fresh mount, network, PID, IPC and UTS
  namespaces, and without root in a user namespace too (the host's uid mapped to itself, as
  bubblewrap does; the kernel must allow unprivileged user namespaces), in a filesystem built
  for it (see `_jail.py`) that holds only the task directory (read-write, at the fixed path
  `CONFINED_WORKDIR`, so what commands print about paths does not depend on where the host
  keeps it), the interpreter with its packages, the system's executables and libraries, a few
  files of /etc, and a private, size-capped /tmp; all of it read-only but the task directory
  and /tmp. The host's other directories (the user's home among them), its /tmp, /run (host
  daemons' sockets) and the package's own files (the shipped tasks' instances, reference
  patches and hidden tests, even when the interpreter's site-packages point at them) are not
  there. The network namespace has no usable interface; /proc shows only the command's own
  processes; when the command ends the kernel kills what it left behind; it holds no
  capability. If this host cannot give namespaces, or setting them up fails, commands do not
  run: `ConfinementError` says why, naming the step that failed.
* "rlimits-only" (explicit): no namespaces; the host's filesystem is seen with the permissions
  of the command's uid (the package's task data included), the network is the host's, paths are
  the host's. Under root the uid is unprivileged, so the interpreter must be reachable for it
  (a 0700 home directory holding it is not). Without root the command runs as the host's user:
  RLIMIT_NPROC then counts the user's processes, the host's included, so it is set to those
  running at the command's start plus `max_processes`.

`protections(mode)` reports what commands get and `unprotected(mode)` what they do not, in
words; it probes the namespaces once per process by running one command in them, so a host
that lacks them is told apart from a set-up that fails.

Commands are launched by small server processes (`_jail.py --serve`, started on first use, one
more for each command run at the same time from another thread), which fork a launcher per
command; the set-up happens in that single-threaded process, never in the host, which may run
JAX's threads.

Example:

  limits = Limits(wall_seconds=5.0)
  result = run_confined("echo hi > out.txt && cat out.txt", workdir, limits)
  result.output == "hi\\n" and result.exit_code == 0
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import select
import signal
import site
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from typing import Callable, Mapping, Sequence

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes.swe import cgroups as cgroups_lib

_JAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jail.py")
# Where the writable directory appears inside the namespaces: one fixed path, so that anything a
# command prints about its location is the same in every sandbox and process.
CONFINED_WORKDIR = "/tmp/task"
SETUP_FAILED = 125
MODES = ("namespaces", "rlimits-only")
# The bpo_jax package directory: the agent's commands never see it (it holds the shipped tasks).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ConfinementError(base.EnvironmentFailure):
  """Commands cannot be confined as asked: the mode is not available here, or set-up failed."""


# Variables a command sees; anything else of the host's environment is dropped.
_BASE_ENV = {
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "TERM": "dumb",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "PYTHONUNBUFFERED": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "GIT_CONFIG_NOSYSTEM": "1",
}


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits of one command.

  wall_seconds: wall-clock timeout; the whole process group is killed then.
  cpu_seconds: RLIMIT_CPU (SIGXCPU, then SIGKILL).
  memory_bytes: the memory of all of the command's processes together (its memory cgroup,
    where the host has one) and RLIMIT_AS of each.
  file_bytes: RLIMIT_FSIZE, the largest file a command may write (SIGXFSZ beyond).
  max_processes: processes at once: RLIMIT_NPROC, counted for the command's own uid (root),
    its user namespace (namespaces without root) or, without either, on top of the processes
    the user runs at its start; and pids.max of its pids cgroup (the launcher included).
  max_open_files: RLIMIT_NOFILE.
  tmp_bytes: size of the private /tmp (only with namespaces).
  max_output_chars: output kept (head and tail) in the observation.
  kill_output_bytes: output after which the process group is killed.
  disk_bytes: space the writable directory may take; checked while the command runs (every
    `disk_check_seconds`, so the overshoot is what can be written in that time) and after it.
  """

  wall_seconds: float = 10.0
  cpu_seconds: int = 10
  memory_bytes: int = 2 << 30
  file_bytes: int = 16 << 20
  max_processes: int = 64
  max_open_files: int = 256
  tmp_bytes: int = 64 << 20
  max_output_chars: int = 8000
  kill_output_bytes: int = 4 << 20
  disk_bytes: int = 256 << 20
  disk_check_seconds: float = 0.1

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not value > 0:
        raise ValueError(f"Limits.{field.name} must be positive, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CommandResult:
  """What a confined command did."""

  output: str              # stdout and stderr interleaved, truncated to max_output_chars
  exit_code: int           # negative: killed by that signal
  timed_out: bool          # killed at the wall-clock timeout
  output_limited: bool     # killed for printing more than kill_output_bytes
  disk_limited: bool       # the writable directory grew past disk_bytes (killed if still running)
  output_bytes: int        # bytes the command printed (counted up to the kill)
  seconds: float

  def report(self) -> str:
    """A one-line account of how the command ended, for the observation."""
    notes = []
    if self.timed_out:
      notes.append("timed out; its process group was killed")
    if self.disk_limited:
      notes.append("the task directory grew past the disk limit; killed")
    if self.output_limited:
      notes.append(f"printed more than the output limit ({self.output_bytes} bytes); killed")
    if self.exit_code < 0:
      try:
        name = signal.Signals(-self.exit_code).name
      except ValueError:
        name = str(-self.exit_code)
      notes.append(f"killed by signal {name}")
    else:
      notes.append(f"exit code {self.exit_code}")
    return "[" + "; ".join(notes) + "]"


@functools.lru_cache(maxsize=None)
def _python_paths() -> tuple[str, ...]:
  """Directories the interpreter (and its pytest) needs to be reachable in the confinement: its
  executable's directory, prefix and base prefix (a virtualenv and its base interpreter),
  library and site-packages directories."""
  paths = {os.path.dirname(os.path.realpath(sys.executable)), os.path.realpath(sys.prefix),
           os.path.realpath(sys.base_prefix), os.path.realpath(sys.exec_prefix)}
  for key in ("stdlib", "platstdlib", "purelib", "platlib"):
    path = sysconfig.get_paths().get(key)
    if path:
      paths.add(os.path.realpath(path))
  paths.update(os.path.realpath(p) for p in site.getsitepackages())
  return tuple(sorted(p for p in paths if os.path.isdir(p)))


def _installed_copies(site_dir: str) -> set[str]:
  """Directories of bpo_jax that `site_dir` holds or points at (.pth lines, editable finders)."""
  found = {os.path.join(site_dir, "bpo_jax")}
  try:
    names = [n for n in os.listdir(site_dir) if n.endswith(".pth") or
             (n.startswith("__editable__") and n.endswith(".py"))]
  except OSError:
    names = []
  for name in names:
    try:
      with open(os.path.join(site_dir, name), encoding="utf-8", errors="replace") as f:
        text = f.read(1 << 16)
    except OSError:
      continue
    for path in re.findall(r"""(?:^|['"])(/[^'"\n]*)""", text, flags=re.M):
      path = path.rstrip()
      found.add(path if os.path.basename(path) == "bpo_jax" else os.path.join(path, "bpo_jax"))
  return {os.path.realpath(p) for p in found if os.path.isfile(os.path.join(p, "__init__.py"))}


@functools.lru_cache(maxsize=None)
def _hidden_paths() -> tuple[str, ...]:
  """Directories covered by an empty one in the confinement: every copy of the package (the
  running one, one installed in the interpreter's site-packages, one a .pth file or an editable
  install points at), and the source checkout around each (when it is one) unless an
  interpreter directory lives inside it. Only those under a directory the command sees matter;
  the rest are not in its view anyway."""
  packages = {os.path.realpath(_PACKAGE_DIR)}
  for site_dir in _python_paths():
    packages |= _installed_copies(site_dir)
  paths = set(packages)
  markers = ("pyproject.toml", "setup.py", ".git")
  for package in packages:
    checkout = os.path.dirname(package)
    if (checkout != "/" and any(os.path.exists(os.path.join(checkout, m)) for m in markers) and
        not any(p == checkout or p.startswith(checkout + os.sep) for p in _python_paths())):
      paths.add(checkout)
  return tuple(sorted(paths))


def command_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
  """The whitelisted environment: PATH puts this interpreter's `python` first."""
  env = dict(_BASE_ENV)
  env["PATH"] = os.pathsep.join(
      [os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
  env.update(extra or {})
  return env


def default_uid() -> int:
  """An unprivileged uid private to this process (1e6 + pid: unique among live processes), so
  process-count limits, and the clean-up that kills what is left of a command, are per worker."""
  return 1_000_000 + os.getpid()


def _spec(argv, cwd, limits, namespaces, uid, env, readonly=None, copy_in=None,
          reachable=(), cgroups=()) -> dict:
  """What the launcher (`_jail.py`) needs to start one command. `uid` None: this process's
  user (a non-root host); under root the command's own unprivileged uid."""
  root = os.geteuid() == 0
  uid = os.getuid() if uid is None else uid
  rlimits = {"CPU": int(limits.cpu_seconds), "AS": int(limits.memory_bytes),
             "FSIZE": int(limits.file_bytes), "NOFILE": int(limits.max_open_files),
             "CORE": 0, "NPROC": int(limits.max_processes)}
  target = CONFINED_WORKDIR if namespaces else cwd
  seen = sorted(set(_python_paths()) | {os.path.realpath(p) for p in reachable})
  return {"argv": list(argv), "cwd": target, "env": env, "namespaces": namespaces,
          "writable": [[cwd, target]], "reachable": seen,
          "hidden": list(_hidden_paths()), "uid": uid, "gid": uid if root else os.getgid(),
          # Root: a uid of the command's own. Else, with namespaces, a user namespace (its
          # process count is the command's alone); without, the uid is shared with the host.
          "private_uid": root, "userns": namespaces and not root,
          "shared_uid_nproc": not namespaces and not root, "cgroups": list(cgroups),
          "tmp_bytes": int(limits.tmp_bytes), "rlimits": rlimits, "host_pid": os.getpid(),
          "readonly": [[source, target] for target, source in (readonly or {}).items()],
          "copy_in": [[source, target] for target, source in (copy_in or {}).items()]}


def _truncate(data: bytes, max_chars: int) -> str:
  text = data.decode("utf-8", errors="replace")
  if len(text) <= max_chars:
    return text
  head, tail = text[: max_chars // 2], text[-(max_chars // 2):]
  return f"{head}\n[... {len(text) - len(head) - len(tail)} characters truncated ...]\n{tail}"


class _LaunchServer:
  """A `_jail.py --serve` process of this process: launches commands without an interpreter
  start-up each, one at a time (`lock`). Started on first use; restarted if it died."""

  def __init__(self):
    self.lock = threading.Lock()
    self.owner_pid = None
    self.proc = None
    self.sock = None

  def _start(self):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.proc = subprocess.Popen(
        [sys.executable, "-I", "-S", _JAIL, "--serve", str(theirs.fileno()), str(os.getpid())],
        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, close_fds=True,
        env={"PATH": "/usr/bin:/bin"})
    theirs.close()
    self.sock, self.owner_pid = ours, os.getpid()

  def launch(self, spec: dict) -> tuple[int, int, Callable[[], tuple[int, int, str]]]:
    """Starts a command; returns (pid, output fd, wait() -> (raw wait status, processes the
    server could not end, the failing set-up step's report or ""))."""
    for _ in range(2):
      if self.owner_pid != os.getpid() or self.proc is None or self.proc.poll() is not None:
        self._start()
      read_fd, write_fd = os.pipe()
      try:
        socket.send_fds(self.sock, [json.dumps(spec).encode()], [write_fd])
        reply = self.sock.recv(64)
      except OSError:
        reply = b""
      finally:
        os.close(write_fd)
      if len(reply) == 8:
        pid = struct.unpack("!q", reply)[0]
        return pid, read_fd, functools.partial(self._wait, pid)
      os.close(read_fd)
      self.proc = None  # the server died: start a new one and try once more
    raise RuntimeError("the command launcher does not answer")

  def _wait(self, pid: int) -> tuple[int, int, str]:
    reply = self.sock.recv(1 << 16)
    if len(reply) < 16:
      self.proc = None
      return signal.SIGKILL, 0, ""  # the server died with the command: report it killed
    got, status, left = struct.unpack("!qii", reply[:16])
    assert got == pid, (got, pid)
    return status, left, reply[16:].decode("utf-8", errors="replace").strip()


_SERVERS: list[_LaunchServer] = []
_SERVERS_LOCK = threading.Lock()


def _free_server() -> _LaunchServer:
  """A server of this process not running a command (locked for the caller); a new one when
  every server is busy (commands run from several threads at once)."""
  with _SERVERS_LOCK:
    for server in _SERVERS:
      if server.lock.acquire(blocking=False):
        return server
    server = _LaunchServer()
    server.lock.acquire()
    _SERVERS.append(server)
    return server


def _launch(spec: dict
            ) -> tuple[int, int, Callable[[], tuple[int, int, str]], Callable[[], None]]:
  """Starts a command on a free server: (pid, output fd, wait, release the server)."""
  server = _free_server()
  try:
    return (*server.launch(spec), server.lock.release)
  except BaseException:
    server.lock.release()
    raise


def _exit_code(status: int) -> int:
  return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _run_spec(spec: dict, limits: Limits) -> CommandResult:
  """Runs a command: its control groups (where the host has them), launch, watch, clean-up.

  Raises:
    ConfinementError: the groups could not be made, a set-up step failed (the command did not
      run), or processes the command left could not be ended.
  """
  start = time.monotonic()
  try:
    groups = cgroups_lib.CommandGroups(limits.memory_bytes, limits.max_processes)
  except OSError as e:
    raise ConfinementError(f"could not confine the command: {e}") from e
  try:
    pid, fd, wait, release = _launch({**spec, "cgroups": groups.procs_files})
    try:
      result, left, failure = _watch(spec, limits, start, pid, fd, wait)
    finally:
      release()
  finally:
    stuck = groups.end()
  if failure:
    raise ConfinementError(f"could not confine the command: {failure}")
  if left or stuck:
    raise ConfinementError(
        f"could not end what the command left running ({left} processes outlived the "
        f"clean-up; control groups not emptied: {stuck})")
  return result


def _watch(spec: dict, limits: Limits, start: float, pid: int, fd: int,
           wait: Callable[[], tuple[int, int, str]]) -> tuple[CommandResult, int, str]:
  """Reads a started command's output under the limits; kills it when one is passed. Returns
  the result, how many processes it left that could not be ended and a set-up failure's
  report."""
  keep = limits.max_output_chars * 4 + 4
  head, tail, total = bytearray(), b"", 0
  timed_out = output_limited = disk_limited = False
  watched = spec["writable"][0][0]
  next_disk_check = start + limits.disk_check_seconds
  deadline = start + limits.wall_seconds
  try:
    while True:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        timed_out = True
        break
      now = time.monotonic()
      if now >= next_disk_check:
        scan_start = now
        if disk_usage(watched) > limits.disk_bytes:
          disk_limited = True
          break
        now = time.monotonic()
        # Scanning a large tree costs time: keep it under a tenth of the command's.
        next_disk_check = now + max(limits.disk_check_seconds, 10 * (now - scan_start))
      ready, _, _ = select.select([fd], [], [], max(0.0, min(remaining, next_disk_check - now)))
      if not ready:
        continue
      chunk = os.read(fd, 1 << 16)
      if not chunk:
        break
      total += len(chunk)
      take = max(0, keep - len(head))
      head += chunk[:take]
      tail = (tail + chunk[take:])[-keep:]
      if total > limits.kill_output_bytes:
        output_limited = True
        break
  finally:
    if timed_out or output_limited or disk_limited:
      _kill_group(pid)
    os.close(fd)
    status, left, failure = wait()
    exit_code = _exit_code(status)
    if spec["private_uid"]:  # the command's own uid: nothing of it outlives the call
      _wait_until_gone(spec["uid"])
  disk_limited = disk_limited or disk_usage(watched) > limits.disk_bytes
  data = bytes(head) if total <= keep else bytes(head) + b"\n...\n" + tail
  return CommandResult(output=_truncate(data, limits.max_output_chars), exit_code=exit_code,
                       timed_out=timed_out, output_limited=output_limited,
                       disk_limited=disk_limited, output_bytes=total,
                       seconds=time.monotonic() - start), left, failure


def disk_usage(path: str) -> int:
  """Bytes the files under `path` take or claim: per file the larger of its allocated blocks
  and its apparent size (symlinks not followed; each path counted, hard links each time).

  A sparse file counts at its apparent size: a snapshot reads that many bytes (holes read as
  zeros), so a directory within `Limits.disk_bytes` by this count is one whose snapshot is too.
  """
  total = 0
  stack = [path]
  while stack:
    try:
      entries = list(os.scandir(stack.pop()))
    except OSError:
      continue
    for entry in entries:
      try:
        info = entry.stat(follow_symlinks=False)
      except OSError:
        continue
      total += max(info.st_blocks * 512, info.st_size)
      if entry.is_dir(follow_symlinks=False):
        stack.append(entry.path)
  return total


def _processes_of(uid: int) -> list[int]:
  pids = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        if os.stat(f"/proc/{name}").st_uid == uid:
          pids.append(int(name))
      except OSError:
        pass
  return pids


def _wait_until_gone(uid: int, timeout: float = 5.0) -> None:
  """Kills every process of the command's own uid and waits until they are gone.

  With namespaces they die with the namespace's first process, but reaping them is
  asynchronous; without, this is what ends the processes a command detached from its process
  group. Returning only once they are gone means a command never outlives its call.
  """
  if uid == 0:
    raise ValueError("refusing to kill every process of uid 0")
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    pids = _processes_of(uid)
    if not pids:
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    time.sleep(0.01)


def _kill_group(pid: int) -> None:
  """Kills a launcher and its process group (the launcher leads its own session)."""
  for kill in (os.kill, os.killpg):
    try:
      kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass


_ALWAYS = ("process_group_timeout", "rlimits", "scrubbed_env", "output_truncation", "disk_limit",
           "process_limit", "ends_every_descendant")
_NAMESPACED = ("network_namespace", "read_only_filesystem", "private_tmp", "pid_namespace",
               "private_filesystem_view")
# What the probe writes: its pid, uid, effective capabilities, network interfaces, root mount's
# flag, the interpreter's output and /tmp's listing (in its own directory).
_PROBE = ("echo $$ > pid; id -u > uid; awk '/^CapEff/ {print $2}' /proc/self/status > caps; "
          "wc -l < /proc/net/dev > net; "
          "awk '$5 == \"/\" {split($6, o, \",\"); print o[1]}' /proc/self/mountinfo > root; "
          "python -I -S -c 'print(7 * 6)' > python 2>&1; ls -A /tmp | tr '\\n' ' ' > tmp")


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"confinement must be one of {', '.join(map(repr, MODES))}, got {mode!r}")


def _command_uid() -> int:
  """The uid commands run as: their own under root, else this process's user's."""
  return default_uid() if os.geteuid() == 0 else os.getuid()


def _user_namespaces_off() -> str | None:
  """Why a non-root process gets no user namespace here, when the kernel says so up front."""
  try:
    with open("/proc/sys/user/max_user_namespaces", encoding="utf-8") as f:
      if int(f.read()) == 0:
        return "unprivileged user namespaces are off (/proc/sys/user/max_user_namespaces is 0)"
  except (OSError, ValueError):
    pass
  return None


@functools.lru_cache(maxsize=None)
def _namespaces_missing() -> str | None:
  """None when commands run confined in namespaces here; else why this host cannot give them
  (not Linux, user namespaces off for a non-root user, the kernel refuses to unshare).

  Raises:
    ConfinementError: the namespaces were granted but a later set-up step failed, or the probe
      command saw something other than the confinement promised.
  """
  if not sys.platform.startswith("linux"):
    return f"namespaces need Linux, this is {sys.platform}"
  if os.geteuid() != 0 and _user_namespaces_off():
    return _user_namespaces_off()
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix="bpo_probe_") as probe_dir:
    if os.geteuid() == 0:
      os.chown(probe_dir, default_uid(), default_uid())
    limits = Limits(wall_seconds=20.0)
    spec = _spec(["/bin/sh", "-c", _PROBE], probe_dir, limits, True,
                 default_uid() if os.geteuid() == 0 else None, command_env())
    try:
      result = _run_spec(spec, limits)
    except ConfinementError as e:
      if "at step 'unshare namespaces'" in str(e):
        who = "" if os.geteuid() == 0 else "an unprivileged user's "
        return str(e).rsplit(": ", 1)[-1] + f" (the kernel refused {who}unshare)"
      raise
    _check_probe(probe_dir, result)
  return None


def _check_probe(probe_dir: str, result: CommandResult) -> None:
  """Raises ConfinementError unless the probe saw what the confinement promises."""

  def read(name):
    path = os.path.join(probe_dir, name)
    return open(path, encoding="utf-8").read().strip() if os.path.exists(path) else ""

  expected = {"pid": ("1", "its process id (1 in a new PID namespace)"),
              "uid": (str(_command_uid()), "its uid"),
              "caps": ("0" * 16, "its effective capabilities"),
              "net": ("3", "the lines of /proc/net/dev (loopback only)"),
              "root": ("ro", "the root mount's flag"),
              "python": ("42", "the interpreter's output")}
  for name, (want, what) in expected.items():
    if read(name) != want:
      raise ConfinementError(
          f"the confinement probe printed {read(name)!r} for {what}, not {want!r} "
          f"(exit code {result.exit_code}; output {result.output.strip()!r})")
  if os.path.basename(probe_dir) in read("tmp").split():
    raise ConfinementError(f"the confinement probe saw the host's /tmp: {read('tmp')!r}")


def namespaces_available() -> bool:
  """Whether this host confines commands in namespaces (see `_namespaces_missing`).

  Raises:
    ConfinementError: setting them up failed (not the same as a host without them).
  """
  return _namespaces_missing() is None


_FALLBACK = ("Configure the confinement 'rlimits-only' (the sandbox option "
             "confinement='rlimits-only') to run them with resource limits only, seeing the "
             "host's files")


def protections(mode: str = "namespaces") -> dict[str, bool]:
  """Which protections commands get in `mode` on this host.

  Always: process_group_timeout, rlimits, scrubbed_env, output_truncation, disk_limit,
  process_limit, ends_every_descendant. With namespaces also: network_namespace,
  read_only_filesystem, private_tmp, pid_namespace, private_filesystem_view (only the task,
  the interpreter and the system's files; not the package's task data). Depending on the host:
  unprivileged_uid (root: a uid of the commands' own), user_namespace (namespaces without
  root), total_memory_limit and process_cgroup (a writable memory / pids cgroup). What is not
  protected, in words: `unprotected(mode)`.

  Raises:
    ValueError: `mode` is not one of `MODES`.
    ConfinementError: "namespaces" is not available on this host, or its set-up fails.
  """
  _check_mode(mode)
  namespaces = mode == "namespaces"
  if namespaces:
    try:
      missing = _namespaces_missing()
    except ConfinementError as e:
      raise ConfinementError(f"{e}. {_FALLBACK}") from e
    if missing is not None:
      raise ConfinementError(
          f"commands cannot run in namespaces on this host: {missing}. {_FALLBACK}")
  root = os.geteuid() == 0
  groups = cgroups_lib.available()
  return {**{name: True for name in _ALWAYS}, **{name: namespaces for name in _NAMESPACED},
          "unprivileged_uid": root, "user_namespace": namespaces and not root,
          "total_memory_limit": "memory" in groups, "process_cgroup": "pids" in groups}


def _kernel_counts_nproc_per_namespace() -> bool:
  """Linux >= 5.14 counts RLIMIT_NPROC per user namespace and uid (its ucounts)."""
  try:
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", os.uname().release).groups())
  except (AttributeError, ValueError):
    return False
  return (major, minor) >= (5, 14)


def unprotected(mode: str = "namespaces") -> list[str]:
  """What commands in `mode` are not protected against on this host, one plain sentence each
  (empty: nothing this module knows of). Logged when a sandbox is built, and recorded in a
  run's config.json (`protections_record`)."""
  _check_mode(mode)
  root = os.geteuid() == 0
  groups = cgroups_lib.available()
  notes = []
  if mode == "rlimits-only":
    who = "their own unprivileged uid" if root else "the host's user"
    notes += [f"the host's files: commands see them with the permissions of {who}, the "
              "package's task data (reference patches, hidden tests) included, and write "
              "wherever that uid may (the host's /tmp" + ("" if root else ", the user's home") +
              ")", "the network: commands use the host's"]
    if not root:
      notes.append("the host's processes: commands run as the host's user, so they can signal "
                   "or trace its processes, the launcher included (killing it cuts the "
                   "clean-up of what they left running short)")
  if "pids" not in groups and not root and (
      mode == "rlimits-only" or not _kernel_counts_nproc_per_namespace()):
    notes.append("the process count: RLIMIT_NPROC counts every process of the user, the "
                 "host's own included, so a command may start max_processes more than the "
                 "user ran when it started, shared with whatever else the user starts meanwhile")
  if "memory" not in groups:
    notes.append("total memory: no writable memory cgroup here, so memory is bounded per "
                 "process (RLIMIT_AS): a command's processes together may hold up to "
                 "max_processes x memory_bytes")
  return notes


def run_confined(command: str, cwd: str, limits: Limits = Limits(), *,
                 uid: int | None = None, env: Mapping[str, str] | None = None,
                 namespaces: bool = True, readonly: Mapping[str, str] | None = None,
                 copy_in: Mapping[str, str] | None = None,
                 reachable: Sequence[str] = ()) -> CommandResult:
  """Runs `sh -c command` in `cwd` under `limits`; see the module docstring for the confinement.

  `namespaces=True` is the mode "namespaces", False the mode "rlimits-only". Under root the
  command runs as `uid` (default `default_uid()`; never 0), and `cwd` must be writable by it;
  the caller owns that (the SWE sandbox chowns its task directory). Without root `uid` is
  ignored: the command runs as this process's user (with namespaces, in a user namespace that
  maps that uid to itself).

  Only with namespaces: `readonly` maps paths under /tmp to host directories bound there
  read-only; `copy_in` maps paths under /tmp to host files copied there, owned by `uid`;
  `reachable` names more host directories seen read-only at their own paths (an instance's
  Python environment), as the interpreter's are.

  Raises:
    ValueError: bad arguments.
    ConfinementError: namespaces are not available here, the command's confinement could not
      be set up (the command did not run), or what it left running could not be ended.
  """
  if not isinstance(command, str) or not command.strip():
    raise ValueError(f"command must be non-empty text, got {command!r}")
  if "\0" in command:
    raise ValueError("command contains a NUL character")
  if not os.path.isdir(cwd):
    raise ValueError(f"cwd {cwd!r} is not a directory")
  namespaces = bool(namespaces)
  if namespaces:
    protections("namespaces")  # raises when this host cannot give them
  for target in list(readonly or {}) + list(copy_in or {}):
    if not namespaces:
      raise ValueError("readonly and copy_in need namespaces")
    if not target.startswith("/tmp/") or ".." in target.split("/"):
      raise ValueError(f"readonly and copy_in targets must be under /tmp, got {target!r}")
  if os.geteuid() == 0:
    uid = default_uid() if uid is None else uid
    if uid == 0:
      raise ValueError("a command never runs as uid 0; pass an unprivileged uid")
  else:
    uid = None
  spec = _spec(["/bin/sh", "-c", command], os.path.realpath(cwd), limits, namespaces, uid,
               command_env(env), readonly, copy_in, reachable)
  return _run_spec(spec, limits)
