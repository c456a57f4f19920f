"""The ALFWorld sandbox: a game on TextWorld's PDDL engine, with snapshots that need no replay.

Snapshots. In-process, a snapshot's `handle` is the engine state itself: the Fast Downward state
id (its state registry keeps every visited state), a copy of the Python-side fact set and the last
game state, so `restore` costs no replay. `Snapshot.data` is the portable form: the game (zlib),
the commands taken since reset and the Fast Downward operators they applied; another process
restores it by applying those operators to the game's initial state (no text is derived for the
intermediate steps, so this costs ~2 ms a step against ~40 ms for replaying the commands). The
engine has no randomness (the grammar has one production per rule and the demangler's numbering
is not shuffled), so observations, rewards and done flags are identical either way.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import struct
import types
import zlib
from typing import Any, Sequence

from bpo_jax.sandboxes.alfworld.engine import _alfworld, _install_engine_caches
from bpo_jax.sandboxes.alfworld.games import AlfworldTask
from bpo_jax.sandboxes.alfworld.tasks import _split_options
from bpo_jax.sandboxes.base import (MAX_ACTION_CHARS, Snapshot, Step, check_action,
                                    invalid_action_step)

_SNAPSHOT_MAGIC = b"BPOALFW1"

# Engines of closed sandboxes, for the next sandbox of this process to take (`_engine`): each
# engine holds its own copy of the Fast Downward library, a file TextWorld copies to a temporary
# directory and deletes while it stays mapped (about 33 MB of disk and memory until the process
# exits). A new engine per sandbox, i.e. per branch, filled the disk of a long measurement; with
# reuse a process holds as many copies as it ever had sandboxes open at once.
_SPARE_ENGINES: list[tuple[Any, Any]] = []
# Game loads, numbered across the process: a snapshot's in-process handle names the engine and
# the load it was taken in, and a reused engine must never repeat a (engine, load) pair.
_LOADS = itertools.count(1)


def _engine(aw) -> tuple[Any, Any]:
  """(PddlEnv, ALFWorld's demangler around it): a closed sandbox's, or a new one."""
  if _SPARE_ENGINES:
    return _SPARE_ENGINES.pop()
  infos = aw["textworld"].EnvInfos(admissible_commands=True, won=True)
  pddl_env = aw["PddlEnv"](infos)
  return pddl_env, aw["alfred_tw_env"].AlfredDemangler(pddl_env, shuffle=False)


@dataclasses.dataclass(frozen=True, eq=False)
class _EngineState:
  """The engine's state in this process: what `restore` needs to resume without replay."""

  engine: Any  # the PddlEnv the state belongs to (a state id means nothing elsewhere)
  epoch: int  # the game load's number (`_LOADS`); a load resets Fast Downward's state registry
  state_id: int  # Fast Downward's id of the current state in its registry
  facts: tuple  # copies of the Python-side fact indices of the PddlState
  game_state: Any  # the engine's last GameState (never mutated after its step)
  prev_state: Any
  operators: Any  # the operator table the last game state's actions index into
  moves: int
  last_action: Any


@dataclasses.dataclass(frozen=True)
class _Progress:
  """The sandbox's own bookkeeping, part of every snapshot."""

  commands: tuple[str, ...]  # commands the engine executed since reset, in order
  operators: tuple[str, ...]  # the Fast Downward operators they applied ("Nothing happens": none)
  steps: int  # actions taken, including rejected ones (they cost a turn)
  done: bool
  truncated: bool
  success: bool
  observation: str


class AlfworldSandbox:
  """An ALFWorld game on ALFWorld's text engine, implementing the Sandbox protocol.

  Reward is 1 on the step that achieves the goal (`info["success"]` True, `done` True) and 0
  otherwise. After `max_steps` actions the episode ends with `done` and `truncated` True. A
  well-formed command the game does not admit is an ordinary turn ("Nothing happens.", as in
  ALFWorld); text that is not a usable action (empty, too long, control characters, bad UTF-8)
  gets an "Invalid action" observation with `info["invalid_action"]` and also costs a turn.

  With `admissible_commands=True` every observation (of reset and of each step before the
  episode ends) closes with the commands the game accepts in the new state, as verl-agent's
  ALFWorld prompt lists them:

      ...
      Admissible commands: examine countertop 1, go to cabinet 1, ..., look

  (ALFWorld's commands hold no commas.) Every listed command does something; a command not
  listed gets "Nothing happens." (tests/sandboxes/test_alfworld.py checks both).

  Example:
    sb = AlfworldSandbox(max_steps=50)
    sb.reset(task)
    for command in task.walkthrough:
      step = sb.step(command)
    assert step.info["success"] and step.reward == 1.0
  """

  def __init__(self, max_steps: int = 50, max_action_chars: int = MAX_ACTION_CHARS,
               admissible_commands: bool = False):
    if max_steps < 1:
      raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if max_action_chars < 1:
      raise ValueError(f"max_action_chars must be >= 1, got {max_action_chars}")
    aw = _alfworld()
    _install_engine_caches()
    self.max_steps = int(max_steps)
    self.max_action_chars = int(max_action_chars)
    self.admissible_commands = bool(admissible_commands)
    self._pddl_env, self._env = _engine(aw)
    self._task: AlfworldTask | None = None
    self._task_blob = b""
    self._epoch = 0
    self._initial: _EngineState | None = None
    self._progress: _Progress | None = None
    self._closed = False

  # -- the protocol --------------------------------------------------------------------------

  def reset(self, task: AlfworldTask) -> str:
    self._require_open()
    if not isinstance(task, AlfworldTask):
      raise TypeError(f"reset expects an AlfworldTask, got {type(task).__name__}")
    if self._task is None or self._task.digest != task.digest:
      self._load(task)
    else:
      self._set_engine_state(self._initial)
    observation = self._with_admissible(self._pddl_env.state.feedback, done=False)
    self._progress = _Progress(commands=(), operators=(), steps=0, done=False, truncated=False,
                               success=False, observation=observation)
    return observation

  def step(self, action: Any) -> Step:
    progress = self._require_progress()
    if progress.done:
      return Step(observation="The episode is over; reset the sandbox to play again.", reward=0.0,
                  done=True, truncated=progress.truncated,
                  info={"invalid_action": "episode is over", "success": progress.success})
    text, reason = check_action(action, self.max_action_chars)
    commands, operators = progress.commands, progress.operators
    if reason is not None:
      step = invalid_action_step(reason, "Type a command such as 'look' or 'go to cabinet 1'.")
      observation, reward, won = step.observation, 0.0, False
    else:
      # The engine matches commands exactly; ALFWorld's commands are lower case with single spaces.
      text = " ".join(text.lower().split())
      # The operators applicable now, by id: after the step the engine only knows the new ones.
      # pylint: disable=protected-access
      applicable = dict(getattr(self._pddl_env._pddl_state, "_operators", None) or {})
      state, _, _ = self._env.step(text)
      commands = commands + (text,)
      applied = self._pddl_env._last_action
      # pylint: enable=protected-access
      if applied is not None:
        operators = operators + (applicable[applied.id].name,)
      observation, won = state.feedback, bool(state["won"])
      reward = 1.0 if won else 0.0
    steps = progress.steps + 1
    truncated = not won and steps >= self.max_steps
    done = won or truncated
    observation = self._with_admissible(observation, done)
    self._progress = _Progress(commands=commands, operators=operators, steps=steps, done=done,
                               truncated=truncated, success=won, observation=observation)
    info = {"success": won, "steps": steps}
    if reason is not None:
      info["invalid_action"] = reason
    return Step(observation=observation, reward=reward, done=done, truncated=truncated, info=info)

  def snapshot(self) -> Snapshot:
    progress = self._require_progress()
    header = json.dumps({
        "digest": self._task.digest.hex(), "commands": list(progress.commands),
        "operators": list(progress.operators),
        "steps": progress.steps, "done": progress.done, "truncated": progress.truncated,
        "success": progress.success, "observation": progress.observation,
        "max_steps": self.max_steps,
    }).encode("utf-8")
    data = _SNAPSHOT_MAGIC + struct.pack("<I", len(header)) + header + self._task_blob
    return Snapshot(data=data, handle=(self._engine_state(), progress))

  def restore(self, snapshot: Snapshot) -> None:
    self._require_open()
    if not isinstance(snapshot, Snapshot):
      raise TypeError(f"restore expects a Snapshot, got {type(snapshot).__name__}")
    handle = snapshot.handle
    if (handle is not None and handle[0].engine is self._pddl_env
        and handle[0].epoch == self._epoch):
      self._set_engine_state(handle[0])
      self._progress = handle[1]
      return
    header, game_blob = _decode_snapshot(snapshot.data)
    if self._task is None or self._task.digest.hex() != header["digest"]:
      self._load(AlfworldTask(**json.loads(zlib.decompress(game_blob).decode("utf-8"))))
    else:
      self._set_engine_state(self._initial)
    # The portable path: apply the recorded operators to the engine's initial state.
    self._fast_forward(header["operators"])
    self._progress = _Progress(commands=tuple(header["commands"]),
                               operators=tuple(header["operators"]), steps=header["steps"],
                               done=header["done"], truncated=header["truncated"],
                               success=header["success"], observation=header["observation"])

  def close(self) -> None:
    """Frees this sandbox's Fast Downward state and hands its engine to the next sandbox of the
    process; the sandbox cannot be used afterwards. Closing twice is a no-op.

    Each engine loads its own copy of the Fast Downward library, which stays mapped: unloading
    it (`fast_downward.close_lib`, a dlclose) leaves exit-time destructors pointing into
    unmapped code, and the process then dies with a segmentation fault at exit. So engines are
    reused rather than unloaded (`_SPARE_ENGINES`); the next game load replaces all of the
    engine's state, and a snapshot's in-process handle from this sandbox never matches a later
    load (`_LOADS`), so it restores through its portable data.
    """
    if self._closed:
      return
    self._pddl_env.downward_lib.cleanup()
    self._closed = True
    self._progress = None
    self._initial = None
    _SPARE_ENGINES.append((self._pddl_env, self._env))

  # -- extras --------------------------------------------------------------------------------

  def expert_actions(self) -> list[str]:
    """Commands that reach the goal from the current state; [] once the episode is over.

    Fast Downward's plan on the game's PDDL from the engine's current state (ALFWorld's
    "planner" expert: it knows where everything is, so its plans are short). When the planner
    finds no plan at the start of a game, the game file's walkthrough (the hand-coded expert's
    episode) is returned instead.
    """
    progress = self._require_progress()
    if progress.done:
      return []
    env = self._pddl_env
    plan = env._pddl_state.replan(env._entity_infos)  # pylint: disable=protected-access
    if not plan and not progress.commands and progress.steps == 0:
      plan = list(self._task.walkthrough or [])
    return list(plan)

  def admissible_actions(self) -> list[str]:
    """The commands the game accepts now (sorted, as the engine lists them)."""
    self._require_progress()
    return list(self._pddl_env.state["admissible_commands"])

  def _with_admissible(self, observation: str, done: bool) -> str:
    if not self.admissible_commands or done:
      return observation
    commands = self._pddl_env.state["admissible_commands"]
    return f"{observation.rstrip()}\n\nAdmissible commands: {', '.join(commands)}"

  @property
  def task(self) -> AlfworldTask | None:
    return self._task

  # -- internals -----------------------------------------------------------------------------

  def _require_progress(self) -> _Progress:
    self._require_open()
    if self._progress is None:
      raise RuntimeError("call reset(task) or restore(snapshot) before using the sandbox")
    return self._progress

  def _require_open(self) -> None:
    if self._closed:
      raise RuntimeError("the ALFWorld sandbox is closed")

  def _load(self, task: AlfworldTask) -> None:
    self._env.load(task.game_data)
    self._env.reset()
    self._epoch = next(_LOADS)
    self._task = task
    self._task_blob = zlib.compress(json.dumps(dataclasses.asdict(task)).encode("utf-8"), 6)
    self._initial = self._engine_state()

  # The engine keeps its state in private attributes of TextWorld's PddlEnv and PddlState;
  # reading and writing them is what makes a restore free of replay.
  # pylint: disable=protected-access

  def _engine_state(self) -> _EngineState:
    env = self._pddl_env
    pddl_state = env._pddl_state
    facts = (
        {k: set(v) for k, v in pddl_state._facts.items()},
        dict(pddl_state._vars_by_name),
        {k: set(v) for k, v in pddl_state._vars_by_type.items()},
        dict(pddl_state._var_counts),
    )
    return _EngineState(engine=env, epoch=self._epoch,
                        state_id=int(env.downward_lib.get_state_id()), facts=facts,
                        game_state=env.state, prev_state=env.prev_state,
                        operators=getattr(pddl_state, "_operators", None), moves=env._moves,
                        last_action=env._last_action)

  def _fast_forward(self, operator_names: Sequence[str]) -> None:
    """Applies Fast Downward operators by name from the current state, then rebuilds the game
    state's admissible commands once.

    The same operators the engine applied when the commands were played, without deriving the
    text of each intermediate step (most of a step's cost); the observation of the last step
    comes from the snapshot. When several applicable operators share a name the engine takes
    the first, as here.
    """
    import fast_downward  # pylint: disable=g-import-not-at-top
    import textworld.core  # pylint: disable=g-import-not-at-top
    env = self._pddl_env
    pddl_state = env._pddl_state
    lib = env.downward_lib
    last = None
    for name in operator_names:
      operators = (fast_downward.Operator * lib.get_applicable_operators_count())()
      lib.get_applicable_operators(operators)
      operator = next((op for op in operators if op.name == name), None)
      if operator is None:
        raise ValueError(f"the snapshot's operator {name!r} does not apply here: the game or "
                         "the engine differs from the one that took the snapshot")
      pddl_state._operators = {operator.id: operator}
      last = types.SimpleNamespace(id=operator.id)
      pddl_state.apply(last)
    if not operator_names:
      return
    env.prev_state = env.state
    env.state = textworld.core.GameState()
    env._last_action = last
    env._moves = len(operator_names)
    env._gather_infos()

  def _set_engine_state(self, saved: _EngineState) -> None:
    env = self._pddl_env
    pddl_state = env._pddl_state
    env.downward_lib.set_state_id(saved.state_id)
    facts, by_name, by_type, counts = saved.facts
    # Fresh copies: the engine updates these in place as the game goes on.
    pddl_state._facts = collections.defaultdict(set, {k: set(v) for k, v in facts.items()})
    pddl_state._vars_by_name = dict(by_name)
    pddl_state._vars_by_type = collections.defaultdict(set,
                                                       {k: set(v) for k, v in by_type.items()})
    pddl_state._var_counts = collections.Counter(counts)
    pddl_state._operators = saved.operators
    env.state = saved.game_state
    env.prev_state = saved.prev_state
    env._moves = saved.moves
    env._last_action = saved.last_action

  # pylint: enable=protected-access


def _decode_snapshot(data: bytes) -> tuple[dict, bytes]:
  """Splits a snapshot's bytes into its header and zlib'd game (see AlfworldSandbox.snapshot)."""
  if not isinstance(data, (bytes, bytearray)) or data[:len(_SNAPSHOT_MAGIC)] != _SNAPSHOT_MAGIC:
    raise ValueError("not an ALFWorld sandbox snapshot (bad magic bytes)")
  offset = len(_SNAPSHOT_MAGIC)
  (header_len,) = struct.unpack_from("<I", data, offset)
  offset += 4
  header = json.loads(bytes(data[offset:offset + header_len]).decode("utf-8"))
  return header, bytes(data[offset + header_len:])


def make_sandbox(**config) -> AlfworldSandbox:
  """A fresh ALFWorld sandbox (max_steps, max_action_chars); task options are accepted and
  ignored, so one options dict serves make_sandbox and make_tasks."""
  sandbox_config, _ = _split_options(config)
  return AlfworldSandbox(**sandbox_config)
