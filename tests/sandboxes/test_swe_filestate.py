"""Snapshots of a task directory without git (filestate.py): exact round trips, git's ids."""

import hashlib
import os

import pytest

from bpo_jax.sandboxes.swe import filestate
from bpo_jax.sandboxes.swe import workspace as workspace_lib

BASE = [("pkg/__init__.py", "100644", b"x = 1\n"), ("pkg/run.sh", "100755", b"#!/bin/sh\n"),
        ("docs/a.txt", "100644", b"alpha\n"), ("link", "120000", b"pkg/__init__.py")]


@pytest.fixture
def ws(tmp_path):
  ws = workspace_lib.Workspace(str(tmp_path / "ws"))
  ws.write_files(BASE)
  return ws


def _edit(workdir):
  """Edits of every kind: change, exec bit, delete, file <-> directory, links, empty and nested
  .git directories."""
  open(os.path.join(workdir, "pkg/__init__.py"), "w").write("x = 2\n")
  os.chmod(os.path.join(workdir, "docs/a.txt"), 0o755)
  os.unlink(os.path.join(workdir, "pkg/run.sh"))
  os.unlink(os.path.join(workdir, "link"))
  os.makedirs(os.path.join(workdir, "link/inner"))
  open(os.path.join(workdir, "link/inner/f"), "wb").write(b"\x00\xff")
  os.symlink("docs", os.path.join(workdir, "docs_link"))
  os.makedirs(os.path.join(workdir, "empty/deeper"))
  os.makedirs(os.path.join(workdir, "sub/.git"))
  open(os.path.join(workdir, "sub/.git/HEAD"), "w").write("ref: refs/heads/main\n")


def _listing(root):
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      full = os.path.join(dirpath, name)
      rel = os.path.relpath(full, root)
      if os.path.islink(full):
        out[rel] = ("link", os.readlink(full))
      elif os.path.isdir(full):
        out[rel] = ("dir",)
      else:
        out[rel] = (oct(os.stat(full).st_mode & 0o777), open(full, "rb").read())
  return out


def test_blob_id_is_gits(ws):
  assert filestate.blob_id(b"x = 1\n") == hashlib.sha1(b"blob 6\0x = 1\n").hexdigest()
  assert filestate.blob_id(b"alpha\n") == ws.git("hash-object", "--stdin",
                                                 input=b"alpha\n").decode().strip()


def test_round_trip_is_exact_in_this_and_a_fresh_workspace(ws, tmp_path):
  base_tree = ws.write_tree()
  files = filestate.FileState(ws, base_tree)
  base_listing, base_key = _listing(ws.workdir), files.capture({}).key
  _edit(ws.workdir)
  edited, edited_tree = _listing(ws.workdir), ws.write_tree()
  state = files.capture({"steps": 3})
  assert sorted(state.files) == ["docs/a.txt", "docs_link", "link/inner/f", "pkg/__init__.py",
                                 "sub/.git/HEAD"]
  assert state.deleted == ["link", "pkg/run.sh"] and state.empty_dirs == ["empty/deeper"]
  data = files.pack(state)
  files.restore(filestate.State(files={}, deleted=[], empty_dirs=[], key=base_key, extra={}))
  assert _listing(ws.workdir) == base_listing
  files.restore(files.unpack(data))
  assert _listing(ws.workdir) == edited and ws.write_tree() == edited_tree
  other = workspace_lib.Workspace(str(tmp_path / "other"))
  other.write_files(BASE)
  fresh = filestate.FileState(other, other.write_tree())
  restored = fresh.unpack(data)
  fresh.restore(restored)
  assert restored.extra == {"steps": 3} and _listing(other.workdir) == edited
  assert files.pack(files.capture({"steps": 3})) == data  # bytes are a function of the state


def test_unchanged_files_are_not_reread_and_a_same_size_same_mtime_write_is_seen(ws,
                                                                               monkeypatch):
  files = filestate.FileState(ws, ws.write_tree())
  path = os.path.join(ws.workdir, "docs/a.txt")
  for name in ("docs/a.txt", "pkg/__init__.py", "pkg/run.sh"):  # written long ago
    os.utime(os.path.join(ws.workdir, name), ns=(10**18, 10**18))
  first = files.capture({})
  reads = []
  original = filestate._read
  monkeypatch.setattr(filestate, "_read", lambda p: reads.append(p) or original(p))
  assert files.capture({}).key == first.key and reads == []  # the stat cache answered
  stamp = os.stat(path)
  open(path, "w").write("omega\n")  # same size
  os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # and the same mtime
  second = files.capture({})
  assert first.key != second.key and second.files["docs/a.txt"] == ("100644", b"omega\n")


def test_other_bases_and_bytes_are_refused(ws, tmp_path):
  files = filestate.FileState(ws, ws.write_tree())
  other = workspace_lib.Workspace(str(tmp_path / "other"))
  other.write_files(BASE[:1])
  with pytest.raises(ValueError, match="snapshot is of base tree"):
    filestate.FileState(other, other.write_tree()).unpack(files.pack(files.capture({})))
  with pytest.raises(ValueError, match="not a SWE sandbox snapshot"):
    files.unpack(b"junk")
