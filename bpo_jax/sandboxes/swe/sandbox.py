"""The SWE sandbox: fix a repository until its tests pass, graded by swebench.

Actions (one per step; the first word is the command):

    run <shell command>              run it in the task directory, confined (see confinement.py)
    view <path> [first [last]]       a file with line numbers (or a directory listing)
    find_file <name> [dir]           files whose name matches a glob pattern (browse.py)
    search_dir <text> [dir]          files holding the text
    search_file <text> [file]        lines of a file holding the text (default: the open file)
    open <file> [line]               a window of `window_lines` lines of the file, around line
    goto <line> / scroll_down / scroll_up    move the open file's window
    write <path>                     replace the file with the text on the following lines
    <text>
    replace <path>                   replace one exact occurrence of SEARCH text by REPLACE text
    <<<<<<< SEARCH
    <old lines>
    =======
    <new lines>
    >>>>>>> REPLACE
    submit                           end the episode; the task directory is graded

An edit (`write`, `replace`) that would leave a Python file unparseable is refused and the file
left as it was; the observation names the line of the error (browse.syntax_error).

The task's test patch (its hidden tests) is applied only when grading: before submit the task
directory, its git history and the viewer hold the repository at its base commit alone, as
SWE-bench requires. `show_tests=True` applies it at reset instead, for a setting where the agent
may read the tests it is graded by.

Commands run confined (confinement.py) in the task directory, which they see at /tmp/task. In the
mode "namespaces" (the default) they see nothing else of the host but the interpreter and the
system's files: not the package's shipped task data (instances, reference patches, hidden
tests), not the host's other directories or its /tmp; the task's repository is readable there
(HEAD = the state after reset), so `git diff`, `git status` and `git checkout -- <file>` work,
while commits do not (it is read-only). Without root the same holds, in a user namespace, where
the kernel allows unprivileged ones. A host that cannot give namespaces fails the sandbox's
construction unless it is built with `confinement="rlimits-only"` (commands then see the host's
files; under root they run as an unprivileged uid). The sandbox logs which protections its
commands get when it is built, and one line per thing they are not protected against
(`protections` holds them; `protections_record` in the package gives the same, with the
sentences, for a run's config.json).

Reward is 1.0 on the final step if the graded state resolves the task (every FAIL_TO_PASS and
PASS_TO_PASS test passes under swebench's report), else 0.0; every other step gives 0.0. After
`max_steps` steps the episode ends truncated and is graded the same way. The final Step's
`info["success"]` is the grade and `info["report"]` swebench's per-test report. A step whose
command or grading cannot run for the infrastructure's sake (`confinement.ConfinementError`,
`grading.GradingError`: tests that cannot start, a log without the harness's markers, a
crashed grader, a git or OS error such as a full disk, a test patch that does not apply)
raises instead: the pool fails the branch with the reason, never a reward.

State = the task directory's files (a manifest of git blob ids; see filestate.py) + step count +
whether the episode is over + the last observation + the viewer (the open file and its window's
first line). Snapshots pack the files changed since the base as bytes any process can restore,
made and restored without a git process; they also name the task, so a fresh sandbox restores
without a reset. Not part of the state: wall-clock time and file times (commands that print
them, e.g. `date`, `ls -l`, pytest's
durations, differ between replays), special files (FIFOs, sockets), and, without namespaces,
the host path of the task directory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
import threading
import uuid
from typing import Any, Mapping

from absl import logging

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes.swe import browse
from bpo_jax.sandboxes.swe import confinement as confinement_lib
from bpo_jax.sandboxes.swe import envs as envs_lib
from bpo_jax.sandboxes.swe import filestate
from bpo_jax.sandboxes.swe import grading
from bpo_jax.sandboxes.swe import tasks as tasks_lib
from bpo_jax.sandboxes.swe import workspace as workspace_lib

HELP = """Commands (one per action):
  run <shell command>     (git diff / git status show your changes)
  view <path> [first_line [last_line]]
  find_file <name> [dir]  (name: a glob pattern such as "*.py")
  search_dir <text> [dir] (quote text with spaces: search_dir "def get(" src)
  search_file <text> [file]
  open <file> [line]      (then goto <line>, scroll_down, scroll_up)
  write <path>            (new file content on the following lines)
  replace <path>          (then <<<<<<< SEARCH / old / ======= / new / >>>>>>> REPLACE)
  submit"""
_MAX_LISTED_FILES = 100  # files named in the first observation
# Commands see the task's repository read-only: HEAD is the state after reset, so `git diff`,
# `git status`, `git log` and `git checkout -- <file>` work; commits and `git add` do not.
_GIT_DIR, _GIT_INDEX = "/tmp/task.git", "/tmp/task.index"
_GIT_ENV = {
    "GIT_DIR": _GIT_DIR, "GIT_WORK_TREE": confinement_lib.CONFINED_WORKDIR,
    "GIT_INDEX_FILE": _GIT_INDEX, "GIT_PAGER": "cat", "PAGER": "cat",
    # The repository belongs to the host's user; git would refuse it as "dubious ownership".
    "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
}
_TASK_OPTIONS = frozenset({"instances", "eval_instances", "repos_dir", "envs_dir", "specs"})
_SEARCH, _DIVIDER, _REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"


def _task_descriptor(task: tasks_lib.SweTask) -> dict[str, Any]:
  """JSON-able description of a task that restores it in any process."""
  shipped = task.instance.get("repo", "").startswith("bpo_jax/") and task.files
  if shipped:
    name = task.instance["repo"].split("/", 1)[1]
    if name in tasks_lib.shipped_task_names() and tasks_lib.load_shipped_task(name) == task:
      return {"shipped": name}
  return {"instance": dict(task.instance), "git_source": task.git_source, "task_id": task.task_id,
          "files": [(p, m, base64.b64encode(c).decode()) for p, m, c in task.files],
          "envs_dir": task.envs_dir}


def _task_from_descriptor(descriptor: Mapping[str, Any]) -> tasks_lib.SweTask:
  if "shipped" in descriptor:
    return tasks_lib.load_shipped_task(descriptor["shipped"])
  return tasks_lib.SweTask(
      task_id=descriptor["task_id"], instance=tasks_lib.normalize_instance(descriptor["instance"]),
      files=tuple((p, m, base64.b64decode(c)) for p, m, c in descriptor["files"]),
      git_source=descriptor["git_source"], envs_dir=descriptor.get("envs_dir"))


class SweSandbox:
  """Implements `base.Sandbox` for `tasks.SweTask`s.

  Args:
    limits: `confinement.Limits` (or a dict of its fields) for `run` commands.
    grading_limits: limits for the test run at grading.
    max_steps: steps before the episode ends truncated (and is graded).
    show_tests: apply the task's test patch at reset, so the tests that grade are in the task
      directory before submit. Off by default: SWE-bench hides them from the agent (grading
      resets and applies them either way). Snapshots restore only into sandboxes with the same
      setting.
    max_view_lines: most lines one `view` shows.
    window_lines: the height of the `open` viewer's window.
    root: where task directories are made (default: the system temp directory).
    confinement: how commands are confined, one of `confinement.MODES`: "namespaces" (raises
      `confinement.ConfinementError` where the host cannot give them) or "rlimits-only".
    **task_options: the options that select real instances (instances.OPTIONS: `instances`,
      `repos_dir`, `envs_dir`, ...), read by `make_tasks` (one options dict configures both);
      accepted and ignored here: a task carries its own environment.
  """

  def __init__(self, limits: confinement_lib.Limits | Mapping[str, Any] | None = None,
               grading_limits: confinement_lib.Limits | Mapping[str, Any] | None = None,
               max_steps: int = 30, show_tests: bool = False, max_view_lines: int = 200,
               window_lines: int = 100, root: str | None = None,
               confinement: str = "namespaces", **task_options):
    unknown = set(task_options) - _TASK_OPTIONS
    if unknown:
      raise TypeError(f"SweSandbox got unknown options: {', '.join(sorted(unknown))}")
    self.limits = _limits(limits, confinement_lib.Limits())
    self.grading_limits = _limits(grading_limits, grading.GRADING_LIMITS)
    if not isinstance(max_steps, int) or max_steps < 1:
      raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    if not isinstance(max_view_lines, int) or max_view_lines < 1:
      raise ValueError(f"max_view_lines must be a positive integer, got {max_view_lines!r}")
    if not isinstance(window_lines, int) or window_lines < 1:
      raise ValueError(f"window_lines must be a positive integer, got {window_lines!r}")
    self.max_steps = max_steps
    self.show_tests = bool(show_tests)
    self.max_view_lines = max_view_lines
    self.window_lines = window_lines
    self.root = root
    self.confinement = confinement
    self.protections = dict(confinement_lib.protections(confinement))
    self._namespaces = confinement == "namespaces"
    _log_protections(confinement, self.protections)
    self.uid = confinement_lib.default_uid() if self.protections["unprivileged_uid"] else None
    self._ws: workspace_lib.Workspace | None = None
    self._ws_token = ""
    self._task: tasks_lib.SweTask | None = None
    self._env: envs_lib.PythonEnv | None = None
    self._files: filestate.FileState | None = None
    self._descriptor: dict[str, Any] = {}
    self._base_tree = ""
    self._start_tree = ""
    self._steps = 0
    self._done = False
    self._last_observation = ""
    self._viewer = browse.Viewer()

  # -- protocol ---------------------------------------------------------------------------

  def reset(self, task: tasks_lib.SweTask) -> str:
    if not isinstance(task, tasks_lib.SweTask):
      raise TypeError(f"reset needs a SweTask, got {type(task).__name__}")
    if self._ws is None or task != self._task:
      self._load_task(task)
    self._ws.checkout_tree(self._start_tree)
    self._steps, self._done = 0, False
    self._viewer = browse.Viewer()
    files = self._ws.git("ls-files").decode().splitlines()
    if len(files) > _MAX_LISTED_FILES:
      files = files[:_MAX_LISTED_FILES] + [f"... and {len(files) - _MAX_LISTED_FILES} more"]
    self._last_observation = (
        f"Fix the issue below in the repository in your working directory.\n\n"
        f"Issue:\n{task.problem_statement.strip()}\n\nFiles:\n" + "\n".join(files) +
        f"\n\nTests run with: {task.test_command}\n{HELP}")
    return self._last_observation

  def step(self, action: Any) -> base.Step:
    if self._task is None:
      raise RuntimeError("step() before reset()")
    if self._done:
      return base.Step(observation="The episode is over; reset or restore to continue.",
                       reward=0.0, done=True, info={"invalid_action": "episode is over"})
    text, reason = base.check_action(action)
    self._steps += 1
    if reason is not None:
      step = base.invalid_action_step(reason, HELP)
    else:
      step = self._dispatch(text)
    if not step.done and self._steps >= self.max_steps:
      graded = self._grade()
      step = base.Step(
          observation=f"{step.observation}\n\nStep limit ({self.max_steps}) reached; graded: "
          f"{graded.observation}", reward=graded.reward, done=True, truncated=True,
          info={**step.info, **graded.info})
    self._done = step.done
    self._last_observation = step.observation
    return step

  def snapshot(self) -> base.Snapshot:
    if self._task is None:
      raise RuntimeError("snapshot() before reset()")
    extra = {"task": self._descriptor, "show_tests": self.show_tests, "steps": self._steps,
             "done": self._done, "last_observation": self._last_observation,
             "viewer": self._viewer.to_json()}
    state = self._files.capture(extra)
    return base.Snapshot(data=self._files.pack(state), handle=(self._ws_token, state))

  def restore(self, snapshot: base.Snapshot) -> None:
    if not isinstance(snapshot, base.Snapshot):
      raise TypeError(f"restore needs a Snapshot, got {type(snapshot).__name__}")
    handle = snapshot.handle
    if handle is not None and self._ws is not None and handle[0] == self._ws_token:
      state = handle[1]
    else:
      extra = filestate.parse(snapshot.data)[0]["extra"]
      if extra["show_tests"] != self.show_tests:
        raise ValueError(f"the snapshot was taken with show_tests={extra['show_tests']}, this "
                         f"sandbox has show_tests={self.show_tests}")
      task = _task_from_descriptor(extra["task"])
      if self._task is None or task.task_id != self._task.task_id or task != self._task:
        self._load_task(task)
      state = self._files.unpack(snapshot.data)
    self._files.restore(state)
    extra = state.extra
    self._steps, self._done = extra["steps"], extra["done"]
    self._last_observation = extra["last_observation"]
    self._viewer = browse.Viewer.from_json(extra.get("viewer"))

  def close(self) -> None:
    if self._ws is not None:
      self._ws.close()
    self._ws, self._task = None, None

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass

  def expert_actions(self) -> list[str] | None:
    """The reference fix as actions, then `submit`; None once the episode is over.

    Each hunk of the task's reference patch becomes a `replace` of its old lines by its new
    ones; a new or deleted file, or a hunk whose old text is not unique in the current file,
    becomes a `write` of the whole fixed file (or an `rm`). Meant for the state after reset:
    from a state where the agent changed the same lines, the replaces may not apply.
    """
    if self._task is None:
      raise RuntimeError("expert_actions() before reset()")
    if self._done:
      return None
    fixed = dict(_reference_files(self._task))
    actions = []
    for path, hunks in _patch_hunks(self._task.instance["patch"]).items():
      full = os.path.join(self._ws.workdir, path)
      current = open(full, encoding="utf-8").read() if os.path.isfile(full) else None
      if fixed[path] is None:
        actions.append(f"run rm -f -- '{path}'")
      elif current is not None and all(old and current.count(old) == 1 for old, _ in hunks):
        actions += [f"replace {path}\n{_SEARCH}\n{old}\n{_DIVIDER}\n{new}\n{_REPLACE}"
                    for old, new in hunks]
      else:
        actions.append(f"write {path}\n{fixed[path].decode('utf-8')}")
    return actions + ["submit"]

  # -- internals --------------------------------------------------------------------------

  @property
  def workdir(self) -> str:
    """The task directory (for tests and tools; agents act through `step`)."""
    if self._ws is None:
      raise RuntimeError("no task loaded")
    return self._ws.workdir

  def _load_task(self, task: tasks_lib.SweTask) -> None:
    self.close()
    parent = tempfile.mkdtemp(prefix="bpo_swe_", dir=self.root)
    os.chmod(parent, 0o755)
    self._ws = workspace_lib.Workspace(parent, owner_uid=self.uid)
    self._ws_token = uuid.uuid4().hex
    self._task = task
    self._descriptor = _task_descriptor(task)
    self._base_tree = tasks_lib.materialize(task, self._ws)
    self._env = grading.task_env(task)
    self._files = filestate.FileState(self._ws, self._base_tree)
    self._start_tree = self._base_tree
    if self.show_tests:
      self._ws.git("apply", "--whitespace=nowarn", "-", input=task.instance["test_patch"].encode())
      self._start_tree = self._ws.write_tree()
    self._ws.set_head(self._start_tree)

  def _dispatch(self, text: str) -> base.Step:
    first, _, rest = text.partition("\n")
    verb, _, argument = first.strip().partition(" ")
    argument = argument.strip()
    if verb == "run":
      command = (argument + ("\n" + rest if rest else "")).strip()
      if not command:
        return base.invalid_action_step("run needs a command", HELP)
      before = self._files.capture({})
      access = grading.env_access(self._env, self._ws.workdir, self._namespaces)
      if self._namespaces:
        access.update(env={**access.get("env", {}), **_GIT_ENV},
                      readonly={_GIT_DIR: self._ws.gitdir},
                      copy_in={_GIT_INDEX: self._ws.agent_index})
      result = confinement_lib.run_confined(command, self._ws.workdir, self.limits, uid=self.uid,
                                            namespaces=self._namespaces, **access)
      report = result.report()
      if result.disk_limited:
        # A directory past its disk limit would make every snapshot huge: undo the command.
        self._files.restore(before)
        report += "\n[the command's changes to the task directory were undone]"
      info = {"exit_code": result.exit_code, "timed_out": result.timed_out,
              "output_limited": result.output_limited, "disk_limited": result.disk_limited}
      return base.Step(observation=f"{result.output}{report}", reward=0.0, done=False, info=info)
    if verb in browse.SEARCH_COMMANDS + browse.VIEWER_COMMANDS:
      try:
        if rest.strip():
          raise browse.BrowseError("is one line")
        return self._browse(verb, argument)
      except browse.BrowseError as e:
        return base.invalid_action_step(f"{verb} {e}", HELP)
    try:
      if verb == "view":
        return self._view(argument)
      if verb == "write":
        return self._write(argument, rest)
      if verb == "replace":
        return self._replace(argument, rest)
    except OSError as e:  # e.g. a path through a regular file
      return base.Step(observation=f"Error: {e.strerror or e}: {argument}", reward=0.0,
                       done=False, info={"error": e.strerror or str(e)})
    if verb == "submit":
      if argument or rest.strip():
        return base.invalid_action_step("submit takes no arguments", HELP)
      return self._grade()
    return base.invalid_action_step(f"unknown command {verb!r}", HELP)

  def _path(self, path: str) -> tuple[str | None, str | None]:
    if not path:
      return None, "a path is needed"
    try:
      return self._ws.resolve(path), None
    except ValueError as e:
      return None, str(e)

  def _browse(self, verb: str, argument: str) -> base.Step:
    """The search and viewer commands (browse.py); BrowseError for unusable arguments."""
    root = os.path.realpath(self._ws.workdir)
    if verb in ("goto", "scroll_down", "scroll_up"):
      if self._viewer.path is None:
        raise browse.BrowseError("needs an open file (open <file> first)")
      words = browse.split_arguments(argument, 1 if verb == "goto" else 0)
      if verb == "goto":
        first = browse.centred(_line_number(words, needed=True), self.window_lines)
      else:
        first = self._viewer.first + (self.window_lines if verb == "scroll_down"
                                      else -self.window_lines)
      return self._show(root, browse.Viewer(self._viewer.path, first))
    words = browse.split_arguments(argument, 2)
    if not words:
      raise browse.BrowseError("needs an argument")
    if verb == "open":
      full = self._existing(words[0], want_dir=False)
      if full is None:
        return _no_such(words[0])
      line = _line_number(words[1:], needed=False)
      first = 1 if line is None else browse.centred(line, self.window_lines)
      return self._show(root, browse.Viewer(os.path.relpath(full, root), first))
    if verb == "search_file":
      target = words[1] if len(words) > 1 else self._viewer.path
      if target is None:
        raise browse.BrowseError("needs a file when none is open")
      full = self._existing(target, want_dir=False)
      if full is None:
        return _no_such(target)
      return base.Step(observation=browse.search_file(root, full, words[0]), reward=0.0,
                       done=False)
    top = self._existing(words[1] if len(words) > 1 else ".", want_dir=True)
    if top is None:
      return _no_such(words[1])
    found = (browse.find_file if verb == "find_file" else browse.search_dir)(root, top, words[0])
    return base.Step(observation=found, reward=0.0, done=False)

  def _existing(self, path: str, want_dir: bool) -> str | None:
    """The resolved path of an existing directory (`want_dir`) or regular file, else None;
    BrowseError for a path outside the task directory."""
    full, error = self._path(path)
    if error:
      raise browse.BrowseError(error)
    exists = os.path.isdir(full) if want_dir else os.path.isfile(full)
    return full if exists else None

  def _show(self, root: str, viewer: browse.Viewer) -> base.Step:
    try:
      text, self._viewer = browse.window(root, viewer, self.window_lines)
    except browse.BrowseError as e:
      self._viewer = browse.Viewer()
      return base.Step(observation=f"Error: {e}; the viewer is closed.", reward=0.0, done=False,
                       info={"error": str(e)})
    return base.Step(observation=text, reward=0.0, done=False)

  def _refused_edit(self, full: str, new_content: bytes) -> base.Step | None:
    """The Step refusing an edit that would leave a Python file unparseable, else None."""
    before = None
    if os.path.isfile(full):
      with open(full, "rb") as f:
        before = f.read()
    rel = os.path.relpath(full, os.path.realpath(self._ws.workdir))
    error = browse.syntax_error(rel, before, new_content)
    if error is None:
      return None
    return base.Step(observation=f"Edit refused: {error}\nThe file is unchanged.", reward=0.0,
                     done=False, info={"error": "syntax error", "syntax_error": error})

  def _view(self, argument: str) -> base.Step:
    parts = argument.split()
    full, error = self._path(parts[0] if parts else "")
    if error:
      return base.invalid_action_step(error, HELP)
    try:
      bounds = [int(p) for p in parts[1:3]]
    except ValueError:
      return base.invalid_action_step("view line numbers must be integers", HELP)
    if len(parts) > 3 or any(b < 1 for b in bounds):
      return base.invalid_action_step("view takes a path and up to two line numbers >= 1", HELP)
    if os.path.isdir(full):
      entries = sorted(e + ("/" if os.path.isdir(os.path.join(full, e)) else "")
                       for e in os.listdir(full))
      return base.Step(observation="\n".join(entries) or "(empty directory)", reward=0.0,
                       done=False)
    if not os.path.isfile(full):
      return base.Step(observation=f"No such file: {parts[0]}", reward=0.0, done=False,
                       info={"error": "no such file"})
    with open(full, "rb") as f:
      lines = f.read(1 << 20).decode("utf-8", errors="replace").splitlines()
    first = bounds[0] if bounds else 1
    last = bounds[1] if len(bounds) > 1 else first + self.max_view_lines - 1
    last = min(last, first + self.max_view_lines - 1, len(lines))
    shown = [f"{i:5d}  {lines[i - 1]}" for i in range(first, last + 1)]
    footer = f"[lines {first}-{last} of {len(lines)}]" if lines else "[empty file]"
    return base.Step(observation="\n".join(shown + [footer]), reward=0.0, done=False)

  def _write(self, argument: str, content: str) -> base.Step:
    full, error = self._path(argument)
    if error:
      return base.invalid_action_step(error, HELP)
    if os.path.isdir(full):
      return base.invalid_action_step(f"{argument} is a directory", HELP)
    if content and not content.endswith("\n"):
      content += "\n"
    refused = self._refused_edit(full, content.encode())
    if refused is not None:
      return refused
    self._ws.write_files([(os.path.relpath(full, os.path.realpath(self._ws.workdir)), "100644",
                           content.encode())])
    self._ws.fix_ownership()
    return base.Step(observation=f"Wrote {len(content.splitlines())} lines to {argument}.",
                     reward=0.0, done=False)

  def _replace(self, argument: str, body: str) -> base.Step:
    full, error = self._path(argument)
    if error:
      return base.invalid_action_step(error, HELP)
    lines = body.split("\n")
    try:
      start, middle, end = lines.index(_SEARCH), lines.index(_DIVIDER), lines.index(_REPLACE)
    except ValueError:
      return base.invalid_action_step(
          f"replace needs {_SEARCH!r}, {_DIVIDER!r} and {_REPLACE!r} lines", HELP)
    if not start < middle < end:
      return base.invalid_action_step("replace markers are out of order", HELP)
    old = "\n".join(lines[start + 1:middle])
    new = "\n".join(lines[middle + 1:end])
    if not os.path.isfile(full):
      return base.Step(observation=f"No such file: {argument}", reward=0.0, done=False,
                       info={"error": "no such file"})
    with open(full, encoding="utf-8", errors="surrogateescape") as f:
      text = f.read()
    count = text.count(old) if old else 0
    if count != 1:
      return base.Step(observation=f"The SEARCH text occurs {count} times in {argument}; it must "
                       "occur exactly once.", reward=0.0, done=False,
                       info={"error": "search text not unique"})
    mode = "100755" if os.access(full, os.X_OK) else "100644"
    new_text = text.replace(old, new).encode("utf-8", errors="surrogateescape")
    refused = self._refused_edit(full, new_text)
    if refused is not None:
      return refused
    self._ws.write_files([(os.path.relpath(full, os.path.realpath(self._ws.workdir)), mode,
                           new_text)])
    self._ws.fix_ownership()
    return base.Step(observation=f"Replaced {len(old.splitlines())} lines with "
                     f"{len(new.splitlines())} lines in {argument}.", reward=0.0, done=False)

  def _grade(self) -> base.Step:
    # A GradingError (infrastructure: a git or OS error, a full disk, a test patch that does
    # not apply) propagates: the pool fails the branch with its reason, never a reward.
    report = grading.grade_workspace(self._ws, self._base_tree, self._task,
                                     self.grading_limits, self.uid, self._namespaces, self._env)
    status = report.get("tests_status", {})
    failing = [t for key in ("FAIL_TO_PASS", "PASS_TO_PASS")
               for t in status.get(key, {}).get("failure", [])]
    resolved = bool(report["resolved"])
    if resolved:
      text = "Submitted: all required tests pass. The task is resolved."
    elif not report.get("patch_successfully_applied", False):
      text = ("Submitted: the tests timed out, printed past the output limit or did not run "
              "(see the log). Not resolved.")
    else:
      text = "Submitted: not resolved. Failing tests:\n" + "\n".join(failing)
    summary = {k: v for k, v in report.items() if k not in ("log", "model_patch")}
    return base.Step(observation=text, reward=1.0 if resolved else 0.0, done=True,
                     info={"success": resolved, "report": summary,
                           "model_patch": report["model_patch"]})


def _line_number(words: list[str], needed: bool) -> int | None:
  """The line number in `words` (at most one), None when absent and not `needed`."""
  if not words:
    if needed:
      raise browse.BrowseError("needs a line number")
    return None
  try:
    line = int(words[0])
  except ValueError:
    line = 0
  if line < 1:
    raise browse.BrowseError(f"needs a line number >= 1, got {words[0]!r}")
  return line


def _no_such(path: str) -> base.Step:
  return base.Step(observation=f"No such file or directory: {path}", reward=0.0, done=False,
                   info={"error": "no such file"})


_LOGGED_MODES: set[str] = set()
_LOG_LOCK = threading.Lock()


def _log_protections(mode: str, protections: Mapping[str, bool]) -> None:
  """Says once per process and mode which protections the sandbox's commands get, and what
  they are not protected against."""
  with _LOG_LOCK:
    if mode in _LOGGED_MODES:
      return
    _LOGGED_MODES.add(mode)
  on = ", ".join(name for name, value in protections.items() if value)
  off = ", ".join(name for name, value in protections.items() if not value) or "none"
  logging.info("SWE sandbox commands run with confinement %r: on: %s; off: %s", mode, on, off)
  for note in confinement_lib.unprotected(mode):
    logging.warning("SWE sandbox commands (confinement %r) are not protected against %s", mode,
                    note)


_REFERENCE_FILES: dict[str, list[tuple[str, bytes | None]]] = {}


def _reference_key(task: tasks_lib.SweTask) -> str:
  """A hash of what the fixed files depend on: the repository at the base (its source and
  commit, or its files) and the reference patch, never the instance id alone (two rows may
  share an id and differ in their fix)."""
  digest = hashlib.sha256(json.dumps(
      [task.git_source, task.instance["base_commit"], task.instance["patch"]]).encode(
          "utf-8", errors="surrogatepass"))
  for path, mode, content in task.files:
    digest.update(f"\0{path}\0{mode}\0{len(content)}\0".encode("utf-8", "surrogatepass"))
    digest.update(content)
  return digest.hexdigest()


def _reference_files(task: tasks_lib.SweTask) -> list[tuple[str, bytes | None]]:
  """(path, fixed content or None if deleted) for each file the reference patch touches, kept
  per `_reference_key`."""
  key = _reference_key(task)
  if key not in _REFERENCE_FILES:
    with tempfile.TemporaryDirectory(prefix="bpo_swe_ref_") as parent:
      ws = workspace_lib.Workspace(parent)
      tasks_lib.materialize(task, ws)
      ws.git("apply", "--whitespace=nowarn", "-", input=task.instance["patch"].encode())
      files = []
      for path in grading.patched_files(task.instance["patch"]):
        full = os.path.join(ws.workdir, path)
        files.append((path, open(full, "rb").read() if os.path.exists(full) else None))
    _REFERENCE_FILES[key] = files
  return _REFERENCE_FILES[key]


def _patch_hunks(patch: str) -> dict[str, list[tuple[str, str]]]:
  """{path: [(old text, new text) per hunk]} of a unified git diff."""
  hunks: dict[str, list[tuple[str, str]]] = {}
  path, old, new = None, None, None

  def flush():
    if path is not None and old is not None:
      hunks.setdefault(path, []).append(("\n".join(old), "\n".join(new)))

  for line in patch.split("\n"):
    if line.startswith("diff --git "):
      flush()
      path, old, new = line.split(" b/", 1)[1], None, None
      hunks.setdefault(path, [])
    elif line.startswith("@@"):
      flush()
      old, new = [], []
    elif old is not None and line[:1] in (" ", "-", "+"):
      if line[:1] in (" ", "-"):
        old.append(line[1:])
      if line[:1] in (" ", "+"):
        new.append(line[1:])
  flush()
  return hunks


def _limits(value, default: confinement_lib.Limits) -> confinement_lib.Limits:
  if value is None:
    return default
  if isinstance(value, confinement_lib.Limits):
    return value
  if isinstance(value, Mapping):
    return confinement_lib.Limits(**{**default.__dict__, **value})
  raise TypeError(f"limits must be a Limits or a mapping, got {type(value).__name__}")
