"""SWE sandbox: hidden tests stay hidden before submit, file search, the scrolling viewer (its
window in snapshots), the syntax check of edits, and all of them confined to the task
directory."""

import os

import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import registry
from bpo_jax.sandboxes import swe
from bpo_jax.sandboxes.swe import confinement
from bpo_jax.sandboxes.swe import grading

NAMESPACES = confinement.namespaces_available()
MODE = {} if NAMESPACES else {"confinement": "rlimits-only"}
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="host offers no namespaces")
LRU = swe.load_shipped_task("lru")
# Names of the tests that the test patch adds; nothing of them is in the repository at base.
HIDDEN = [t.split("::")[1] for t in LRU.fail_to_pass]  # test_get_refreshes, ...
# `cat` of every object in the git directory commands see, then of every file they see.
DUMP = ("run git cat-file --batch-all-objects --batch; find . -type f -exec cat {} +; "
        "grep -rc " + " -e ".join([""] + HIDDEN) + " . | grep -v ':0$' | wc -l")


@pytest.fixture(scope="module")
def sandbox():
  sandbox = swe.make_sandbox(max_steps=40, window_lines=10, **MODE)
  yield sandbox
  sandbox.close()


def _visible_to_commands(sandbox):
  step = sandbox.step(DUMP)
  assert step.info["exit_code"] == 0, step.observation
  return step.observation


def test_hidden_tests_are_unreadable_before_submit_and_still_grade(sandbox):
  assert sandbox.show_tests is False  # the default
  sandbox.reset(LRU)
  start = sandbox.snapshot()
  base_files = {p: c.decode() for p, _, c in LRU.files}
  for path in grading.patched_files(LRU.instance["test_patch"]):
    # Each test file is as it is at the base commit (the patch adds tests to it).
    assert sandbox.step(f"run cat {path}").observation == base_files[path] + "[exit code 0]"
  seen = _visible_to_commands(sandbox)
  assert not any(name in seen for name in HIDDEN) and seen.endswith("\n0\n[exit code 0]")
  for action in ['search_dir "def test_"', "find_file '*'"]:
    assert not any(name in sandbox.step(action).observation for name in HIDDEN)
  for name in HIDDEN:
    assert sandbox.step(f"search_dir {name}").observation.startswith("0 lines")
  # The agent's code copies the tests while they run at grading: after submit, no copy is left
  # for a branch restored from before it, neither in the files nor in the git directory.
  sandbox.step("write conftest.py\nimport shutil\nshutil.copy('tests/test_cache.py', 'copy.txt')")
  assert sandbox.step("submit").info["success"] is False
  sandbox.restore(start)
  seen = _visible_to_commands(sandbox)
  assert not any(name in seen for name in HIDDEN) and seen.endswith("\n0\n[exit code 0]")
  # The reference fix resolves the task: grading applies the hidden tests.
  for action in sandbox.expert_actions():
    step = sandbox.step(action)
  assert step.done and step.info["success"] is True and step.reward == 1.0
  assert sorted(step.info["report"]["tests_status"]["FAIL_TO_PASS"]["success"]) == sorted(
      LRU.fail_to_pass)
  # The explicit option shows them: the same dump then holds them (so the check can fail).
  shown = swe.make_sandbox(show_tests=True, **MODE)
  shown.reset(LRU)
  assert all(name in _visible_to_commands(shown) for name in HIDDEN)
  shown.close()


def test_find_file_and_search(sandbox):
  sandbox.reset(LRU)
  steps = {a: sandbox.step(a) for a in [
      "find_file '*.py'", "find_file cache.py lrucache", "find_file nope.py",
      'search_dir "def get"', "search_dir self lrucache", "search_dir nowhere_text",
      "search_file hits lrucache/cache.py", "search_file 'hits +=' lrucache/cache.py",
      "search_file nowhere_text lrucache/cache.py"]}
  got = {a: s.observation for a, s in steps.items()}
  assert got == {
      "find_file '*.py'": '6 files named "*.py" in ./:\nlrucache/__init__.py\n'
                          "lrucache/cache.py\nlrucache/memo.py\ntests/__init__.py\n"
                          "tests/test_cache.py\ntests/test_memo.py",
      "find_file cache.py lrucache": '1 file named "cache.py" in lrucache:\nlrucache/cache.py',
      "find_file nope.py": '0 files named "nope.py" in ./',
      'search_dir "def get"': '1 line holding "def get" in 1 file in ./:\nlrucache/cache.py (1)',
      "search_dir self lrucache": '20 lines holding "self" in 1 file in lrucache:\n'
                                  "lrucache/cache.py (20)",
      "search_dir nowhere_text": '0 lines holding "nowhere_text" in 0 files in ./',
      "search_file hits lrucache/cache.py": '2 lines holding "hits" in lrucache/cache.py:\n'
                                            "11:        self.hits = 0\n"
                                            "16:            self.hits += 1",
      "search_file 'hits +=' lrucache/cache.py": '1 line holding "hits +=" in '
                                                 "lrucache/cache.py:\n"
                                                 "16:            self.hits += 1",
      "search_file nowhere_text lrucache/cache.py": '0 lines holding "nowhere_text" in '
                                                    "lrucache/cache.py",
  }
  # The counts are grep's, which counts matching lines too.
  for text in ["self", "def", "return", "import"]:
    grep = sandbox.step(f"run grep -rc {text} . | grep -v ':0$' | sort").observation
    counts = [line.rsplit(":", 1) for line in grep.splitlines()[:-1]]
    expected = "\n".join(f"{p[2:]} ({n})" for p, n in counts)
    got = sandbox.step(f"search_dir {text}").observation
    assert got.split(":\n", 1)[1] == expected and got.startswith(
        f"{sum(int(n) for _, n in counts)} lines holding"), text
  assert not any("invalid_action" in s.info or "error" in s.info for s in steps.values())
  for bad in ["find_file", "search_dir", "search_file", "search_file hits", "search_dir 'x",
              "find_file a b c", "search_dir x y\nmore"]:
    step = sandbox.step(bad)
    assert step.info["invalid_action"] and not step.done, bad
  assert sandbox.step("search_dir x nodir").info["error"] == "no such file"


def test_viewer_scrolls_and_its_window_is_in_snapshots(sandbox):
  sandbox.reset(LRU)
  with open(os.path.join(sandbox.workdir, "lrucache", "cache.py")) as f:
    lines = f.read().splitlines()
  assert len(lines) == 32

  def window(first, last):
    return "\n".join([f"[File: lrucache/cache.py (32 lines total)]",
                      f"({first - 1} more lines above)"]
                     + [f"{i}:{lines[i - 1]}" for i in range(first, last + 1)]
                     + [f"({32 - last} more lines below)"])

  assert sandbox.step("scroll_down").info["invalid_action"]  # nothing is open yet
  assert sandbox.step("open lrucache/cache.py").observation == window(1, 10)
  assert sandbox.step("scroll_down").observation == window(11, 20)
  assert sandbox.step("scroll_down").observation == window(21, 30)
  # The last window ends at the last line; scrolling on stays there.
  assert sandbox.step("scroll_down").observation == window(23, 32)
  assert sandbox.step("scroll_down").observation == window(23, 32)
  assert sandbox.step("scroll_up").observation == window(13, 22)
  assert sandbox.step("goto 3").observation == window(1, 10)
  assert sandbox.step("open lrucache/cache.py 20").observation == window(15, 24)
  assert sandbox.step("search_file hits").observation.startswith(  # the open file
      '2 lines holding "hits" in lrucache/cache.py:')
  # The window's position is sandbox state: a restore puts it back, in this sandbox and in a
  # fresh one that restores from the bytes alone.
  snapshot = sandbox.snapshot()
  assert sandbox.step("goto 30").observation == window(23, 32)
  moved = sandbox.snapshot()
  assert moved.data != snapshot.data
  sandbox.restore(snapshot)
  assert sandbox.snapshot().data == snapshot.data
  assert sandbox.step("scroll_up").observation == window(5, 14)
  fresh = swe.make_sandbox(max_steps=40, window_lines=10, **MODE)
  fresh.restore(base.Snapshot(snapshot.data))
  assert fresh.step("scroll_up").observation == window(5, 14)
  fresh.restore(base.Snapshot(moved.data))
  assert fresh.step("scroll_up").observation == window(13, 22)
  fresh.close()
  # Reset closes the viewer; an open file that goes away closes it too.
  sandbox.reset(LRU)
  assert sandbox.step("goto 1").info["invalid_action"]
  sandbox.step("open lrucache/cache.py")
  sandbox.step("run rm lrucache/cache.py")
  assert sandbox.step("scroll_down").info["error"] == "lrucache/cache.py is no longer a text file"
  assert sandbox.step("scroll_up").info["invalid_action"]
  for bad in ["open", "goto", "goto 0", "goto x", "scroll_down 3", "open a.py b c"]:
    assert sandbox.step(bad).info.get("invalid_action"), bad
  assert sandbox.step("open nope.py").info["error"] == "no such file"


def test_edits_that_break_python_syntax_are_refused(sandbox):
  sandbox.reset(LRU)
  path = os.path.join(sandbox.workdir, "lrucache", "cache.py")
  before = open(path, "rb").read()
  step = sandbox.step("replace lrucache/cache.py\n<<<<<<< SEARCH\n            self.hits += 1\n"
                      "=======\n            self.hits += (\n>>>>>>> REPLACE")
  assert step.observation == (
      "Edit refused: the edit leaves lrucache/cache.py unparseable: '(' was never closed at "
      "line 16:\n            self.hits += (\nThe file is unchanged.")
  assert step.info["error"] == "syntax error" and not step.done
  step = sandbox.step("write lrucache/cache.py\nimport os\n\ndef f(:\n    pass")
  assert step.observation.startswith("Edit refused: the edit leaves lrucache/cache.py "
                                     "unparseable: invalid syntax at line 3:\ndef f(:")
  assert sandbox.step("write lrucache/new.py\n  x = 1").info["error"] == "syntax error"
  assert open(path, "rb").read() == before
  assert not os.path.exists(os.path.join(sandbox.workdir, "lrucache", "new.py"))
  # Parseable Python, other files, and a file that did not parse before are edited.
  assert sandbox.step("write lrucache/new.py\nx = 1").observation == (
      "Wrote 1 lines to lrucache/new.py.")
  assert sandbox.step("write notes.txt\ndef f(:").observation == "Wrote 1 lines to notes.txt."
  sandbox.step("run printf 'print \"py2\"\\n' > old.py")
  assert sandbox.step("write old.py\nprint 'still py2'").observation == "Wrote 1 lines to old.py."
  assert "error" not in sandbox.step(
      "replace lrucache/cache.py\n<<<<<<< SEARCH\n            self.hits += 1\n=======\n"
      "            self.hits += 2\n>>>>>>> REPLACE").info


def test_browsing_stays_in_the_task_directory(sandbox, tmp_path):
  sandbox.reset(LRU)
  outside = tmp_path / "secret_dir"
  outside.mkdir()
  (outside / "secret.txt").write_text("secret_marker\n")
  os.chmod(tmp_path, 0o755)
  # Links out of the task directory, made host-side (commands under namespaces cannot even
  # see the host's directories), and a FIFO, which a naive open would block on.
  os.symlink(outside, os.path.join(sandbox.workdir, "out_dir"))
  os.symlink(outside / "secret.txt", os.path.join(sandbox.workdir, "out_file.txt"))
  os.mkfifo(os.path.join(sandbox.workdir, "pipe.py"))
  for action in ["open ../x", "open out_file.txt", "search_dir secret_marker ..",
                 "search_dir secret_marker out_dir", "find_file '*' out_dir",
                 "search_file secret_marker out_file.txt", "find_file '*' /etc",
                 "open lrucache/../../git/config"]:  # the git directory beside it
    step = sandbox.step(action)
    assert "outside the task directory" in step.info["invalid_action"], action
  for action in ["search_dir secret_marker", "find_file 'secret*'", "find_file 'out_*'"]:
    assert sandbox.step(action).observation.startswith("0 "), action
  assert sandbox.step("find_file 'pipe*'").observation.startswith("0 ")
  assert sandbox.step("open pipe.py").info["error"] == "no such file"
  assert sandbox.step("search_dir def").observation.startswith(
      '15 lines holding "def" in 4 files in ./:\nlrucache/cache.py (6)')


def test_free_text_sandbox_takes_the_new_commands():
  sandbox = registry.make_free_text_sandbox("swe", window_lines=5, **MODE)
  sandbox.reset(LRU)
  step = sandbox.step("Let me find the cache.\nfind_file cache.py\nThen open it.")
  assert step.observation == '1 file named "cache.py" in ./:\nlrucache/cache.py'
  assert sandbox.step("```\nopen lrucache/cache.py 3\n```").observation.startswith(
      "[File: lrucache/cache.py (32 lines total)]\n(0 more lines above)\n1:")
  assert sandbox.step("I scroll.\nscroll_down").observation.startswith(
      "[File: lrucache/cache.py (32 lines total)]\n(5 more lines above)\n6:")
  assert "search_dir" in registry.get_action_syntax("swe").system_prompt
  sandbox.close()
