"""Looking through a task directory without running the agent's code: search, a windowed
viewer, and the syntax check of edits.

These run in the sandbox's own process, over the task directory only, and read nothing but
regular files in it that the agent's commands can read too: every path goes through
`Workspace.resolve` (no `..` or symlink out of the directory), walks do not follow links and
skip every link they meet, and files are opened without following a link and without blocking
(a FIFO is refused, never read). Hidden tests and reference patches are never in the task
directory before grading (see sandbox.py), so nothing here can show them.

    find_file <name> [dir]        files whose name matches (a glob pattern: `*.py`, `test_*`)
    search_dir <text> [dir]       files holding the text, with their number of matching lines
    search_file <text> [file]     the lines of one file holding the text (default: the open one)
    open <file> [line]            show the window of the file around `line`
    goto <line>                   move the window of the open file to `line`
    scroll_down / scroll_up       move the window by its height

Arguments are split as a shell splits words (`search_dir "def get(" lrucache`). The viewer's
state (the open file and the first line of its window) is part of the sandbox's state.

The syntax check: an edit (`write`, `replace`) that would leave a `.py` file unparseable, where
the file parsed before (or is new), is refused, the file left unchanged, and the observation
names the line of the error. Parsing uses the host's Python grammar and executes nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import os
import shlex
import stat

MAX_FILE_BYTES = 1 << 20        # bytes of a file that are read, as `view` reads them
MAX_LISTED = 100                # most files (or lines) one search names
SEARCH_COMMANDS = ("find_file", "search_dir", "search_file")
VIEWER_COMMANDS = ("open", "goto", "scroll_down", "scroll_up")


class BrowseError(ValueError):
  """A command's arguments are unusable (the observation says why)."""


@dataclasses.dataclass(frozen=True)
class Viewer:
  """The open file (relative to the task directory) and the first line of its window."""

  path: str | None = None
  first: int = 1

  def to_json(self) -> list:
    return [self.path, self.first]

  @classmethod
  def from_json(cls, value) -> "Viewer":
    return cls(*value) if value else cls()


def split_arguments(argument: str, most: int) -> list[str]:
  """Shell-like words of `argument`; BrowseError if unbalanced or more than `most`."""
  try:
    words = shlex.split(argument)
  except ValueError as e:
    raise BrowseError(f"cannot split the arguments: {e}") from e
  if len(words) > most:
    raise BrowseError(f"takes at most {most} arguments, got {len(words)} (quote text that "
                      "holds spaces)")
  return words


def read_text(full: str) -> str | None:
  """The text of regular file `full` (first MAX_FILE_BYTES, undecodable bytes replaced), or
  None when it is not a regular file. Never follows a final link and never blocks."""
  try:
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
  except OSError:
    return None
  try:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      return None
    with os.fdopen(fd, "rb", closefd=False) as f:
      data = f.read(MAX_FILE_BYTES)
  finally:
    os.close(fd)
  if b"\0" in data[:8192]:
    return None  # binary: not searched, not shown
  return data.decode("utf-8", errors="replace")


def walk_files(root: str, top: str) -> list[str]:
  """Regular files under `top` (absolute, inside `root`), relative to `root`, sorted; links are
  neither followed nor listed."""
  found = []
  for dirpath, dirnames, filenames in os.walk(top):
    dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
    for name in sorted(filenames):
      full = os.path.join(dirpath, name)
      if stat.S_ISREG(os.lstat(full).st_mode):
        found.append(os.path.relpath(full, root))
  return found


def _shown(root: str, full: str) -> str:
  rel = os.path.relpath(full, root)
  return "./" if rel == "." else rel


def _count(n: int, noun: str) -> str:
  return f"{n} {noun}" + ("" if n == 1 else "s")


def find_file(root: str, top: str, pattern: str) -> str:
  """Files under `top` whose name matches glob `pattern`."""
  matches = [p for p in walk_files(root, top) if fnmatch.fnmatchcase(os.path.basename(p), pattern)]
  head = f'{_count(len(matches), "file")} named "{pattern}" in {_shown(root, top)}'
  if not matches:
    return head
  if len(matches) > MAX_LISTED:
    head += f"; the first {MAX_LISTED}"
  return head + ":\n" + "\n".join(matches[:MAX_LISTED])


def search_dir(root: str, top: str, text: str) -> str:
  """Files under `top` holding `text`, each with its number of matching lines."""
  counts = []
  for path in walk_files(root, top):
    content = read_text(os.path.join(root, path))
    if content is not None and text in content:
      counts.append((path, sum(text in line for line in content.splitlines())))
  total = sum(n for _, n in counts)
  head = (f'{_count(total, "line")} holding "{text}" in {_count(len(counts), "file")} in '
          f"{_shown(root, top)}")
  if not counts:
    return head
  if len(counts) > MAX_LISTED:
    head += f"; the first {MAX_LISTED} files"
  return head + ":\n" + "\n".join(f"{p} ({n})" for p, n in counts[:MAX_LISTED])


def search_file(root: str, full: str, text: str) -> str:
  """The lines of file `full` holding `text`, with their numbers."""
  content = read_text(full)
  name = _shown(root, full)
  if content is None:
    return f"{name} is not a text file."
  hits = [(i, line) for i, line in enumerate(content.splitlines(), 1) if text in line]
  head = f'{_count(len(hits), "line")} holding "{text}" in {name}'
  if not hits:
    return head
  if len(hits) > MAX_LISTED:
    head += f"; the first {MAX_LISTED}"
  return head + ":\n" + "\n".join(f"{i}:{line}" for i, line in hits[:MAX_LISTED])


def window(root: str, viewer: Viewer, height: int) -> tuple[str, Viewer]:
  """The viewer's window of its file with line numbers, and the viewer with its first line
  clamped to the file (the last window of a file ends at its last line)."""
  full = os.path.join(root, viewer.path)
  content = read_text(full)
  if content is None:
    raise BrowseError(f"{viewer.path} is no longer a text file")
  lines = content.splitlines()
  first = max(1, min(viewer.first, len(lines) - height + 1))
  last = min(len(lines), first + height - 1)
  shown = [f"[File: {viewer.path} ({len(lines)} lines total)]"]
  shown.append(f"({first - 1} more lines above)")
  shown += [f"{i}:{lines[i - 1]}" for i in range(first, last + 1)]
  shown.append(f"({len(lines) - last} more lines below)")
  return "\n".join(shown), Viewer(viewer.path, first)


def centred(line: int, height: int) -> int:
  """The first line of a window of `height` lines that shows `line` near its middle."""
  return max(1, line - height // 2)


def syntax_error(path: str, before: bytes | None, after: bytes) -> str | None:
  """Why the edit of `.py` file `path` from `before` (None: a new file) to `after` is refused,
  naming the line of the error; None when it is allowed (not a `.py` file, parses, or did not
  parse before either)."""
  if not path.endswith(".py"):
    return None
  error = _parse_error(after)
  if error is None or (before is not None and _parse_error(before) is not None):
    return None
  return f"the edit leaves {path} unparseable: {error}"


def _parse_error(source: bytes) -> str | None:
  try:
    compile(source, "<edit>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
  except SyntaxError as e:
    where = f"line {e.lineno}" if e.lineno else "an unknown line"
    text = (e.text or "").rstrip("\n")
    return f"{e.msg} at {where}" + (f":\n{text}" if text.strip() else "")
  except (ValueError, MemoryError, RecursionError) as e:  # NUL bytes, too deeply nested
    return f"{type(e).__name__}: {e}"
  return None
