"""Starts confined commands for `confinement.py`.

Run as `python -I -S _jail.py --serve FD HOST_PID` it stays up and launches one command per
request received on socket FD (see `_serve`), which saves an interpreter start-up per command.
The server is a child subreaper: whatever a command leaves running, even a process that left
its session (`setsid`), becomes the server's child once its parent is gone, and the server kills
all of them before it reports the command's end.

A fresh, single-threaded interpreter does the namespace, mount, credential and rlimit set-up and
then `execve`s the command, because doing this in a `preexec_fn` of a multi-threaded host (JAX
starts threads) can deadlock. The file imports nothing from the package so `-S` keeps start-up
near 15 ms.

Each launcher first joins the command's control groups (`spec["cgroups"]`, see cgroups.py).
With `"namespaces": true` the order is:
  1. unshare mount, network, PID, IPC and UTS namespaces, and without root a user namespace
     too, in which the host's uid and gid are mapped to themselves (and nothing else is:
     setgroups is denied), as bubblewrap does; fork so the child is PID 1 of the new PID
     namespace (when it exits the kernel kills every process left in it);
  2. make every mount private and build a new root on an empty tmpfs, holding only: the
     system's executables and libraries (`/usr`, `/bin`, `/lib*`, `/sbin`), a few files of
     `/etc` (`_ETC_ENTRIES`: users, groups, the loader's cache; not `/etc/shadow`), a minimal
     `/dev`, an empty `/run`, a private size-capped `/tmp`, each `reachable` directory (the
     interpreter and its packages) at its own path, the writable directory bound read-write at
     its target (the task directory always appears at the same path, so what commands print
     does not depend on where the host keeps it), the read-only directories (the task's git
     directory) and private copies of files. Host directories are opened before anything is
     mounted, so directories that share an ancestor (a 0700 home holding a base interpreter
     and a virtualenv) or live in the host's /tmp are all reachable;
  3. pivot into the new root and detach the old one: nothing else of the host is reachable;
     cover each `hidden` directory (the package's own files, with the shipped tasks' reference
     patches and tests) with an empty read-only tmpfs and make every mount read-only except
     the writable directory and /tmp (a fresh /proc, showing only this namespace's processes,
     is mounted before the pivot: in a user namespace the kernel allows it only while the
     host's /proc is visible);
  4. drop the capability bounding set, and under root switch to the unprivileged uid/gid with
     no supplementary groups (in a user namespace the uid is already the unprivileged host
     user's, and the capabilities the namespace gave end at exec), set no_new_privs and a
     parent-death SIGKILL, apply the rlimits, exec.
Without namespaces a root process still drops to the spec's unprivileged uid before the
rlimits and the exec; a spec that would run a command as uid 0 is refused. A non-root host's
RLIMIT_NPROC (it counts every process of the uid, the host's own included) is set to the
processes the uid runs at the start plus the spec's allowance. Any failing step exits with
status 125 and reports "confinement set-up failed at step '<step>': <why>" on the server's
failure pipe (not the command's output, which a command could forge): the command never runs
less confined than the host was told.
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MNT_DETACH = 2
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
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SETUP_FAILED = 125
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

# What the command sees of the host besides the spec's directories.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_ENTRIES = ("alternatives", "group", "host.conf", "hosts", "ld.so.cache", "ld.so.conf",
                "ld.so.conf.d", "localtime", "mime.types", "nsswitch.conf", "os-release",
                "passwd", "protocols", "services")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_NEW_ROOT = "/tmp"  # where the new root is built (in this namespace only) before the pivot
_MAX_OPENED_ENTRIES = 256  # entries re-bound from directories closed to other users

_OPTION_FLAGS = {
    "ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_step = ["start"]


def _at(step):
  """Names the set-up step under way, for the message if it fails."""
  _step[0] = step


# Where a failing set-up step is reported: the server's, stderr; a launcher's, the server's
# failure pipe, closed when the command is exec'd, so nothing a command prints reads as one.
_report_fd = [2]


def _fail(message):
  text = f"confinement set-up failed at step '{_step[0]}': {message}\n"
  try:
    os.write(_report_fd[0], text.encode(errors="replace")[:4000])
  except OSError:
    pass
  os._exit(SETUP_FAILED)


def _check(result, what):
  if result != 0:
    errno = ctypes.get_errno()
    _fail(f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()
  _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
         f"mount {source} on {target} ({fstype}, flags {flags:#x})")


def _bind(fd, target, recursive=True):
  _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | (MS_REC if recursive else 0))


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


def _under(path, parents):
  return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)


def _outermost(paths):
  """The paths not inside another of them (nor inside a system directory), sorted."""
  kept = []
  for path in sorted(set(paths)):
    if not _under(path, kept) and not _under(path, _SYSTEM_DIRS):
      kept.append(path)
  return kept


def _open(path, flags=os.O_PATH):
  _at(f"open {path}")
  return os.open(path, flags)


def _open_sources(spec):
  """Opens every host directory the command will see before anything is mounted over them."""
  targets = [t for _, t in spec["writable"] + spec["readonly"]] + [t for _, t in spec["copy_in"]]
  reachable = _outermost(spec["reachable"])
  for path in reachable:
    if _under(path, targets) or any(_under(t, [path]) for t in targets):
      _at(f"check {path}")
      _fail(f"the interpreter directory {path} overlaps the task's paths {targets}")
  system = [(d, os.readlink(d) if os.path.islink(d) else _open(d, os.O_PATH | os.O_DIRECTORY))
            for d in _SYSTEM_DIRS if os.path.lexists(d)]
  sources = {
      "system": system,
      "reachable": [(p, _open(p, os.O_RDONLY | os.O_DIRECTORY)) for p in reachable],
      "writable": [(t, _open(s, os.O_PATH | os.O_DIRECTORY)) for s, t in spec["writable"]],
      "readonly": [(t, _open(s, os.O_PATH | os.O_DIRECTORY)) for s, t in spec["readonly"]],
      "copy_in": [],
  }
  for source, target in spec["copy_in"]:
    _at(f"read {source}")
    with open(source, "rb") as f:
      sources["copy_in"].append((target, f.read()))
  return sources


def _show(fd, target, budget):
  """Shows the host directory `fd` at `target`: a bind mount; or, for a directory other users
  may not list and enter (a virtualenv made with mode 0700), an open tmpfs holding a bind of
  each of its entries (the same, recursively, for closed subdirectories)."""
  if os.fstat(fd).st_mode & 0o005 == 0o005:
    _bind(fd, target)
    return
  _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
  for name in sorted(os.listdir(fd)):
    budget[0] -= 1
    if budget[0] < 0:
      _fail(f"more than {_MAX_OPENED_ENTRIES} entries in directories closed to other users "
            f"(mode 0700) under {target}; open them (chmod o+rx)")
    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    path = os.path.join(target, name)
    if stat.S_ISLNK(info.st_mode):
      os.symlink(os.readlink(name, dir_fd=fd), path)
      continue
    if stat.S_ISDIR(info.st_mode):
      os.mkdir(path, 0o755)
      child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
      _show(child, path, budget)
    else:
      open(path, "wb").close()
      child = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=fd)
      _bind(child, path, recursive=False)
    os.close(child)


def _populate_etc(root):
  _at("populate /etc")
  os.mkdir(root + "/etc", 0o755)
  names = list(_ETC_ENTRIES) + sorted(n for n in os.listdir("/etc") if n.startswith("python3"))
  for name in names:
    source, target = "/etc/" + name, root + "/etc/" + name
    _at(f"copy {source}")
    if os.path.islink(source):
      os.symlink(os.readlink(source), target)
    elif os.path.isdir(source):
      os.mkdir(target, 0o755)
      fd = os.open(source, os.O_PATH | os.O_DIRECTORY)
      _bind(fd, target)
      os.close(fd)
    elif os.path.isfile(source):
      with open(source, "rb") as f:
        content = f.read()
      with open(target, "wb") as f:
        f.write(content)
      os.chmod(target, os.stat(source).st_mode & 0o755)


def _populate_dev(root):
  _at("populate /dev")
  os.mkdir(root + "/dev", 0o755)
  for name in _DEVICES:
    if os.path.exists("/dev/" + name):
      open(root + "/dev/" + name, "wb").close()
      fd = os.open("/dev/" + name, os.O_PATH)
      _bind(fd, root + "/dev/" + name, recursive=False)
      os.close(fd)
  for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
    os.symlink(target, f"{root}/dev/{name}")


def _build_root(spec, sources):
  """Mounts the new root's tmpfs on `_NEW_ROOT` and puts into it what the command may see."""
  root = _NEW_ROOT
  _at("mount the new root")
  _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0755")
  for path, fd_or_link in sources["system"]:
    _at(f"bind {path}")
    if isinstance(fd_or_link, str):
      os.symlink(fd_or_link, root + path)
    else:
      os.mkdir(root + path, 0o755)
      _bind(fd_or_link, root + path)
      os.close(fd_or_link)
  _populate_etc(root)
  _populate_dev(root)
  for name in ("proc", "run", "tmp"):
    os.mkdir(f"{root}/{name}", 0o755)
  _at("mount /proc")
  _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
  _at("mount the private /tmp")
  _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
         f"size={spec['tmp_bytes']},mode=1777")
  budget = [_MAX_OPENED_ENTRIES]
  for kind in ("reachable", "writable", "readonly"):
    for target, fd in sources[kind]:
      _at(f"bind {target}")
      os.makedirs(root + target, mode=0o755, exist_ok=True)
      if kind == "reachable":
        _show(fd, root + target, budget)
      else:
        _bind(fd, root + target, recursive=kind != "writable")
      if kind == "writable":
        _mount(None, root + target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
      os.close(fd)
  for target, content in sources["copy_in"]:  # private copies the command may change
    _at(f"copy in {target}")
    with open(root + target, "wb") as f:
      f.write(content)
    os.chown(root + target, spec["uid"], spec["gid"])
  return root


def _enter_root(root):
  """Makes `root` the root directory and detaches the old one (pivot_root(2)'s "." idiom)."""
  _at("pivot into the new root")
  os.chdir(root)
  number = _SYS_PIVOT_ROOT.get(os.uname().machine)
  if number is None:
    _fail(f"pivot_root's system call number is not known for {os.uname().machine}")
  _check(_libc.syscall(number, b".", b"."), "pivot_root")
  _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
  os.chdir("/")


def _confine_filesystem(spec):
  # The UTS namespace is private: a fixed host name keeps outputs the same on every host.
  _at("set the host name")
  _check(_libc.sethostname(b"sandbox", 7), "sethostname")
  _at("make the mounts private")
  _mount(None, "/", None, MS_REC | MS_PRIVATE)
  umask = os.umask(0o022)
  _enter_root(_build_root(spec, _open_sources(spec)))
  for path in spec["hidden"]:
    _at(f"hide {path}")
    if os.path.isdir(path) and not os.path.islink(path):
      _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
             "size=4k,mode=0755")
  keep = {"/tmp", "/proc"} | {target for _, target in spec["writable"]}
  for point, flags in _mount_points():
    if point not in keep:
      _at(f"make {point} read-only")
      _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
  os.umask(umask)


def _drop_privileges(spec):
  """Leaves the command no privilege: its own uid under root, no capabilities, no way to gain
  any (no_new_privs), and a SIGKILL when the launcher dies."""
  _at("drop privileges")
  uid, gid = spec["uid"], spec["gid"]
  if uid is None or uid == 0 or gid is None or gid == 0:
    _fail(f"refusing to run a command as uid {uid} / gid {gid}")
  if spec["private_uid"] or spec["userns"]:  # capabilities held: root, or a user namespace's
    with open("/proc/sys/kernel/cap_last_cap") as f:
      last = int(f.read())
    for cap in range(last + 1):
      _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"prctl(CAPBSET_DROP, {cap})")
  if spec["private_uid"]:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
  if 0 in os.getresuid() or 0 in os.getresgid() or os.getuid() != uid:
    _fail(f"the process holds uids {os.getresuid()} and gids {os.getresgid()}, not {uid}")
  _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(CAP_AMBIENT)")
  _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
  # Changing credentials clears the parent-death signal; set it again.
  _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")


def _tasks_of(uid):
  """Processes and threads whose real uid is `uid` (what RLIMIT_NPROC counts)."""
  count = 0
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/status") as f:
          fields = dict(line.split(":", 1) for line in f if ":" in line)
        if int(fields["Uid"].split()[0]) == uid:
          count += int(fields["Threads"])
      except (OSError, KeyError, ValueError):
        pass
  return count


def _apply_rlimits(spec):
  _at("apply the rlimits")
  rlimits = dict(spec["rlimits"])
  if spec["shared_uid_nproc"]:  # the uid's processes, the host's included, plus the allowance
    rlimits["NPROC"] += _tasks_of(os.getuid())
  for name, value in rlimits.items():
    limit = getattr(resource, f"RLIMIT_{name}")
    _, hard = resource.getrlimit(limit)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (value, value))


def _exec(spec):
  _at("start the command")
  os.chdir(spec["cwd"])
  signal.signal(signal.SIGPIPE, signal.SIG_DFL)
  os.execve(spec["argv"][0], spec["argv"], spec["env"])


def _join_groups(spec):
  _at("join the control groups")
  for path in spec["cgroups"]:
    with open(path, "w") as f:
      f.write(str(os.getpid()))


def _map_user(spec):
  """Maps the host's uid and gid to themselves in the new user namespace (nothing else)."""
  _at("map the user")
  for name, content in (("setgroups", "deny"), ("uid_map", f"{spec['uid']} {spec['uid']} 1"),
                        ("gid_map", f"{spec['gid']} {spec['gid']} 1")):
    with open(f"/proc/self/{name}", "w") as f:
      f.write(content)


def _launch(spec):
  """Becomes the launcher of one command: confines and execs it (never returns)."""
  try:
    _join_groups(spec)
  except OSError as e:
    _fail(str(e))
  if not spec["namespaces"]:
    try:
      _drop_privileges(spec)  # a root host never runs an agent's command as root
      _apply_rlimits(spec)
      _exec(spec)
    except OSError as e:
      _fail(str(e))
  _at("unshare namespaces")
  flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
  _check(_libc.unshare(flags | (CLONE_NEWUSER if spec["userns"] else 0)), "unshare")
  if spec["userns"]:
    try:
      _map_user(spec)
    except OSError as e:
      _fail(str(e))
  pid = os.fork()
  if pid == 0:
    try:
      _confine_filesystem(spec)
      _drop_privileges(spec)
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


def _children():
  """This (single-threaded) process's children."""
  try:
    with open(f"/proc/self/task/{os.getpid()}/children") as f:
      return [int(p) for p in f.read().split()]
  except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: read every parent pid
    found = []
    for name in os.listdir("/proc"):
      try:
        with open(f"/proc/{name}/stat") as f:
          if name.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
            found.append(int(name))
      except (OSError, IndexError, ValueError):
        pass
    return found


def _end_orphans(timeout=5.0):
  """Kills and reaps every child of this subreaper (what a finished command left running,
  reparented here), until none is left; returns how many were still there at the deadline."""
  deadline = time.monotonic() + timeout
  while True:
    for pid in _children():
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    try:
      while os.waitpid(-1, os.WNOHANG)[0]:
        pass
    except ChildProcessError:
      return 0
    if time.monotonic() > deadline:
      return max(1, len(_children()))
    time.sleep(0.001)


def _start_launcher(spec, sock, out_fd, report_fd):
  """Forks the command's launcher in its own session, the output pipe as stdout and stderr,
  `report_fd` (close-on-exec) for a failing set-up step."""
  pid = os.fork()
  if pid == 0:
    _report_fd[0] = report_fd
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
  os.close(report_fd)
  return pid


def _serve(sock_fd, host_pid):
  """Launches commands on request, one at a time, so each avoids an interpreter start-up.

  Protocol on a SOCK_SEQPACKET socket: the host sends a spec (JSON) with the write end of the
  output pipe attached (SCM_RIGHTS); the server forks a launcher in its own session with that
  pipe as stdout and stderr, replies with its pid (8 bytes), reaps it, kills what is left of
  its process group and every other process the command left (they are the server's children
  by then), and replies with the wait status, the number of processes it could not end (8 + 4
  + 4 bytes) and what a failing set-up step reported (the rest; empty when none failed).
  """
  import socket  # pylint: disable=g-import-not-at-top
  import struct  # pylint: disable=g-import-not-at-top
  _die_with(host_pid)
  _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
  sock = socket.socket(fileno=sock_fd)
  while True:
    try:
      message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
    except OSError:
      os._exit(0)
    if not message:
      os._exit(0)
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    pid = _start_launcher(json.loads(message), sock, fds[0], report_write)
    sock.sendall(struct.pack("!q", pid))
    while True:  # orphans that end meanwhile are reaped too
      got, status = os.waitpid(-1, 0)
      if got == pid:
        break
    try:
      os.killpg(pid, signal.SIGKILL)  # its process group first (a command without namespaces)
    except OSError:
      pass
    left = _end_orphans()
    os.set_blocking(report_read, False)  # every writer is gone by now; never wait on it
    try:
      report = os.read(report_read, 4096)
    except OSError:
      report = b""
    os.close(report_read)
    sock.sendall(struct.pack("!qii", pid, status, left) + report)


if __name__ == "__main__":
  if sys.argv[1:2] != ["--serve"] or len(sys.argv) != 4:
    sys.exit("usage: _jail.py --serve SOCKET_FD HOST_PID")
  _serve(int(sys.argv[2]), int(sys.argv[3]))
