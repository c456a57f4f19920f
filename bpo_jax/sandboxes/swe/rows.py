"""Checks of an instance row against its repository, made once per row content at load.

A row whose fields have the right types (`tasks.normalize_instance`) can still be unusable: a
reference fix (`patch`) that does not apply at `base_commit` gives no expert and no proof that
the task can be solved; a `test_patch` that does not apply would make every grade "not
resolved"; a `log_parser` that swebench does not have crashes every grade; and a FAIL_TO_PASS
test the repository does not hold after the test patch can never pass. `check_row` tests these
before any episode, in one line naming the row and the field:

  * both patches with `git apply --cached` onto a temporary index of the base tree, whose new
    objects go to a temporary object directory (the clone's own store is an alternate), so the
    clone is read and never written;
  * each FAIL_TO_PASS id located in that index: a pytest id `path::Name[...]` needs the file
    `path` holding the word `Name` (the function or class the file defines or imports); a
    unittest id `name (module.Class)` or a bare `name` needs the word `name` in the test
    patch's files or, failing that, anywhere in the tree; other ids (a test's docstring line, as
    Django prints them) cannot be located and are not checked.

A row's result is kept per content (the repository, the base, both patches, the tests and the
parser, hashed), so the train and test splits of one file are checked once per process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
from typing import Any, Callable, Mapping, Sequence

from bpo_jax.sandboxes import base

_BARE = re.compile(r"^(\w+)$")
_UNITTEST = re.compile(r"^(\w+) \([\w.]+\)$")
_WORD = re.compile(r"^\w+$")
_PY_FILE = re.compile(r"^[\w./-]+\.py$")
_checked: set[str] = set()
_lock = threading.Lock()


def locate(test_id: str) -> tuple[str | None, str | None]:
  """(file, name) that a test id names: "a/t.py::C::f[x]" -> ("a/t.py", "C"); "a/t.py" ->
  ("a/t.py", None); "f (m.C)" -> (None, "f"); "f" -> (None, "f"); an id of another form ->
  (None, None)."""
  if "::" in test_id:
    parts = test_id.split("[", 1)[0].split("::")
    name = parts[1] if len(parts) > 1 and _WORD.match(parts[1]) else None
    return parts[0], name
  if _PY_FILE.match(test_id):
    return test_id, None
  match = _UNITTEST.match(test_id) or _BARE.match(test_id)
  return (None, match.group(1)) if match else (None, None)


def check_log_parser(instance: Mapping[str, Any], where: str) -> None:
  """The row's `log_parser` is one of swebench's parsers."""
  try:
    from swebench.harness.log_parsers import PARSER_REGISTRY  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise base.TaskInputError(f"SWE-bench instances need swebench for their log parsers and "
                              f"report ({e}): pip install 'bpo_jax[swe]'") from None
  if instance["log_parser"] not in PARSER_REGISTRY:
    close = sorted(p for p in PARSER_REGISTRY if p.startswith("parse_log_pytest"))
    raise base.TaskInputError(f"{where}: field log_parser: swebench has no parser "
                              f"{instance['log_parser']!r} (e.g. {', '.join(close[:3])})")


def _content_key(git_dir: str, base_rev: str, instance: Mapping[str, Any]) -> str:
  blob = json.dumps([os.path.realpath(git_dir), base_rev, instance["patch"],
                     instance["test_patch"], instance["FAIL_TO_PASS"], instance["log_parser"]])
  return hashlib.sha256(blob.encode("utf-8", errors="surrogatepass")).hexdigest()


def _git_runner(git_dir: str, scratch: str) -> Callable[..., subprocess.CompletedProcess]:
  """Runs git on `git_dir` with a private index and object directory under `scratch`."""
  objects = os.path.join(scratch, "objects")
  os.makedirs(objects)
  env = {**os.environ, "GIT_DIR": git_dir, "GIT_INDEX_FILE": os.path.join(scratch, "index"),
         "GIT_OBJECT_DIRECTORY": objects,
         "GIT_ALTERNATE_OBJECT_DIRECTORIES": os.path.join(git_dir, "objects"),
         "GIT_LITERAL_PATHSPECS": "1", "GIT_CONFIG_NOSYSTEM": "1",
         "GIT_CONFIG_GLOBAL": os.devnull}

  def git(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.quotePath=false", *args],
                          input=None if stdin is None else stdin.encode("utf-8", "surrogateescape"),
                          capture_output=True, env=env)
  return git


def _first_line(proc: subprocess.CompletedProcess) -> str:
  text = proc.stderr.decode(errors="replace").strip()
  return text.splitlines()[0] if text else f"git exit status {proc.returncode}"


def _patched_paths(patch: str) -> list[str]:
  return list(dict.fromkeys(re.findall(r"^\+\+\+ b/(\S+)", patch, re.M)))


def _words_in(git, names: Sequence[str], paths: Sequence[str] | None) -> set[tuple[str, str]]:
  """(file, word) for each of `names` found as a whole word in the index (in `paths` only, when
  given)."""
  if not names or paths == []:
    return set()
  args = ["grep", "--cached", "-I", "-o", "-w", "-F", "-z"]
  for name in names:
    args += ["-e", name]
  proc = git(*args, "--", *(paths or []))
  if proc.returncode not in (0, 1):
    raise base.TaskInputError(f"git grep failed: {_first_line(proc)}")
  found = set()
  for line in proc.stdout.decode("utf-8", errors="replace").splitlines():
    path, _, word = line.partition("\0")
    found.add((path, word))
  return found


def missing_tests(git, tests: Sequence[str], test_patch: str) -> list[str]:
  """The ids of `tests` that the index does not hold (see the module docstring)."""
  located = [(t, *locate(t)) for t in tests]
  files = sorted({f for _, f, _ in located if f})
  existing = set(git("ls-files", "--cached", "-z", "--", *files).stdout.decode(
      errors="replace").split("\0")) - {""} if files else set()
  names = sorted({n for _, _, n in located if n})
  # The files the ids name and those the test patch wrote: where the tests almost always are.
  found = _words_in(git, names, sorted(set(files) | set(_patched_paths(test_patch))))
  unplaced = sorted({n for _, f, n in located if n and not f and
                     not any(w == n for _, w in found)})
  found |= _words_in(git, unplaced, None)
  missing = []
  for test, path, name in located:
    if path is not None:
      ok = path in existing and (name is None or (path, name) in found)
    else:
      ok = name is None or any(w == name for _, w in found)
    if not ok:
      missing.append(test)
  return missing


def check_row(instance: Mapping[str, Any], git_dir: str, base_rev: str, where: str) -> None:
  """Checks a normalized row against the repository at `git_dir` (a git directory holding
  `base_rev`, a commit or tree id): the log parser, both patches, the FAIL_TO_PASS tests.

  Raises:
    base.TaskInputError: one line, `where` and the field at fault.
  """
  check_log_parser(instance, where)
  key = _content_key(git_dir, base_rev, instance)
  with _lock:
    if key in _checked:
      return
  with tempfile.TemporaryDirectory(prefix="bpo_swe_rowcheck_") as scratch:
    git = _git_runner(git_dir, scratch)
    proc = git("read-tree", base_rev)
    if proc.returncode:
      raise base.TaskInputError(f"{where}: field base_commit: {base_rev} cannot be read from "
                                f"{git_dir}: {_first_line(proc)}")
    proc = git("apply", "--cached", "--check", "-", stdin=instance["patch"])
    if proc.returncode:
      raise base.TaskInputError(f"{where}: field patch: does not apply at the base commit "
                                f"({_first_line(proc)})")
    proc = git("apply", "--cached", "-", stdin=instance["test_patch"])
    if proc.returncode:
      raise base.TaskInputError(f"{where}: field test_patch: does not apply at the base commit "
                                f"({_first_line(proc)})")
    missing = missing_tests(git, instance["FAIL_TO_PASS"], instance["test_patch"])
  if missing:
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    raise base.TaskInputError(f"{where}: field FAIL_TO_PASS: {', '.join(missing[:3])}{more} not "
                              "found in the repository after the test patch")
  with _lock:
    _checked.add(key)


@functools.lru_cache(maxsize=None)
def git_dir_of(repository: str) -> str:
  """The git directory that holds a clone's objects (its .git, itself when bare, the main
  repository's for a linked worktree); asked once per clone."""
  proc = subprocess.run(["git", "-c", "safe.directory=*", "-C", repository, "rev-parse",
                         "--path-format=absolute", "--git-common-dir"], capture_output=True)
  if proc.returncode:
    raise base.TaskInputError(f"{repository} is not a git repository: {_first_line(proc)}")
  return proc.stdout.decode().strip()
