"""The sandbox contract (docs/DESIGN.md §4).

A sandbox is a deterministic, text-in/text-out environment that can be snapshotted and restored
at any state:

    obs = sb.reset(task)              # -> str
    step = sb.step("open door")       # -> Step(observation, reward, done, truncated, info)
    snap = sb.snapshot()              # -> Snapshot (bytes any process can restore)
    sb.restore(snap)                  # back to exactly that state, randomness included
    sb.close()

Bad actions (empty, unparseable, huge, not UTF-8) never raise: they produce an observation that
says what was wrong, with `info["invalid_action"]` set to the reason.

`done` means the episode is over for any reason; `truncated` says it was cut by a step limit
rather than ended by the environment. The final Step of an episode carries `info["success"]`.
Sandboxes may also expose `admissible_actions() -> list[str]`.

Also here:

* `replay` / `check_replay`: restore a snapshot, replay actions (twice, or in two sandboxes, e.g.
  two worker processes) and report the first divergence of observation, reward or flags;
* `SandboxGymEnv`: a `gymnasium.Env` with text spaces that drives any sandbox, so gymnasium code
  can use every environment (gymnasium is imported only when the adapter is built).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

# Longest action text a sandbox accepts; longer actions are rejected with an observation.
MAX_ACTION_CHARS = 4096


class EnvironmentFailure(RuntimeError):
  """The environment's own machinery cannot run (a command that cannot be confined, tests that
  cannot start, a grader that cannot read its log): never the agent's doing and never a reward.
  In a rollout the pool records it as the branch's failure; outside one (the expert episodes of
  the tokenizer corpus and the warm start) it stops the run with its one-line reason."""


class TaskInputError(ValueError):
  """Bad task input named by a run's env.options (a data file that is missing or malformed, a
  field or a clone it lacks): the user's to fix, reported in one line (exit status 2)."""


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


class SandboxWrapper:
  """A sandbox that passes every call to `inner`; subclasses override what they change.

  Names the wrapper does not define (an environment's extras such as `expert_actions` or
  `admissible_actions`) are the inner sandbox's.
  """

  def __init__(self, inner: Sandbox):
    self.inner = inner

  def reset(self, task: Any) -> str:
    return self.inner.reset(task)

  def step(self, action: Any) -> Step:
    return self.inner.step(action)

  def snapshot(self) -> Snapshot:
    return self.inner.snapshot()

  def restore(self, snapshot: Snapshot) -> None:
    self.inner.restore(snapshot)

  def close(self) -> None:
    self.inner.close()

  def __getattr__(self, name: str):
    # Only reached for names the class does not define; "inner" itself is missing only while
    # unpickling, before __init__ state is set.
    if name == "inner":
      raise AttributeError(name)
    return getattr(self.inner, name)


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


# ----------------------------------------------------------------------------- replay checking


@dataclasses.dataclass(frozen=True)
class Divergence:
  """Where two replays of the same actions from the same snapshot first differ."""

  step: int      # index into the replayed actions
  field: str     # "observation", "reward", "done", "truncated" or "length"
  first: Any
  second: Any

  def __str__(self):
    return f"step {self.step}: {self.field} differs: {self.first!r} != {self.second!r}"


def replay(sandbox: Sandbox, snapshot: Snapshot, actions: Sequence[str]) -> list[Step]:
  """Restores `snapshot` into `sandbox` and takes `actions`; stops after a done Step."""
  sandbox.restore(snapshot)
  steps = []
  for action in actions:
    steps.append(sandbox.step(action))
    if steps[-1].done:
      break
  return steps


def first_divergence(first: Sequence[Step], second: Sequence[Step]) -> Divergence | None:
  """The first step where two step sequences differ (exact comparison), or None.

  Observations are compared as UTF-8 bytes and rewards by their exact float value, so the
  check is byte-identical, not approximate.
  """
  for i, (a, b) in enumerate(zip(first, second)):
    if a.observation.encode("utf-8") != b.observation.encode("utf-8"):
      return Divergence(i, "observation", a.observation, b.observation)
    if float(a.reward).hex() != float(b.reward).hex():
      return Divergence(i, "reward", a.reward, b.reward)
    if bool(a.done) != bool(b.done):
      return Divergence(i, "done", a.done, b.done)
    if bool(a.truncated) != bool(b.truncated):
      return Divergence(i, "truncated", a.truncated, b.truncated)
  if len(first) != len(second):
    return Divergence(min(len(first), len(second)), "length", len(first), len(second))
  return None


def check_replay(sandbox: Sandbox, snapshot: Snapshot, actions: Sequence[str],
                 other: Sandbox | None = None) -> Divergence | None:
  """Replays `actions` from `snapshot` twice and returns the first divergence, or None.

  The second replay runs in `other` when given (a fresh sandbox, or one in another process),
  else in `sandbox` again after a second restore.

  Example:
    snap = sb.snapshot()
    assert check_replay(sb, snap, ["go north", "take apple"]) is None
  """
  first = replay(sandbox, snapshot, actions)
  second = replay(sandbox if other is None else other, snapshot, actions)
  return first_divergence(first, second)


# ----------------------------------------------------------------------------- gymnasium adapter

# The characters of the adapter's text spaces: printable ASCII, tab and newline (every
# observation the registered environments give), the printable Latin-1 letters and signs, and
# U+FFFD, which stands in an observation for any other character.
REPLACEMENT_CHARACTER = "\ufffd"
GYM_CHARSET = ("".join(chr(c) for c in range(32, 127)) + "\t\n"
               + "".join(chr(c) for c in range(0xA1, 0x100) if chr(c).isprintable())
               + REPLACEMENT_CHARACTER)
# Longest observation the adapter's observation space holds; longer ones are cut to it.
MAX_OBSERVATION_CHARS = 1 << 20


def gym_observation(text: str, charset: frozenset[str],
                    max_chars: int = MAX_OBSERVATION_CHARS) -> str:
  """`text` as a member of the adapter's observation space: each character outside `charset`
  becomes U+FFFD, text past `max_chars` characters is cut, and an empty text becomes one space
  (gymnasium's text spaces hold no empty string).

  >>> gym_observation("caf\u00e9 \u2603", frozenset(GYM_CHARSET))
  'caf\u00e9 \ufffd'
  """
  if not all(c in charset for c in text):
    text = "".join(c if c in charset else REPLACEMENT_CHARACTER for c in text)
  return text[:max_chars] or " "


def make_gym_env(sandbox: Sandbox, tasks: Sequence[Any],
                 max_observation_chars: int = MAX_OBSERVATION_CHARS,
                 max_action_chars: int = MAX_ACTION_CHARS, charset: str = GYM_CHARSET):
  """A `gymnasium.Env` that plays `tasks` in `sandbox` (see `SandboxGymEnv`)."""
  return _gym_env_class()(sandbox, tasks, max_observation_chars, max_action_chars, charset)


_GYM_ENV_CLASS = None


def _gym_env_class():
  """Builds the adapter class on first use, so importing this module never imports gymnasium."""
  global _GYM_ENV_CLASS
  if _GYM_ENV_CLASS is not None:
    return _GYM_ENV_CLASS
  import gymnasium  # pylint: disable=g-import-not-at-top

  class SandboxGymEnv(gymnasium.Env):
    """Any sandbox as a gymnasium environment with text observation and action spaces.

    `reset(seed=..., options={"task": task})` plays `task`; without one, a task is drawn from
    `tasks` with the environment's seeded generator. `step(action)` returns
    `(observation, reward, terminated, truncated, info)` with `terminated = done and not
    truncated`. `info` carries the Step's info, plus `"admissible_actions"` when the sandbox
    offers them.

    Both spaces are `gymnasium.spaces.Text` over `charset` (default `GYM_CHARSET`); actions
    hold up to `max_action_chars` characters (what sandboxes accept), observations up to
    `max_observation_chars`. An observation the space cannot hold as it is (a character
    outside the charset, too long, empty) is mapped into it by `gym_observation`, and the
    sandbox's own text is then `info["sandbox_observation"]`. `gymnasium.utils.env_checker.
    check_env` passes for every registered environment (tests/sandboxes/test_gym_check.py).
    """

    metadata = {"render_modes": []}

    def __init__(self, sandbox, tasks, max_observation_chars=MAX_OBSERVATION_CHARS,
                 max_action_chars=MAX_ACTION_CHARS, charset=GYM_CHARSET):
      super().__init__()
      if not tasks:
        raise ValueError("SandboxGymEnv needs at least one task")
      self.sandbox = sandbox
      self.tasks = list(tasks)
      self.observation_space = gymnasium.spaces.Text(max_length=max_observation_chars,
                                                     charset=charset)
      self.action_space = gymnasium.spaces.Text(max_length=max_action_chars, charset=charset)
      self._charset = frozenset(charset)

    def _observation(self, text, info):
      info = dict(info)
      observation = gym_observation(text, self._charset, self.observation_space.max_length)
      if observation != text:
        info["sandbox_observation"] = text
      if hasattr(self.sandbox, "admissible_actions"):
        info["admissible_actions"] = self.sandbox.admissible_actions()
      return observation, info

    def reset(self, *, seed=None, options=None):
      super().reset(seed=seed)
      options = options or {}
      if "task" in options:
        task = options["task"]
      else:
        task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
      return self._observation(self.sandbox.reset(task),
                               {"task_id": getattr(task, "task_id", None)})

    def step(self, action):
      step = self.sandbox.step(action)
      truncated = bool(step.truncated)
      terminated = bool(step.done) and not truncated
      observation, info = self._observation(step.observation, step.info)
      return observation, float(step.reward), terminated, truncated, info

    def close(self):
      self.sandbox.close()

  _GYM_ENV_CLASS = SandboxGymEnv
  return SandboxGymEnv


def __getattr__(name: str) -> Callable:
  if name == "SandboxGymEnv":
    return _gym_env_class()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
