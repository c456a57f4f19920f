"""WebShop's action syntax for language-model agents (see `free_text.py`).

WebShop's actions are `search[<keywords>]` on the search page and `click[<button>]` with a
button shown on the page (`shop.py`). A reply's action is its first `search[...]` or `click[...]`,
the argument running to the `]` that closes its `[`, so a title with balanced brackets in it
("click[Socks [2 Pack]]") stays whole.

    parse_action("I'll look for it.\\nsearch[mixed nuts gluten free]")
    # -> "search[mixed nuts gluten free]"
"""

from __future__ import annotations

from bpo_jax.sandboxes import free_text

SYSTEM_PROMPT = ("You are shopping in a web shop for the product the instruction describes. "
                 "Reply with one action: search[<keywords>] on the search page, or "
                 "click[<button>] with a button shown on the page (a product id, an option, "
                 "Next >, < Prev, Back to Search, Description, Features, Reviews, Buy Now).")
NO_ACTION_HINT = "Reply with search[<keywords>] or click[<button>]."


def parse_action(text: str) -> str | None:
  """The first `search[...]` or `click[...]` of a reply, as written; None if there is none.

  >>> parse_action("click[B0B34SD43W]")
  'click[B0B34SD43W]'
  """
  return free_text.bracket_command(text, ("search", "click"))
