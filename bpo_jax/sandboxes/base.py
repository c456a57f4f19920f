"""The sandbox contract (DESIGN.md §4).

A sandbox is a deterministic, text-in/text-out environment that can be snapshotted and restored
at any state:

    obs = sb.reset(task)              # -> str
    step = sb.step("open door")       # -> Step(observation, reward, done, truncated, info)
    snap = sb.snapshot()              # -> Snapshot (bytes any process can restore)
    sb.restore(snap)                  # back to exactly that state, randomness included
    sb.close()

Bad actions (empty, unparseable, huge, not UTF-8) never raise: they produce an observation that
says what was wrong, with `info["invalid_action"]` set to the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, runtime_checkable

# Longest action text a sandbox accepts; longer actions are rejected with an observation.
MAX_ACTION_CHARS = 4096


@dataclasses.dataclass(frozen=True)
class Step:
  """What one action produced."""

  observation: str
  reward: float
  done: bool
  truncated: bool = False
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class Snapshot:
  """A sandbox state as bytes that any worker process can restore.

  `handle` is an optional in-process fast path (for example the live object a restore can copy
  from); it never crosses a process boundary: pickling a Snapshot keeps only `data`.
  """

  data: bytes
  handle: Any = None

  def __getstate__(self):
    return {"data": self.data, "handle": None}

  def __setstate__(self, state):
    object.__setattr__(self, "data", state["data"])
    object.__setattr__(self, "handle", None)

  def __eq__(self, other):
    return isinstance(other, Snapshot) and self.data == other.data

  def __hash__(self):
    return hash(self.data)

  def __len__(self):
    return len(self.data)


@runtime_checkable
class Sandbox(Protocol):
  """The protocol every environment implements."""

  def reset(self, task: Any) -> str:
    ...

  def step(self, action: str) -> Step:
    ...

  def snapshot(self) -> Snapshot:
    ...

  def restore(self, snapshot: Snapshot) -> None:
    ...

  def close(self) -> None:
    ...


def check_action(action: Any, max_chars: int = MAX_ACTION_CHARS) -> tuple[str, str | None]:
  """Normalises an action; returns `(text, reason)` where `reason` is None for a usable action.

  Accepts `str` or `bytes`. Rejects (with a reason, never an exception): non-text, bytes that are
  not UTF-8, empty or whitespace-only text, text longer than `max_chars`, and control characters
  other than tab and newline. Surrounding whitespace is stripped.
  """
  if isinstance(action, (bytes, bytearray)):
    try:
      action = bytes(action).decode("utf-8")
    except UnicodeDecodeError:
      return "", "action is not valid UTF-8"
  if not isinstance(action, str):
    return "", f"action must be text, got {type(action).__name__}"
  if len(action) > max_chars:
    return "", f"action is {len(action)} characters long; the limit is {max_chars}"
  try:
    action.encode("utf-8")
  except UnicodeEncodeError:
    return "", "action is not valid UTF-8 (lone surrogate)"
  text = action.strip()
  if not text:
    return "", "action is empty"
  bad = [c for c in text if (ord(c) < 32 and c not in "\t\n") or ord(c) == 127]
  if bad:
    return "", f"action contains control character {bad[0]!r}"
  return text, None


def invalid_action_step(reason: str, observation_suffix: str = "") -> Step:
  """The Step a sandbox returns for an unusable action: no reward, not done."""
  text = f"Invalid action: {reason}."
  if observation_suffix:
    text = f"{text} {observation_suffix}"
  return Step(observation=text, reward=0.0, done=False, info={"invalid_action": reason})
