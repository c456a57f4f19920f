"""The SWE sandbox's action syntax for language-model agents (see `free_text.py`).

A reply holds one command (`sandbox.py`). Its first line starts with the command word; the
command runs from there:

    run <shell command>          to the end of the reply (a command may span lines)
    view <path> [first [last]]   that line alone
    find_file <name> [dir]       that line alone (and so for every command of one line:
    search_dir <text> [dir]      search_file, open, goto, scroll_down, scroll_up)
    write <path>                 to the end of the reply (the lines after it are the file)
    replace <path>               through the `>>>>>>> REPLACE` line
    submit                       that line alone

Text before the command line is ignored (a sentence of reasoning, say). When the command line
comes right after an opening code fence (a line starting with three backquotes), the command
ends before the fence's closing line, so a fenced reply does not write its fence into a file.

    parse_action("Fix the off-by-one.\\nreplace m.py\\n<<<<<<< SEARCH\\nx - 1\\n=======\\nx\\n"
                 ">>>>>>> REPLACE\\nThen I will submit.")
    # -> "replace m.py\\n<<<<<<< SEARCH\\nx - 1\\n=======\\nx\\n>>>>>>> REPLACE"
"""

from __future__ import annotations

COMMANDS = ("run", "view", "find_file", "search_dir", "search_file", "open", "goto",
            "scroll_down", "scroll_up", "write", "replace", "submit")
# Commands of one line: the rest of the reply is not part of them.
ONE_LINE = ("view", "find_file", "search_dir", "search_file", "open", "goto", "scroll_down",
            "scroll_up", "submit")
SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
_FENCE = "```"

SYSTEM_PROMPT = f"""You fix a bug in a Python repository until its tests pass. Reply with one \
command; its first line starts with the command word:
run <shell command>
view <path> [first_line [last_line]]
find_file <name> [dir]        (files named so; the name may be a pattern such as "*.py")
search_dir <text> [dir]       (files holding the text; quote text with spaces: "def get(")
search_file <text> [file]     (lines holding the text; the file defaults to the open one)
open <file> [line]            (a window of the file around the line, numbered; scroll it)
goto <line>
scroll_down
scroll_up
write <path>
<the whole new file content on the following lines>
replace <path>
{SEARCH}
<old lines, exactly as in the file>
{DIVIDER}
<new lines>
{REPLACE}
submit
An edit that leaves a Python file unparseable is refused and the file left as it was."""
NO_ACTION_HINT = ("Start a line with one of the commands: run, view, find_file, search_dir, "
                  "search_file, open, goto, scroll_down, scroll_up, write, replace, submit.")


def _command_line(lines: list[str]) -> int | None:
  for i, line in enumerate(lines):
    words = line.split()
    if words and words[0] in COMMANDS:
      return i
  return None


def parse_action(text: str) -> str | None:
  """The command in a reply (see the module docstring), as written; None if no line starts
  with a command word.

  >>> parse_action("submit")
  'submit'
  >>> parse_action("```\\nrun python -m pytest -q\\n```")
  'run python -m pytest -q'
  """
  lines = text.split("\n")
  start = _command_line(lines)
  if start is None:
    return None
  end = len(lines)
  if start > 0 and lines[start - 1].strip().startswith(_FENCE):
    end = next((j for j in range(start + 1, len(lines)) if lines[j].strip() == _FENCE), end)
  verb = lines[start].split()[0]
  if verb in ONE_LINE:
    end = start + 1
  elif verb == "replace":
    end = next((j + 1 for j in range(start + 1, end) if lines[j] == REPLACE), end)
  return "\n".join([lines[start].lstrip()] + lines[start + 1:end])
