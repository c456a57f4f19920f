"""A generated section of a document: the text between two marker lines, replaced by a report
script or checked against what its result files give (`--check`); and the figures' formats the
reports share."""

from __future__ import annotations

import sys


def ci(x: dict, digits: int = 3) -> str:
  """A mean with its interval, "0.600 [0.352, 0.848]" (the mean alone where there is none)."""
  f = lambda v: f"{v:.{digits}f}"
  return f(x["mean"]) if x.get("low") is None else f"{f(x['mean'])} [{f(x['low'])}, {f(x['high'])}]"


def ratio(x: dict) -> str:
  """A ratio with its interval, "0.43 [0.26, 0.70]" ("–" where there is none)."""
  if x["ratio"] is None:
    return "–"
  return f"{x['ratio']:.2f} [{x['low']:.2f}, {x['high']:.2f}]"


def splice(doc: str, body: str, begin: str, end: str) -> str:
  """`doc` with the text between the lines `begin` and `end` replaced by `body`; a ValueError
  unless each marker occurs once, `begin` first."""
  if doc.count(begin) != 1 or doc.count(end) != 1 or doc.index(begin) > doc.index(end):
    raise ValueError(f"the document needs the markers {begin!r} and {end!r} once each, "
                     "in that order")
  head, rest = doc.split(begin)
  _, tail = rest.split(end)
  return f"{head}{begin}\n{body}\n{end}{tail}"


def check_or_write(path: str, doc: str, new: str, check: bool, script: str) -> int:
  """With `check`, 0 if `new` equals `doc` (the file at `path`) and 1 (with one line naming the
  file) if not; without, `path` rewritten atomically to `new` and 0."""
  if check:
    if new != doc:
      print(f"{script}: {path}'s generated section is not what the files give", file=sys.stderr)
      return 1
    return 0
  from bpo_jax.training import workdir  # pylint: disable=g-import-not-at-top
  workdir.write_text(path, new)
  return 0
