"""ALFWorld's game directories: the task types, the files of a game, and the task they load as.

A game is a directory

    <split>/<task_type>-<Object>-<MovableRecep>-<Parent>-<scene>/<trial>/
        initial_state.pddl   the household layout and the goal, in the ALFRED PDDL domain
        traj_data.json       the task: task_type and pddl_params (object/parent/toggle targets)
        game.tw-pddl         JSON: pddl_domain, grammar (task text filled in), pddl_problem,
                             solvable, walkthrough

Real and generated game directories load through the same function, `load_game_dir`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Any, Mapping

from bpo_jax.sandboxes.alfworld.engine import _alfworld

# The six ALFWorld task types, in ALFWorld's numbering (1..6).
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
PDDL_FILE = "initial_state.pddl"


@dataclasses.dataclass(frozen=True)
class AlfworldTask:
  """One ALFWorld game, self-contained and picklable.

  Attributes:
    task_id: stable id, the game directory relative to the data root, e.g.
      "train/pick_and_place_simple-Mug-None-Cabinet-12/trial_T20260101_000000_000000".
    task_type: one of TASK_TYPES.
    game: the text of game.tw-pddl (JSON with pddl_domain, grammar, pddl_problem, ...).
    traj_data: the text of traj_data.json.
  """

  task_id: str
  task_type: str
  game: str
  traj_data: str

  @property
  def game_data(self) -> dict:
    return json.loads(self.game)

  @property
  def pddl_params(self) -> dict:
    return dict(json.loads(self.traj_data)["pddl_params"])

  @property
  def walkthrough(self) -> list[str] | None:
    return self.game_data.get("walkthrough")

  @functools.cached_property
  def digest(self) -> bytes:
    """A content hash: two tasks with the same digest play identically."""
    return hashlib.sha256(self.game.encode("utf-8")).digest()[:16]


def load_game_dir(path: str, root: str | None = None) -> AlfworldTask:
  """Loads one ALFWorld game directory (real or generated) as a task.

  Args:
    path: a directory holding game.tw-pddl and traj_data.json.
    root: the data root the task id is made relative to (default: three levels up, so the id is
      "<split>/<task dir>/<trial dir>" for the standard json_2.1.1 layout).

  Raises:
    FileNotFoundError: a file is missing.
    ValueError: the files are not in ALFWorld's format (names what is wrong).
  """
  path = os.path.abspath(path)
  for name in (GAME_FILE, TRAJ_FILE):
    if not os.path.isfile(os.path.join(path, name)):
      raise FileNotFoundError(f"{path} has no {name}: not an ALFWorld game directory")
  with open(os.path.join(path, GAME_FILE), encoding="utf-8") as f:
    game_text = f.read()
  with open(os.path.join(path, TRAJ_FILE), encoding="utf-8") as f:
    traj_text = f.read()
  try:
    game = json.loads(game_text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}/{GAME_FILE} is not JSON: {e}") from e
  try:
    traj = json.loads(traj_text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}/{TRAJ_FILE} is not JSON: {e}") from e
  missing = [k for k in ("pddl_domain", "grammar", "pddl_problem") if k not in game]
  if missing:
    raise ValueError(f"{path}/{GAME_FILE} lacks the keys {missing}")
  if "task_type" not in traj or "pddl_params" not in traj:
    raise ValueError(f"{path}/{TRAJ_FILE} lacks task_type or pddl_params")
  if traj["task_type"] not in TASK_TYPES:
    raise ValueError(f"{path}: task_type {traj['task_type']!r} is not one of {TASK_TYPES}")
  if "UNKNOWN GOAL" in game["grammar"]:
    # A game file written before its task text was chosen: fill it from traj_data as
    # alfworld-generate does, with the first goal template (deterministic).
    game["grammar"] = game["grammar"].replace("UNKNOWN GOAL", task_description(traj, 0))
    game_text = json.dumps(game)
  root = root if root is not None else os.path.dirname(os.path.dirname(os.path.dirname(path)))
  task_id = os.path.relpath(path, root).replace(os.sep, "/")
  return AlfworldTask(task_id=task_id, task_type=traj["task_type"], game=game_text,
                      traj_data=traj_text)


def find_game_dirs(data_path: str, split: str | None = None,
                   solvable_only: bool = True) -> list[str]:
  """Sorted game directories under `data_path[/split]`, as ALFWorld's loader collects them.

  Like ALFWorld, skips movable-receptacle and sliced tasks and (by default) games whose
  game.tw-pddl is not marked solvable.
  """
  base = os.path.join(data_path, split) if split else data_path
  if not os.path.isdir(base):
    raise FileNotFoundError(f"no ALFWorld data directory at {base}")
  found = []
  for root, _, files in os.walk(base):
    if TRAJ_FILE not in files or GAME_FILE not in files:
      continue
    if "movable" in root or "Sliced" in root:
      continue
    if solvable_only and not _read_json(root, GAME_FILE).get("solvable"):
      continue
    found.append(root)
  return sorted(found)


def _read_json(directory: str, name: str) -> Any:
  with open(os.path.join(directory, name), encoding="utf-8") as f:
    return json.load(f)


def task_description(traj_data: Mapping[str, Any], template_index: int) -> str:
  """The templated goal text ALFWorld shows ("put a clean mug in cabinet")."""
  glib = _alfworld(engine=False)["goal_library"]
  params = traj_data["pddl_params"]
  templates = glib.gdict[traj_data["task_type"]]["templates"]
  template = templates[template_index % len(templates)]
  return template.format(obj=params["object_target"].lower(), recep=params["parent_target"].lower(),
                         toggle=params["toggle_target"].lower(),
                         mrecep=params["mrecep_target"].lower())
