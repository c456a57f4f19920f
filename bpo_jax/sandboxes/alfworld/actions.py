"""ALFWorld's action syntax for language-model agents (see `free_text.py`).

The commands are those of ALFWorld's grammar (its `help` text): `look`, `inventory`, `go to
(receptacle)`, `open`/`close (receptacle)`, `take (object) from (receptacle)`, `move (object) to
(receptacle)`, `examine (something)`, `use (object)`, `heat`/`clean`/`cool (object) with
(receptacle)`, `slice (object) with (object)`. A reply's command is its first line that starts
with one of these verbs.

    parse_action("The mug is in the cabinet.\\ngo to cabinet 1")   # "go to cabinet 1"
"""

from __future__ import annotations

from bpo_jax.sandboxes import free_text

COMMAND_VERBS = ("look", "inventory", "go", "open", "close", "take", "move", "put", "examine",
                 "use", "heat", "clean", "cool", "slice", "toggle", "help")
SYSTEM_PROMPT = ("You are in a household. Do the task. Reply with one command: look, inventory, "
                 "go to <receptacle>, open <receptacle>, close <receptacle>, take <object> from "
                 "<receptacle>, move <object> to <receptacle>, examine <something>, use <object>, "
                 "heat <object> with <receptacle>, clean <object> with <receptacle>, cool <object> "
                 "with <receptacle>, slice <object> with <object>.")
NO_ACTION_HINT = "Reply with one command such as 'look' or 'go to cabinet 1'."


def parse_action(text: str) -> str | None:
  """The first line of a reply that starts with an ALFWorld command verb; None if none does.

  >>> parse_action("go to countertop 1")
  'go to countertop 1'
  """
  return free_text.first_command(text, COMMAND_VERBS)
