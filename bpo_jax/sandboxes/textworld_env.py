"""TextWorld games as sandboxes, played through Jericho (extra `textworld`).

A TextWorld game is a `.z8` story file (run by Jericho's Z-machine) with a `.json` file beside
it (TextWorld's game description: world facts, quests, rewards). The sandbox runs the story
file directly in `jericho.FrotzEnv` and keeps TextWorld's `GameProgression` (world facts and
quest progress) up to date from the Inform 7 action events the game prints once
`tw-trace-actions` is on, as TextWorld's own `TWInform7` wrapper does.

A snapshot is the Z-machine state (memory, stack, program counter and its random generator,
from `FrotzEnv.get_state()`) plus the game progression, pickled so any process that has the
game files can restore it. The progression is pickled without the static game data (the game,
its knowledge base, quests and events are written as references and resolved against the
restoring process's copy), and TextWorld's `State` as its list of facts, which keeps snapshots
small and fast. There is no in-process handle: unpickling the progression measured faster than
`GameProgression.copy()`, so the bytes are the fast path too. TextWorld's `env.copy()` is not
used: it copies the whole wrapper stack and is much slower (see `benchmarks/sandboxes.py`).

Observation: the game's text with the status line removed; the first one starts with the
game's objective. Reward: the increase of TextWorld's quest score. `done` when the game is won
or lost or after `max_steps` actions; `info["success"]` says whether it was won.

Module interface (see `registry.py`); games live in `games_dir/train/*.z8` and
`games_dir/test/*.z8`, as written by `scripts/make_textworld_games.py`:

    sandbox = make_sandbox(max_steps=100)
    tasks = make_tasks("train", num=2, seed=0, games_dir="tests/fixtures/textworld_games")

For language-model agents, `SYSTEM_PROMPT` states the command syntax and `parse_action(text)`
takes the command out of a reply (the first line that starts with one of TextWorld's command
verbs; see `free_text.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import pickle
import random
import re
import warnings
from typing import Any

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import free_text

try:
  import jericho
  import textworld
  from textworld import logic as tw_logic
  from textworld.envs.wrappers import tw_inform7
  from textworld.generator import game as tw_game
  from textworld.generator import inform7 as tw_inform7_game
except ImportError as error:  # pragma: no cover - depends on the optional extra
  raise ImportError(
      "the textworld environment needs the `textworld` extra: pip install 'bpo_jax[textworld]'"
  ) from error

_STATUS_LINE = re.compile(r"\n>[^\n]*$")
_RESTART_PROMPT = re.compile(r"\s*Would you like to RESTART, RESTORE[^\n]*$")
_WON = "*** The End ***"
_LOST = "*** You lost! ***"

# The first words of the commands of TextWorld's grammar (its default knowledge base).
COMMAND_VERBS = ("look", "goal", "inventory", "examine", "go", "take", "drop", "put", "insert",
                 "open", "close", "lock", "unlock", "eat", "drink", "cook", "slice", "chop",
                 "dice", "prepare")
SYSTEM_PROMPT = ("You play a text adventure. Reply with one command, such as: go east, take "
                 "<thing>, take <thing> from <container>, open <container>, unlock <container> "
                 "with <key>, insert <thing> into <container>, put <thing> on <supporter>, "
                 "examine <thing>, look, inventory.")
NO_ACTION_HINT = "Reply with one command such as 'look' or 'go east'."


def parse_action(text: str) -> str | None:
  """The first line of a reply that starts with a TextWorld command verb; None if none does.

  >>> parse_action("The box is locked.\\nunlock box with latchkey")
  'unlock box with latchkey'
  """
  return free_text.first_command(text, COMMAND_VERBS)


def _interpreter_problem(text: str) -> str | None:
  """Why the interpreter cannot take `text` as one command, or None.

  The interpreter reads a line per command: a second line would be taken as the next turn's
  command (its output then served a turn late), and a backslash starts one of the interpreter's
  own escapes: at the start of a line some wait for input forever, within one they edit the
  line (`x \\q` reaches the game as `x`). No command of TextWorld's grammar holds one.
  """
  if "\n" in text:
    return "an action is one line"
  if "\\" in text:
    return "an action cannot hold a backslash (the interpreter's escape character)"
  return None


@dataclasses.dataclass(frozen=True)
class TextWorldTask:
  """One game: `game_file` is the `.z8` path (its `.json` lies beside it)."""

  task_id: str
  game_file: str


class _GameData:
  """The static data of one game, loaded once per process, and the pickling that skips it."""

  def __init__(self, game_file: str):
    json_file = os.path.splitext(game_file)[0] + ".json"
    if not os.path.isfile(game_file) or not os.path.isfile(json_file):
      raise FileNotFoundError(f"TextWorld game needs {game_file} and {json_file}")
    self.game = textworld.Game.load(json_file)
    self.inform7 = tw_inform7_game.Inform7Game(self.game)
    self.static: dict[str, Any] = {"game": self.game, "kb": self.game.kb,
                                   "logic": self.game.kb.logic}
    for i, quest in enumerate(self.game.quests):
      self.static[f"quest{i}"] = quest
      for j, event in enumerate(quest.win_events):
        self.static[f"quest{i}/win{j}"] = event
      for j, event in enumerate(quest.fail_events):
        self.static[f"quest{i}/fail{j}"] = event
    self._static_ids = {id(obj): key for key, obj in self.static.items()}

  def dumps(self, obj: Any, buffer: io.BytesIO) -> None:
    _ProgressionPickler(buffer, self._static_ids).dump(obj)

  def load(self, stream: io.BytesIO) -> Any:
    unpickler = pickle.Unpickler(stream)
    unpickler.persistent_load = self.static.__getitem__
    return unpickler.load()


class _ProgressionPickler(pickle.Pickler):
  """Writes static game objects as references and a `State` as its facts."""

  def __init__(self, buffer, static_ids):
    super().__init__(buffer, protocol=5)
    self._static_ids = static_ids

  def persistent_id(self, obj):
    return self._static_ids.get(id(obj))

  def reducer_override(self, obj):
    kind = type(obj)
    # A State rebuilds its indexes from its facts; pickling only the facts is ~8x smaller.
    if kind is tw_logic.State:
      return tw_logic.State, (obj._logic, list(obj.facts))  # pylint: disable=protected-access
    # These cache hash((name, ...)) in a slot. String hashes differ between processes (hash
    # randomisation), so a pickled cache would be wrong in the restoring process: rebuild them
    # through their constructors, which recompute it.
    if kind is tw_logic.Proposition:
      return tw_logic.Proposition, (obj.name, obj.arguments)
    if kind in (tw_logic.Variable, tw_logic.Placeholder):
      return kind, (obj.name, obj.type)
    if kind is tw_logic.Signature:
      return tw_logic.Signature, (obj.name, obj.types)
    return NotImplemented


@functools.lru_cache(maxsize=64)
def _game_data(game_file: str) -> _GameData:
  return _GameData(game_file)


def clean_text(raw: str) -> str:
  """Game output without the trailing prompt and status line (or the interpreter's question
  after the end), whitespace trimmed.

  >>> clean_text("You take the key.\n\n>   -= Kitchen =-0/2")
  'You take the key.'
  """
  return _RESTART_PROMPT.sub("", _STATUS_LINE.sub("", raw)).strip()


class TextWorldSandbox:
  """A TextWorld game in Jericho behind the `Sandbox` protocol (see the module docstring)."""

  _SNAPSHOT_VERSION = 1

  def __init__(self, max_steps: int = 100, vm_seed: int = 0):
    if max_steps < 1:
      raise ValueError(f"max_steps must be positive, got {max_steps}")
    self.max_steps = int(max_steps)
    self.vm_seed = int(vm_seed)
    self._frotz = None
    self._game_file: str | None = None
    self._data: _GameData | None = None
    self._task: TextWorldTask | None = None
    self._progression = None
    self._steps = 0
    self._over = False

  def _load(self, task: TextWorldTask):
    game_file = os.path.abspath(task.game_file)
    if self._game_file != game_file:
      if self._frotz is not None:
        self._frotz.close()
      self._data = _game_data(game_file)
      with warnings.catch_warnings():
        # Jericho cannot read score and moves from TextWorld's story files; the score comes
        # from the game progression instead, so its warning says nothing useful here.
        warnings.simplefilter("ignore", jericho.UnsupportedGameWarning)
        self._frotz = jericho.FrotzEnv(game_file, self.vm_seed)
      self._game_file = game_file
    self._task = task

  def _require_task(self):
    if self._task is None:
      raise RuntimeError("TextWorldSandbox: call reset(task) or restore(snapshot) first")

  def reset(self, task: TextWorldTask) -> str:
    if not isinstance(task, TextWorldTask):
      raise TypeError(f"reset expects a TextWorldTask, got {type(task).__name__}")
    self._load(task)
    raw, _ = self._frotz.reset()
    self._frotz.step("tw-trace-actions")  # the game now prints the Inform 7 events it runs
    self._progression = tw_game.GameProgression(self._data.game, track_quests=True)
    self._steps = 0
    self._over = False
    text = clean_text(raw)
    objective = self._data.game.objective
    if objective and objective in text:
      text = text[text.index(objective):]  # drop the title banner before the objective
    elif objective:
      text = f"{objective}\n\n{text}"
    return text

  def step(self, action: Any) -> base.Step:
    self._require_task()
    if self._over:
      return base.Step("The game is over.", 0.0, True, False, {"success": False})
    text, reason = base.check_action(action, max_chars=200)
    if reason is None:
      reason = _interpreter_problem(text)
    self._steps += 1
    truncated = self._steps >= self.max_steps
    if reason is not None:
      self._over = truncated
      info = {"invalid_action": reason}
      if truncated:
        info["success"] = False
      step = base.invalid_action_step(reason)
      return base.Step(step.observation, 0.0, truncated, truncated, info)
    score_before = self._progression.score
    raw, _, _, _ = self._frotz.step(text)
    events, raw = tw_inform7._detect_i7_events_debug_tags(raw)  # pylint: disable=protected-access
    for event in events:
      tw_action = self._data.inform7.detect_action(event, self._progression.valid_actions)
      if tw_action is not None:
        self._progression.update(tw_action)
    won = _WON in raw or self._progression.completed
    lost = _LOST in raw or self._progression.failed
    reward = float(self._progression.score - score_before)
    finished = won or lost
    truncated = truncated and not finished
    self._over = finished or truncated
    info = {}
    if self._over:
      info["success"] = bool(won)
    return base.Step(clean_text(raw), reward, self._over, truncated, info)

  def admissible_actions(self) -> list[str]:
    """TextWorld's admissible commands at the current state, sorted."""
    self._require_task()
    if self._over:
      return []
    actions = self._data.inform7.gen_commands_from_actions(self._progression.valid_actions)
    return sorted(set(actions))

  def expert_actions(self) -> list[str]:
    """TextWorld's winning policy from the current state (empty when none is known)."""
    self._require_task()
    policy = self._progression.winning_policy
    return [] if policy is None else self._data.inform7.gen_commands_from_actions(policy)

  def snapshot(self) -> base.Snapshot:
    self._require_task()
    vm_state = self._frotz.get_state()
    header = (self._SNAPSHOT_VERSION, self._task.task_id, self._task.game_file, self._steps,
              self._over)
    # Two pickles back to back: the plain header names the game whose static data resolves the
    # references in the second.
    buffer = io.BytesIO()
    pickle.dump(header, buffer, protocol=5)
    self._data.dumps((vm_state, self._progression), buffer)
    return base.Snapshot(buffer.getvalue())

  def restore(self, snapshot: base.Snapshot) -> None:
    if not isinstance(snapshot, base.Snapshot):
      raise TypeError(f"restore expects a Snapshot, got {type(snapshot).__name__}")
    stream = io.BytesIO(snapshot.data)
    header = pickle.load(stream)
    vm_state, progression = _game_data(os.path.abspath(header[2])).load(stream)
    version, task_id, game_file, steps, over = header
    if version != self._SNAPSHOT_VERSION:
      raise ValueError(f"textworld snapshot version {version} is not {self._SNAPSHOT_VERSION}")
    self._load(TextWorldTask(task_id=task_id, game_file=game_file))
    self._frotz.set_state(vm_state)
    self._progression = progression
    self._steps = steps
    self._over = over

  def close(self) -> None:
    if self._frotz is not None:
      self._frotz.close()
    self._frotz = None
    self._game_file = None
    self._task = None
    self._progression = None


def make_sandbox(max_steps: int = 100, vm_seed: int = 0, **unused) -> TextWorldSandbox:
  del unused  # e.g. `games_dir`, which belongs to the tasks
  return TextWorldSandbox(max_steps=max_steps, vm_seed=vm_seed)


def make_tasks(split: str, num: int, seed: int, games_dir: str | None = None,
               **unused) -> list[TextWorldTask]:
  """Tasks for the games in `games_dir/<split>/`, in an order shuffled by `seed`.

  When `num` exceeds the number of games, the list repeats them; repeated tasks get ids
  ending in `#k`.
  """
  del unused
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if games_dir is None:
    raise ValueError("textworld.make_tasks needs games_dir= (a folder with train/ and test/ "
                     "game files, written by scripts/make_textworld_games.py)")
  folder = os.path.join(games_dir, split)
  if not os.path.isdir(folder):
    raise FileNotFoundError(f"no {split} games: {folder} is not a folder (write them with "
                            "scripts/make_textworld_games.py)")
  games = sorted(f for f in os.listdir(folder) if f.endswith(".z8"))
  if not games:
    raise FileNotFoundError(f"no .z8 games in {folder}")
  random.Random(f"textworld/{seed}").shuffle(games)
  tasks = []
  for i in range(num):
    name = games[i % len(games)]
    repeat = i // len(games)
    task_id = f"textworld-{split}-{os.path.splitext(name)[0]}"
    if repeat:
      task_id = f"{task_id}#{repeat}"
    tasks.append(TextWorldTask(task_id=task_id, game_file=os.path.join(folder, name)))
  return tasks
