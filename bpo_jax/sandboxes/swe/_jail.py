"""Starts confined commands for `confinement.py`.

Run as `python -I -S _jail.py SPEC_JSON` it launches one command; as `python -I -S _jail.py
--serve FD HOST_PID` it stays up and launches one command per request received on socket FD
(see `_serve`), which saves an interpreter start-up per command.

A fresh, single-threaded interpreter does the namespace, mount, credential and rlimit set-up and
then `execve`s the command, because doing this in a `preexec_fn` of a multi-threaded host (JAX
starts threads) can deadlock. The file imports nothing from the package so `-S` keeps start-up
near 15 ms.

With `"namespaces": true` (root only) the order is:
  1. unshare mount, network, PID, IPC and UTS namespaces; fork so the child is PID 1 of the new
     PID namespace (when it exits the kernel kills every process left in it);
  2. make every mount private, cover directories the unprivileged user cannot traverse (e.g. a
     0700 home holding the interpreter) with a tmpfs and bind back only the needed child;
  3. remount every mount read-only, mount a private size-capped tmpfs on /tmp, hide /run (host
     daemons' sockets) behind an empty read-only tmpfs, bind each
     writable directory read-write at its target path (the task directory always appears at
     the same path, so what commands print does not depend on where the host keeps it), bind
     the read-only directories (the task's git directory), copy in private files, mount
     a fresh /proc (only this namespace's processes);
  4. drop to an unprivileged uid/gid with no supplementary groups, set no_new_privs and a
     parent-death SIGKILL, apply the rlimits, exec.
Any failing step exits with status 125 and a message on stderr: the command never runs less
confined than the host was told.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SETUP_FAILED = 125

_OPTION_FLAGS = {
    "ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]


def _fail(message):
  sys.stderr.write(f"confinement set-up failed: {message}\n")
  sys.stderr.flush()
  os._exit(SETUP_FAILED)


def _check(result, what):
  if result != 0:
    errno = ctypes.get_errno()
    _fail(f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()
  _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
         f"mount {source} on {target} ({fstype}, flags {flags:#x})")


def _mount_points():
  """(mount point, per-mount flags) from /proc/self/mountinfo, parents before children."""
  points = []
  with open("/proc/self/mountinfo") as f:
    for line in f:
      fields = line.split()
      point = fields[4].encode().decode("unicode_escape")
      flags = 0
      for option in fields[5].split(","):
        flags |= _OPTION_FLAGS.get(option, 0)
      points.append((point, flags))
  return points


def _cover_closed_ancestors(paths):
  """Makes each path traversable for an unprivileged user without opening its 0700 ancestors.

  For the first ancestor `a` the user cannot traverse, `a` is covered by an empty tmpfs and only
  its child on the way to the path is bound back; repeated until the whole chain is open.
  """
  for path in paths:
    for _ in range(16):
      parts = os.path.abspath(path).strip("/").split("/")
      closed = None
      for depth in range(len(parts)):
        ancestor = "/" + "/".join(parts[:depth])
        if not os.stat(ancestor).st_mode & 0o001:
          closed = (ancestor, parts[depth])
          break
      if closed is None:
        break
      ancestor, child_name = closed
      child_fd = os.open(os.path.join(ancestor, child_name), os.O_PATH)
      _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
      child = os.path.join(ancestor, child_name)
      os.mkdir(child, 0o755)
      _mount(f"/proc/self/fd/{child_fd}", child, None, MS_BIND | MS_REC)
      os.close(child_fd)


def _confine_filesystem(spec):
  # The UTS namespace is private: a fixed host name keeps outputs the same on every host.
  _check(_libc.sethostname(b"sandbox", 7), "sethostname")
  _mount(None, "/", None, MS_REC | MS_PRIVATE)
  writable_fds = [os.open(source, os.O_PATH | os.O_DIRECTORY) for source, _ in spec["writable"]]
  readonly_fds = [os.open(source, os.O_PATH | os.O_DIRECTORY) for source, _ in spec["readonly"]]
  copies = []
  for source, target in spec["copy_in"]:
    with open(source, "rb") as f:
      copies.append((target, f.read()))
  _cover_closed_ancestors(spec["reachable"])
  for point, flags in _mount_points():
    _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
  _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
         f"size={spec['tmp_bytes']},mode=1777")
  # Host daemons' sockets live under /run; a read-only mount does not stop connecting to a
  # socket, so hide them behind an empty, read-only tmpfs.
  for run_dir in ("/run", "/var/run"):
    if os.path.isdir(run_dir) and not os.path.islink(run_dir):
      _mount("tmpfs", run_dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
             "size=4k,mode=0755")
  for (_, target), fd in zip(spec["writable"], writable_fds):
    os.makedirs(target, mode=0o755, exist_ok=True)
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
    os.close(fd)
  for (_, target), fd in zip(spec["readonly"], readonly_fds):
    os.makedirs(target, mode=0o755, exist_ok=True)
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.close(fd)
  for target, content in copies:  # private copies the command may change (in the private /tmp)
    with open(target, "wb") as f:
      f.write(content)
    os.chown(target, spec["uid"], spec["gid"])
  _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _drop_privileges(spec):
  uid, gid = spec["uid"], spec["gid"]
  os.setgroups([])
  os.setresgid(gid, gid, gid)
  os.setresuid(uid, uid, uid)
  _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _apply_rlimits(spec):
  for name, value in spec["rlimits"].items():
    limit = getattr(resource, f"RLIMIT_{name}")
    _, hard = resource.getrlimit(limit)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (value, value))


def _exec(spec):
  os.chdir(spec["cwd"])
  signal.signal(signal.SIGPIPE, signal.SIG_DFL)
  os.execve(spec["argv"][0], spec["argv"], spec["env"])


def _launch(spec):
  """Becomes the launcher of one command: confines and execs it (never returns)."""
  if not spec["namespaces"]:
    _apply_rlimits(spec)
    _exec(spec)
  _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS),
         "unshare")
  pid = os.fork()
  if pid == 0:
    try:
      _confine_filesystem(spec)
      _drop_privileges(spec)
      _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
      _apply_rlimits(spec)
      _exec(spec)
    except OSError as e:
      _fail(str(e))
  # The launcher only waits; it must die if the host kills its process group, and so must the
  # namespace (PDEATHSIG above).
  _, status = os.waitpid(pid, 0)
  if os.WIFSIGNALED(status):
    # Die of the same signal so the host sees the command's own end, not an exit status.
    signum = os.WTERMSIG(status)
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot have handlers
      signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
  os._exit(os.WEXITSTATUS(status))


def _die_with(host_pid):
  # If the host process dies (a sandbox worker killed at its timeout), so does this process,
  # and with it the command's namespace; nothing outlives the process that asked for it.
  _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
  if os.getppid() != host_pid:
    _fail("the host process died before the command started")


def _serve(sock_fd, host_pid):
  """Launches commands on request, one at a time, so each avoids an interpreter start-up.

  Protocol on a SOCK_SEQPACKET socket: the host sends a spec (JSON) with the write end of the
  output pipe attached (SCM_RIGHTS); the server forks a launcher in its own session with that
  pipe as stdout and stderr, replies with its pid (8 bytes), reaps it, kills what is left of
  its process group and replies with the wait status (8 + 4 bytes).
  """
  import socket  # pylint: disable=g-import-not-at-top
  import struct  # pylint: disable=g-import-not-at-top
  _die_with(host_pid)
  sock = socket.socket(fileno=sock_fd)
  while True:
    try:
      message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
    except OSError:
      os._exit(0)
    if not message:
      os._exit(0)
    spec = json.loads(message)
    out_fd = fds[0]
    pid = os.fork()
    if pid == 0:
      try:
        sock.close()
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.close(null)
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        _launch(spec)
      except OSError as e:
        _fail(str(e))
    os.close(out_fd)
    sock.sendall(struct.pack("!q", pid))
    _, status = os.waitpid(pid, 0)
    try:
      os.killpg(pid, signal.SIGKILL)  # background processes left in its group (no namespaces)
    except OSError:
      pass
    sock.sendall(struct.pack("!qi", pid, status))


def main():
  if sys.argv[1] == "--serve":
    _serve(int(sys.argv[2]), int(sys.argv[3]))
  spec = json.loads(sys.argv[1])
  _die_with(spec["host_pid"])
  _launch(spec)


if __name__ == "__main__":
  main()
