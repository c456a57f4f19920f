"""Free-text actions: an agent's reply is text, and the environment's parser finds the action in it.

A language model's turn is whatever it generated up to its stop token: an action, perhaps with a
sentence around it. Each environment states its action syntax in a system prompt and provides a
parser that takes the action out of a reply. Both live beside the environment, as module-level

    SYSTEM_PROMPT: str                       # the syntax, stated for the model
    parse_action(text: str) -> str | None    # the action in a reply, None if there is none
    NO_ACTION_HINT: str                      # optional: what to say to a reply without one

in the module that `registry.ACTION_SYNTAX` names (the environment's own module, or its
`actions` module), and `registry.get_action_syntax(name)` returns them as an `ActionSyntax`.

`FreeTextSandbox` puts a parser in front of any sandbox: `step(reply)` steps the inner sandbox
with the parsed action, and a reply without an action gets an observation that says so (no
reward, not done, `info["invalid_action"]`), never an exception. The inner state is untouched by
such a reply, so snapshots are the inner sandbox's own.

    syntax = registry.get_action_syntax("rooms")
    sandbox = FreeTextSandbox(rooms.make_sandbox(), syntax)
    sandbox.step("I will take the key.\\ntake red key")   # steps rooms with "take red key"

Parsers here are small and strict, so that what the model must write is easy to state:

* `first_command(text, verbs)`: the first line of the reply whose first word is one of the
  environment's command words (rooms, TextWorld, ALFWorld, the gym worlds); on that line a
  leading `>` prompt, surrounding backquotes and one trailing full stop are dropped.
* `bracket_command(text, verbs)`: the first `verb[argument]` in the reply, the argument running
  to its matching `]` (WebShop's `search[...]` / `click[...]`).

A parser returns the action exactly as it is written in the reply, so an expert's action text
parses to itself (tests/test_action_roundtrip.py checks this for every environment).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable

from bpo_jax.sandboxes import base

NO_ACTION = "no action found in the reply"


@dataclasses.dataclass(frozen=True)
class ActionSyntax:
  """How an environment's actions are written.

  Attributes:
    system_prompt: the syntax stated for the model (the system turn of the chat).
    parse_action: reply text -> the action in it, or None when it holds none.
    hint: one sentence appended to the "no action" observation.
  """

  system_prompt: str
  parse_action: Callable[[str], str | None]
  hint: str = ""


def first_command(text: str, verbs: Iterable[str]) -> str | None:
  """The first line of `text` whose first word is one of `verbs` (case ignored), or None.

  On the chosen line surrounding whitespace, a leading `>` (an interactive-fiction prompt),
  surrounding backquotes and one trailing full stop are dropped.

  >>> first_command("I should move.\\ngo north.", ["go", "take"])
  'go north'
  >>> first_command("Nothing to do.", ["go"]) is None
  True
  """
  verbs = {v.lower() for v in verbs}
  for line in text.splitlines():
    line = line.strip()
    if line.startswith(">"):
      line = line[1:].strip()
    if len(line) >= 2 and line[0] == line[-1] == "`":
      line = line.strip("`").strip()
    if line.endswith(".") and not line.endswith(".."):
      line = line[:-1].rstrip()
    words = line.split()
    if words and words[0].lower() in verbs:
      return line
  return None


def bracket_command(text: str, verbs: Iterable[str]) -> str | None:
  """The first `verb[argument]` in `text` (verb case ignored), the argument running to the `]`
  that closes its `[` (brackets inside it must balance); None if there is none.

  >>> bracket_command("Let me look: search[red [2 pack] socks] now", ["search", "click"])
  'search[red [2 pack] socks]'
  >>> bracket_command("click[Buy Now", ["click"]) is None
  True
  """
  pattern = re.compile(r"\b(" + "|".join(re.escape(v) for v in verbs) + r")\s*\[",
                       re.IGNORECASE)
  for match in pattern.finditer(text):
    depth = 0
    for i in range(match.end() - 1, len(text)):
      if text[i] == "[":
        depth += 1
      elif text[i] == "]":
        depth -= 1
        if depth == 0:
          return text[match.start():i + 1]
  return None


class FreeTextSandbox(base.SandboxWrapper):
  """A sandbox whose `step` takes a reply and acts on the action the syntax finds in it.

  Everything but `step` is the inner sandbox's (`reset`, `snapshot`, `restore`, `close`, and any
  extra such as `expert_actions` or `admissible_actions`).
  """

  def __init__(self, inner: base.Sandbox, syntax: ActionSyntax):
    super().__init__(inner)
    self.syntax = syntax

  def step(self, reply: Any) -> base.Step:
    if not isinstance(reply, str):
      return self.inner.step(reply)  # the inner sandbox names what is wrong with it
    action = self.syntax.parse_action(reply)
    if action is None:
      return base.invalid_action_step(NO_ACTION, self.syntax.hint)
    return self.inner.step(action)
