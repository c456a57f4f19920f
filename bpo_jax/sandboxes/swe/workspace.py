"""A task directory tracked by a private git repository: trees and diffs.

The working directory holds only the task's files; the git directory lives beside it, outside
the confinement's writable area, so commands can neither read nor rewrite history. Every git
call uses a private index and ignores user/system configuration and `.gitignore` rules (`add
--force`), so the tree of the working directory is exactly its files. A tree id (`git
write-tree`) is an exact key of the file state: equal trees, equal files. Snapshots of the
directory are made without git processes (filestate.py).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import weakref
from typing import Iterable, Mapping

# Fixed identity and time: the commit id of a tree is then a pure function of the tree.
_COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "bpo_jax", "GIT_AUTHOR_EMAIL": "tasks@bpo-jax.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000", "GIT_COMMITTER_NAME": "bpo_jax",
    "GIT_COMMITTER_EMAIL": "tasks@bpo-jax.invalid",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
}


class GitError(RuntimeError):
  """A git command failed; the message holds its output."""


class Workspace:
  """A working directory and its private git directory under one parent directory."""

  def __init__(self, parent: str, owner_uid: int | None = None):
    self.parent = parent
    # Removes the directories when the workspace is closed, collected, or the interpreter exits.
    self._cleanup = weakref.finalize(self, shutil.rmtree, parent, True)
    self.workdir = os.path.join(parent, "work")
    self.gitdir = os.path.join(parent, "git")
    self.owner_uid = owner_uid
    os.makedirs(self.workdir, exist_ok=True)
    if not os.path.isdir(self.gitdir):
      self.git("init", "--quiet", "--bare", "--initial-branch=main", self.gitdir,
               work_tree=False)
      # Not bare: commands that get read-only access to it use the task directory as work tree.
      self.git("--git-dir", self.gitdir, "config", "core.bare", "false", work_tree=False)
    self.agent_index = os.path.join(self.gitdir, "agent_index")
    self._env = dict(
        os.environ, GIT_DIR=self.gitdir, GIT_WORK_TREE=self.workdir,
        GIT_INDEX_FILE=os.path.join(self.gitdir, "bpo_index"), GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0", **_COMMIT_ENV)

  def git(self, *args: str, input: bytes | None = None, work_tree: bool = True,
          env: Mapping[str, str] | None = None, check: bool = True) -> bytes:
    """Runs git on this workspace and returns its stdout."""
    base = ["git", "-c", "safe.directory=*", "-c", "core.autocrlf=false", "-c",
            "core.fileMode=true", "-c", "core.symlinks=true", "-c", "gc.auto=0"]
    run_env = dict(self._env if work_tree else os.environ, **(env or {}))
    proc = subprocess.run(base + list(args), input=input, capture_output=True, env=run_env,
                          cwd=self.workdir if work_tree else None)
    if check and proc.returncode != 0:
      raise GitError(f"git {' '.join(args)} failed ({proc.returncode}): "
                     f"{proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout

  # -- trees ------------------------------------------------------------------------------

  def write_tree(self) -> str:
    """Stages every file of the working directory (ignore rules off) and returns its tree id."""
    self.git("add", "--all", "--force", ".")
    return self.git("write-tree").decode().strip()

  def commit(self, tree: str, message: str = "base") -> str:
    """A commit of `tree` with fixed author and time: the same tree gives the same id."""
    return self.git("commit-tree", tree, "-m", message).decode().strip()

  def set_head(self, tree: str) -> str:
    """Makes HEAD (branch main) a commit of `tree` and `agent_index` an index of it.

    Commands see this repository read-only (see sandbox.py), so `git diff` / `git status` show
    their changes against `tree`. Returns the commit id (a function of the tree alone).
    """
    commit = self.commit(tree)
    self.git("update-ref", "refs/heads/main", commit)
    self.git("symbolic-ref", "HEAD", "refs/heads/main")
    self.git("read-tree", tree, env={"GIT_INDEX_FILE": self.agent_index})
    return commit

  def checkout_tree(self, tree: str) -> None:
    """Makes the working directory hold exactly `tree` (files not in it are removed)."""
    self.write_tree()
    self.git("read-tree", "--reset", "-u", tree)
    self._remove_untracked()
    self.fix_ownership()

  def discard_changes(self, tree: str) -> None:
    """Makes the working directory hold exactly `tree` again, like `checkout_tree`, but stores
    nothing of its current files: what commands wrote since leaves no object in the git
    directory for a later command to read (grading puts the hidden tests back this way).
    Files untracked by the current index go first: what commands wrote may have filled the disk
    that git needs for the index."""
    self._remove_untracked()
    self.git("read-tree", "--reset", tree)
    self._remove_untracked()
    self.git("checkout-index", "--all", "--force")
    self.fix_ownership()

  def diff(self, base_tree: str, tree: str) -> str:
    """The unified diff (git format, binary-safe) from `base_tree` to `tree`."""
    return self.git("diff-tree", "-p", "--binary", "--no-renames", "--full-index", base_tree,
                    tree).decode("utf-8", errors="replace")

  def changed_paths(self, base_tree: str, tree: str) -> list[tuple[str, str, str]]:
    """(status A/M/D/T, mode, path) of each path that differs between two trees."""
    out = self.git("diff-tree", "-r", "-z", "--no-renames", base_tree, tree).decode()
    fields = out.split("\0")
    entries = []
    for i in range(0, len(fields) - 1, 2):
      meta, path = fields[i], fields[i + 1]
      _, new_mode, _, _, status = meta.lstrip(":").split(" ")
      entries.append((status, new_mode, path))
    return entries

  # -- files ------------------------------------------------------------------------------

  def write_files(self, files: Iterable[tuple[str, str, bytes]]) -> None:
    """Writes (path, git mode, content) entries into the working directory."""
    for path, mode, content in files:
      target = self.resolve(path)
      os.makedirs(os.path.dirname(target), exist_ok=True)
      if os.path.lexists(target):
        if os.path.isdir(target) and not os.path.islink(target):
          shutil.rmtree(target)
        else:
          os.unlink(target)
      if mode == "120000":
        os.symlink(content.decode(), target)
      else:
        with open(target, "wb") as f:
          f.write(content)
        os.chmod(target, 0o755 if mode == "100755" else 0o644)

  def resolve(self, path: str) -> str:
    """The absolute path of `path` inside the working directory; ValueError if it leaves it.

    Symlinks are resolved, so a link pointing outside cannot be used to reach host files.
    """
    if not path or "\0" in path:
      raise ValueError("empty path" if not path else "path contains a NUL character")
    root = os.path.realpath(self.workdir)
    full = os.path.normpath(os.path.join(root, path))
    parent_real = os.path.realpath(os.path.dirname(full))
    real = os.path.join(parent_real, os.path.basename(full))
    if os.path.islink(real):
      real = os.path.realpath(real)
    if real != root and not real.startswith(root + os.sep):
      raise ValueError(f"path {path!r} is outside the task directory")
    return real

  def _remove_untracked(self) -> None:
    tracked = set(self.git("ls-files", "-z").decode().split("\0")) - {""}
    for dirpath, dirnames, filenames in os.walk(self.workdir, topdown=False):
      for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
        full = os.path.join(dirpath, name)
        if os.path.relpath(full, self.workdir) not in tracked:
          os.unlink(full)
      for name in dirnames:
        full = os.path.join(dirpath, name)
        if not os.path.islink(full) and os.path.isdir(full) and not os.listdir(full):
          os.rmdir(full)

  def fix_ownership(self) -> None:
    """Gives the working directory to the confined uid, so commands can edit the files."""
    if self.owner_uid is None:
      return
    uid = self.owner_uid
    os.lchown(self.workdir, uid, uid)
    for dirpath, dirnames, filenames in os.walk(self.workdir):
      for name in dirnames + filenames:
        os.lchown(os.path.join(dirpath, name), uid, uid)

  def close(self) -> None:
    self._cleanup()


def extract_commit(clone: str, commit: str, target: str) -> None:
  """Writes the files of `commit` of the git repository `clone` into `target` (git archive).

  Raises:
    GitError: the clone lacks the commit.
  """
  proc = subprocess.run(["git", "-c", "safe.directory=*", "-C", clone, "archive", "--format=tar",
                         commit], capture_output=True)
  if proc.returncode != 0:
    raise GitError(f"cannot check out {commit} from {clone}: "
                   f"{proc.stderr.decode(errors='replace').strip()}")
  with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as archive:
    archive.extractall(target, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
