"""Snapshots of a task directory without git processes: manifests, a stat cache, changed files.

A manifest maps every file of the task directory (regular files and symlinks, those inside a
`.git` directory too) to (git mode, blob id): the blob id is git's, sha1(b"blob <size>\\0" +
content), so the base tree's listing (`git ls-tree -r`, read once per task) is a manifest of
the base. A scan walks the directory and hashes only files whose stat (mode, size, mtime, ctime,
inode) changed since they were last hashed; an entry is trusted only when the file's mtime is
`_RACY_NS` older than its hashing, so a write within the filesystem's timestamp granularity is
never missed (git's "racily clean" rule).

Snapshot bytes (format 2) hold the difference from the base manifest: a header (format, base
tree id, state key, deleted paths, empty directories, `extra`, and (path, mode, length) of every
added or changed file) and the changed files' contents, zlib-compressed. The state key is a
sha1 of the sorted manifest and the empty directories: equal keys, equal files.

A restore scans the directory once, deletes what the target lacks, writes only the files whose
(mode, blob id) differ (base files from a cache filled by one `git cat-file --batch` per miss),
makes and removes empty directories, gives what it wrote to the confined uid, and checks the
result's state key against the snapshot's. Against `git add` + `write-tree` + `diff-tree` per
snapshot and two of them plus `read-tree -u` per restore, no process is started in either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import time
import zlib
from typing import Any, Mapping

from bpo_jax.sandboxes.swe import workspace as workspace_lib

FORMAT = 2
_RACY_NS = 100_000_000  # 0.1 s: well above any filesystem's mtime granularity


def blob_id(content: bytes) -> str:
  """git's id of a blob: sha1(b"blob <len>\\0" + content)."""
  return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def state_key(manifest: Mapping[str, tuple[str, str]], empty_dirs) -> str:
  """sha1 of the sorted manifest and empty directories: a key of the whole file state."""
  h = hashlib.sha1()
  for path in sorted(manifest):
    mode, blob = manifest[path]
    h.update(f"{mode} {blob} {path}\0".encode("utf-8", "surrogateescape"))
  for path in sorted(empty_dirs):
    h.update(f"dir {path}\0".encode("utf-8", "surrogateescape"))
  return h.hexdigest()


@dataclasses.dataclass
class State:
  """A parsed snapshot: changed files (path -> (mode, content)), deleted base paths, empty
  directories, the state key and `extra`."""

  files: dict[str, tuple[str, bytes]]
  deleted: list[str]
  empty_dirs: list[str]
  key: str
  extra: dict[str, Any]


class FileState:
  """The snapshot machinery of one workspace whose base tree is `base_tree`."""

  def __init__(self, ws: workspace_lib.Workspace, base_tree: str):
    self.ws, self.base_tree = ws, base_tree
    self.root = os.path.realpath(ws.workdir)
    self.base: dict[str, tuple[str, str]] = {}
    out = ws.git("ls-tree", "-r", "-z", "--full-tree", base_tree).decode("utf-8",
                                                                         "surrogateescape")
    for record in filter(None, out.split("\0")):
      meta, path = record.split("\t", 1)
      mode, kind, blob = meta.split(" ")
      if kind == "blob":
        self.base[path] = (mode, blob)
    self._hashed: dict[str, tuple[tuple, str, int]] = {}  # path -> (stat key, blob, when)
    self._blobs: dict[str, bytes] = {}  # base blob contents fetched so far

  # -- scanning -------------------------------------------------------------------------------

  def _entry(self, rel: str, full: str, info: os.stat_result) -> tuple[str, str, bytes | None]:
    if stat.S_ISLNK(info.st_mode):
      mode = "120000"
    else:
      mode = "100755" if info.st_mode & 0o100 else "100644"
    key = (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    cached = self._hashed.get(rel)
    if cached and cached[0] == key and info.st_mtime_ns < cached[2] - _RACY_NS:
      return mode, cached[1], None
    now = time.time_ns()
    content = os.readlink(full).encode("utf-8", "surrogateescape") if mode == "120000" else (
        _read(full))
    blob = blob_id(content)
    self._hashed[rel] = (key, blob, now)
    return mode, blob, content

  def _paths(self) -> set[str]:
    """The task directory's files and links (what `scan` hashes), listed without reading."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(self.root):
      rel_dir = os.path.relpath(dirpath, self.root)
      prefix = "" if rel_dir == "." else rel_dir + "/"
      for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
        mode = os.lstat(os.path.join(dirpath, name)).st_mode
        if stat.S_ISREG(mode) or stat.S_ISLNK(mode):  # FIFOs, sockets: not state
          found.add(prefix + name)
    return found

  def scan(self, keep: bool = True
          ) -> tuple[dict[str, tuple[str, str]], list[str], dict[str, bytes]]:
    """(manifest, empty directories, contents read by this scan if `keep`) of the task
    directory. Without `keep` at most one file's content is in memory at a time."""
    manifest, empty, read = {}, [], {}
    for dirpath, dirnames, filenames in os.walk(self.root):
      rel_dir = os.path.relpath(dirpath, self.root)
      prefix = "" if rel_dir == "." else rel_dir + "/"
      links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
      if not dirnames and not filenames and prefix:
        empty.append(rel_dir)
      for name in filenames + links:
        full = os.path.join(dirpath, name)
        info = os.lstat(full)
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
          continue  # FIFOs, sockets: not state
        mode, blob, content = self._entry(prefix + name, full, info)
        manifest[prefix + name] = (mode, blob)
        if content is not None and keep:
          read[prefix + name] = content
    return manifest, sorted(empty), read

  # -- snapshots ------------------------------------------------------------------------------

  def capture(self, extra: Mapping[str, Any]) -> State:
    """The directory's state relative to the base, with `extra`."""
    manifest, empty, read = self.scan()
    files = {}
    for path, entry in manifest.items():
      if self.base.get(path) != entry:
        content = read.get(path)
        if content is None:
          full = os.path.join(self.root, path)
          content = (os.readlink(full).encode("utf-8", "surrogateescape")
                     if entry[0] == "120000" else _read(full))
        files[path] = (entry[0], content)
    deleted = sorted(p for p in self.base if p not in manifest)
    return State(files=files, deleted=deleted, empty_dirs=empty,
                 key=state_key(manifest, empty), extra=dict(extra))

  def pack(self, state: State) -> bytes:
    """Snapshot bytes of `state` (see the module docstring)."""
    paths = sorted(state.files)
    header = json.dumps({
        "format": FORMAT, "base": self.base_tree, "state": state.key,
        "deleted": state.deleted, "empty_dirs": state.empty_dirs, "extra": state.extra,
        "files": [(p, state.files[p][0], len(state.files[p][1])) for p in paths],
    }, sort_keys=True, separators=(",", ":")).encode()
    body = b"".join(state.files[p][1] for p in paths)
    return zlib.compress(len(header).to_bytes(8, "big") + header + body, 1)

  def unpack(self, data: bytes) -> State:
    """The `State` of snapshot bytes of this task (ValueError for another base or format)."""
    header, raw, size = parse(data)
    if header["base"] != self.base_tree:
      raise ValueError(f"snapshot is of base tree {header['base']}, this task's is "
                       f"{self.base_tree}")
    offset, files = 8 + size, {}
    for path, mode, length in header["files"]:
      files[path] = (mode, raw[offset:offset + length])
      offset += length
    return State(files=files, deleted=header["deleted"], empty_dirs=header["empty_dirs"],
                 key=header["state"], extra=header["extra"])

  # -- restoring ------------------------------------------------------------------------------

  def _base_contents(self, paths) -> dict[str, bytes]:
    missing = sorted({self.base[p][1] for p in paths} - set(self._blobs))
    if missing:
      out = self.ws.git("cat-file", "--batch", input="".join(b + "\n" for b in missing).encode())
      offset = 0
      for _ in missing:
        end = out.index(b"\n", offset)
        blob, _, size = out[offset:end].decode().split(" ")
        self._blobs[blob] = out[end + 1:end + 1 + int(size)]
        offset = end + 2 + int(size)
    return {p: self._blobs[self.base[p][1]] for p in paths}

  def _unlink(self, path: str) -> None:
    full = os.path.join(self.root, path)
    parent = os.path.realpath(os.path.dirname(full))
    if parent != self.root and not parent.startswith(self.root + os.sep):
      raise ValueError(f"path {path!r} is outside the task directory")
    if os.path.isdir(full) and not os.path.islink(full):
      shutil.rmtree(full)
    elif os.path.lexists(full):
      os.unlink(full)

  def restore(self, state: State) -> None:
    """Makes the directory hold exactly `state`'s files and empty directories.

    Raises:
      ValueError: the restored state's key differs from the snapshot's (or a path leaves the
        task directory).
    """
    target = {p: e for p, e in self.base.items() if p not in set(state.deleted)}
    target.update({p: (mode, blob_id(c)) for p, (mode, c) in state.files.items()})
    # Files that go are removed unread: a command may have left more (sparse) bytes than a
    # snapshot may hold, and reading them is what the disk limit guards the host against.
    removed = sorted(self._paths() - set(target), reverse=True)
    for path in removed:
      self._unlink(path)
    current, empty, _ = self.scan(keep=False)
    stale = [p for p, e in target.items() if current.get(p) != e]
    from_base = self._base_contents([p for p in stale if p not in state.files])
    writes = [(p, *state.files[p]) if p in state.files else (p, target[p][0], from_base[p])
              for p in stale]
    self.ws.write_files(writes)
    self._prune_empty_dirs(empty + [os.path.dirname(p) for p in removed], set(state.empty_dirs))
    for path in state.empty_dirs:
      os.makedirs(self.ws.resolve(path), exist_ok=True)
    self._give([p for p, _, _ in writes] + list(state.empty_dirs))
    manifest, empty, _ = self.scan(keep=False)
    if state_key(manifest, empty) != state.key:
      raise ValueError(f"restored state {state_key(manifest, empty)} differs from the "
                       f"snapshot's {state.key}")

  def _prune_empty_dirs(self, candidates, keep: set[str]) -> None:
    """Removes each candidate directory, and then its parents, while empty and not kept."""
    for path in sorted(set(candidates), key=len, reverse=True):
      while path and path not in keep:
        full = os.path.join(self.root, path)
        if os.path.isdir(full) and not os.path.islink(full) and not os.listdir(full):
          os.rmdir(full)
          path = os.path.dirname(path)
        else:
          break

  def _give(self, paths) -> None:
    """Gives written paths and the directories above them to the confined uid."""
    uid = self.ws.owner_uid
    if uid is None:
      return
    done = set()
    for path in paths:
      while path and path not in done:
        done.add(path)
        os.lchown(os.path.join(self.root, path), uid, uid)
        path = os.path.dirname(path)


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def parse(data: bytes) -> tuple[dict, bytes, int]:
  """(header, raw bytes, header size) of snapshot bytes; ValueError if they are not ones."""
  try:
    raw = zlib.decompress(data)
    size = int.from_bytes(raw[:8], "big")
    header = json.loads(raw[8:8 + size])
  except (zlib.error, ValueError, TypeError) as e:
    raise ValueError(f"not a SWE sandbox snapshot: {e}") from e
  if not isinstance(header, dict) or header.get("format") != FORMAT:
    raise ValueError(f"not a SWE sandbox snapshot of format {FORMAT}")
  return header, raw, size
