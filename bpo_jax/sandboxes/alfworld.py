"""ALFWorld on ALFWorld's own text engine, with a generator of ALFWorld games.

ALFWorld (Shridhar et al., 2021) plays ALFRED household tasks as text. Each game is a directory

    <split>/<task_type>-<Object>-<MovableRecep>-<Parent>-<scene>/<trial>/
        initial_state.pddl   the household layout and the goal, in the ALFRED PDDL domain
        traj_data.json       the task: task_type and pddl_params (object/parent/toggle targets)
        game.tw-pddl         JSON: pddl_domain, grammar (task text filled in), pddl_problem,
                             solvable, walkthrough

and is played by TextWorld's PDDL engine (`textworld.envs.PddlEnv`, a Fast Downward state
machine plus a context-sensitive grammar for the text), with ALFWorld's demangler turning ids such
as `Mug_bar__plus_00_dot_12_...` into names such as `mug 1`. The `alfworld` wheel ships the domain
(`alfred.pddl`) and grammar (`alfred.twl2`); the game files themselves are a separate download, so
this module also *generates* games of all six task types over generated household layouts, written
in the same format, and checks each with ALFWorld's hand-coded expert. Real and generated game
directories load through the same function, `load_game_dir`.

    tasks = make_tasks("train", num=4, seed=0)          # generated, expert-checked
    sb = make_sandbox(max_steps=50)
    obs = sb.reset(tasks[0])                            # "-= Welcome to TextWorld, ALFRED! =- ..."
    sb.admissible_actions()                             # ["go to cabinet 1", ..., "look"]
    step = sb.step("go to countertop 1")
    snap = sb.snapshot(); sb.restore(snap)

Generated games. A room kind is drawn among those ALFRED allows for the task type (heat and cool:
kitchens; examine in light: living rooms and bedrooms; ...), then its receptacles (each at its own
location, ids in ALFRED's "Class|x|y|z" form), the task's object class (one with the ability the
task needs: Cleanable, Heatable, Coolable, from ALFRED's tables) and goal receptacle class (one
that can contain it, never the appliance), the target instances (never already in a goal-class
receptacle, so the goal cannot hold at the start; two in one receptacle for pick-two), a desk
lamp for examine-in-light, and distractor objects where ALFRED's affordances allow them. The goal
is ALFWorld's own PDDL goal for the type (`alfworld.gen.goal_library`) and the task text one of
its templates. A game is kept only if ALFWorld's hand-coded expert solves it on the engine; its
commands are stored as the game's walkthrough.

Snapshots. In-process, a snapshot's `handle` is the engine state itself: the Fast Downward state
id (its state registry keeps every visited state), a copy of the Python-side fact set and the last
game state, so `restore` costs no replay. `Snapshot.data` is the portable form: the game (zlib),
the commands taken since reset and the Fast Downward operators they applied; another process
restores it by applying those operators to the game's initial state (no text is derived for the
intermediate steps, so this costs ~2 ms a step against ~40 ms for replaying the commands). The
engine has no randomness (the grammar has one production per rule and the demangler's numbering
is not shuffled), so observations, rewards and done flags are identical either way.

Speed. The engine re-parses its grammar at every step and translates a game's PDDL at every
load and reset; this module memoises both process-wide (`_install_engine_caches`, checked against
the uncached engine by the tests), which brings a step from ~150 ms to ~40 ms.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import types
import zlib
from typing import Any, Mapping, Sequence

from bpo_jax.sandboxes.base import (MAX_ACTION_CHARS, Snapshot, Step, check_action,
                                    invalid_action_step)

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

_SNAPSHOT_MAGIC = b"BPOALFW1"

# ---------------------------------------------------------------------------------------------
# The ALFWorld package: imported lazily so that `import bpo_jax.sandboxes` stays light.
# ---------------------------------------------------------------------------------------------


def _alfworld(engine: bool = True):
  """The pieces of alfworld (and, with `engine`, of textworld) used here, imported on first use.

  The generator needs only ALFWorld's data modules (milliseconds to import); the engine needs
  textworld, whose import takes seconds.
  """
  try:
    import alfworld.gen.constants as constants  # pylint: disable=g-import-not-at-top
    import alfworld.gen.goal_library as goal_library  # pylint: disable=g-import-not-at-top
    import alfworld.info as info  # pylint: disable=g-import-not-at-top
    modules = dict(constants=constants, goal_library=goal_library, info=info)
    if engine:
      import textworld  # pylint: disable=g-import-not-at-top
      from alfworld.agents.environment import alfred_tw_env  # pylint: disable=g-import-not-at-top
      from textworld.envs import PddlEnv  # pylint: disable=g-import-not-at-top
      modules.update(textworld=textworld, alfred_tw_env=alfred_tw_env, PddlEnv=PddlEnv)
  except ImportError as e:
    raise ImportError(
        "The ALFWorld sandbox needs the `alfworld` package (and textworld[pddl]); install it "
        'with `pip install -e ".[alfworld]"`.') from e
  return modules


def alfred_logic() -> tuple[str, str]:
  """The ALFRED PDDL domain and the TextWorld grammar shipped in the alfworld wheel."""
  info = _alfworld(engine=False)["info"]
  with open(info.ALFRED_PDDL_PATH, encoding="utf-8") as f:
    domain = f.read()
  with open(info.ALFRED_TWL2_PATH, encoding="utf-8") as f:
    grammar = f.read()
  return domain, grammar


# ---------------------------------------------------------------------------------------------
# Tasks and game directories.
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# The generator: household layouts and tasks in ALFWorld's game format.
# ---------------------------------------------------------------------------------------------

# Receptacle classes per room kind with (min, max) counts, after ALFRED's four scene kinds. Every
# receptacle stands at its own location, as in ALFWorld's games.
ROOM_RECEPTACLES = {
    "Kitchen": {
        "Cabinet": (2, 6), "Drawer": (1, 4), "CounterTop": (1, 2), "Fridge": (1, 1),
        "Microwave": (1, 1), "SinkBasin": (1, 1), "StoveBurner": (2, 4), "DiningTable": (0, 1),
        "CoffeeMachine": (1, 1), "GarbageCan": (1, 1), "Toaster": (1, 1), "Shelf": (0, 2),
    },
    "LivingRoom": {
        "Sofa": (1, 1), "ArmChair": (0, 2), "CoffeeTable": (1, 1), "SideTable": (1, 2),
        "Drawer": (0, 3), "Cabinet": (0, 2), "Shelf": (0, 3), "Dresser": (0, 1),
        "GarbageCan": (1, 1), "TVStand": (0, 1), "DiningTable": (0, 1),
    },
    "Bedroom": {
        "Bed": (1, 1), "Desk": (0, 1), "SideTable": (1, 2), "Dresser": (0, 1), "Drawer": (2, 5),
        "Shelf": (0, 3), "GarbageCan": (1, 1), "ArmChair": (0, 1), "LaundryHamper": (0, 1),
        "Safe": (0, 1),
    },
    "Bathroom": {
        "Toilet": (1, 1), "SinkBasin": (1, 2), "BathtubBasin": (0, 1), "CounterTop": (1, 1),
        "Cabinet": (2, 4), "Drawer": (0, 3), "TowelHolder": (1, 1), "HandTowelHolder": (1, 1),
        "ToiletPaperHanger": (1, 1), "GarbageCan": (1, 1), "Shelf": (0, 2),
    },
}
# ALFRED's scene numbers per room kind (FloorPlan1-30 kitchens, 201-230 living rooms, ...).
ROOM_SCENES = {"Kitchen": 0, "LivingRoom": 200, "Bedroom": 300, "Bathroom": 400}
# Where a desk lamp can stand for look_at_obj_in_light.
LAMP_RECEPTACLES = ("Desk", "SideTable", "Dresser")
# Receptacles that stand inside a larger fixture in ALFRED ids ("Sink|...|SinkBasin"): the
# demangler names them "sinkbasin 1", so their ids must keep that shape.
_BASIN_FIXTURE = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}
# Receptacles that cannot be the place a task's object must end up in.
_NOT_A_PARENT = {"GarbageCan", "Toaster", "CoffeeMachine", "StoveBurner"}
# For state-changing tasks, the appliance that changes the state is not the goal's receptacle.
_APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin",
              "pick_heat_then_place_in_recep": "Microwave",
              "pick_cool_then_place_in_recep": "Fridge"}
_ABILITY = {"pick_clean_then_place_in_recep": "Cleanable",
            "pick_heat_then_place_in_recep": "Heatable",
            "pick_cool_then_place_in_recep": "Coolable"}


def _mangle(name: str) -> str:
  """ALFRED id -> PDDL name, as ALFWorld writes it ('Mug|+00.12' -> 'Mug_bar__plus_00_dot_12')."""
  table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
  return "".join(table.get(c, c) for c in name)


def _coord(rng: random.Random) -> str:
  return f"{rng.uniform(-4.0, 4.0):+06.2f}"


@dataclasses.dataclass
class _Thing:
  cls: str
  pddl_id: str


def _layout_problem(rng: random.Random, task_type: str, problem_name: str,
                    num_distractors: Sequence[int]) -> tuple[str, dict, str] | None:
  """Samples one household and a task of `task_type` in it.

  Returns (initial_state.pddl text, pddl_params, room kind), or None when the sampled room
  cannot host the task (the caller draws again).
  """
  c = _alfworld(engine=False)["constants"]
  room = rng.choice(sorted(c.GOALS_VALID[task_type]))
  counts = {cls: rng.randint(lo, hi) for cls, (lo, hi) in sorted(ROOM_RECEPTACLES[room].items())}
  if task_type == "look_at_obj_in_light" and not any(counts.get(r, 0) for r in LAMP_RECEPTACLES):
    counts["SideTable"] = 1
  receptacles: list[_Thing] = []
  used_ids = set()
  for cls, n in counts.items():
    for _ in range(n):
      while True:
        coords = "|".join(_coord(rng) for _ in range(3))
        rid = (f"{_BASIN_FIXTURE[cls]}|{coords}|{cls}" if cls in _BASIN_FIXTURE
               else f"{cls}|{coords}")
        if rid not in used_ids:
          used_ids.add(rid)
          break
      receptacles.append(_Thing(cls, _mangle(rid)))
  rng.shuffle(receptacles)
  classes_here = {r.cls for r in receptacles}

  def containers(obj_cls):
    return [r for r in receptacles if obj_cls in c.VAL_RECEPTACLE_OBJECTS.get(r.cls, ())]

  # Object classes this room can hold somewhere (sliced variants are not ALFWorld tasks).
  holdable = sorted({o for r in classes_here for o in c.VAL_RECEPTACLE_OBJECTS.get(r, ())
                     if "Sliced" not in o and o in c.OBJECTS})

  # The task: an object class, and a receptacle class it must end up in.
  params = {"object_target": "", "parent_target": "", "mrecep_target": "", "toggle_target": "",
            "object_sliced": False}
  ability = _ABILITY.get(task_type)
  appliance = _APPLIANCE.get(task_type)
  if appliance and appliance not in classes_here:
    return None
  candidates = [o for o in holdable if ability is None or o in c.VAL_ACTION_OBJECTS[ability]]
  if task_type == "look_at_obj_in_light":
    candidates = [o for o in candidates if o not in c.MOVABLE_RECEPTACLES_SET]
  if not candidates:
    return None
  obj_cls = rng.choice(candidates)
  params["object_target"] = obj_cls
  if task_type == "look_at_obj_in_light":
    params["toggle_target"] = "DeskLamp"
  else:
    parents = sorted({r.cls for r in containers(obj_cls)} - _NOT_A_PARENT - {appliance})
    if not parents:
      return None
    params["parent_target"] = rng.choice(parents)
  parent_cls = params["parent_target"]
  # The target must start somewhere other than the goal's receptacle class (else the goal could
  # hold at the start), and a cool task's target not in the fridge (ALFRED marks those cold).
  start_places = [r for r in containers(obj_cls) if r.cls != parent_cls and r.cls != appliance]
  if not start_places:
    return None

  objects: list[tuple[_Thing, _Thing]] = []  # (object, receptacle it is in)

  def new_object(cls, where):
    while True:
      oid = f"{cls}|" + "|".join(_coord(rng) for _ in range(3))
      if oid not in used_ids:
        used_ids.add(oid)
        break
    objects.append((_Thing(cls, _mangle(oid)), where))

  if task_type == "pick_two_obj_and_place":
    # Both instances start in one receptacle: ALFWorld's hand-coded expert goes back to where it
    # saw the class, and only a layout it can solve is kept.
    where = rng.choice(start_places)
    new_object(obj_cls, where)
    new_object(obj_cls, where)
  else:
    for _ in range(rng.randint(1, 2)):
      new_object(obj_cls, rng.choice(start_places))
  lamp_on = None
  if task_type == "look_at_obj_in_light":
    lamp_on = rng.choice([r for r in receptacles if r.cls in LAMP_RECEPTACLES])
  # Distractors: other classes, anywhere they fit (never the target class, so the goal's
  # count of target objects is what the layout says).
  others = [o for o in holdable if o != obj_cls]
  for _ in range(rng.randint(*num_distractors)):
    if not others:
      break
    cls = rng.choice(others)
    new_object(cls, rng.choice(containers(cls)))

  # Locations: one per receptacle, and the agent's start in the middle of the room.
  loc_ids = set()

  def new_location():
    while True:
      loc = "loc|%d|%d|%d|%d" % (rng.randint(-12, 12), rng.randint(-12, 12),
                                 rng.choice((0, 1, 2, 3)),
                                 rng.choice((0, 15, 30, 45, 60)))
      if loc not in loc_ids:
        loc_ids.add(loc)
        return _mangle(loc)

  recep_loc = {r.pddl_id: new_location() for r in receptacles}
  agent_loc = new_location()

  # :objects, as ALFWorld writes them: the type constants the domain and goals name, then the
  # scene's objects, receptacles and locations.
  # Only the types this game names (its classes, and the constants the domain's actions name):
  # ALFWorld's files declare all ~130, which only slows the engine's grounding down.
  all_otypes = set(c.OBJECTS) - set(c.RECEPTACLES) | c.MOVABLE_RECEPTACLES_SET
  otypes = sorted(({o.cls for o, _ in objects} | {"Knife", "ButterKnife"}
                   | ({"DeskLamp"} if lamp_on is not None else set())) & all_otypes)
  rtypes = sorted(classes_here | {"SinkBasin", "Microwave", "Fridge"})
  decl = ["agent1 - agent"]
  decl += [f"{t}Type - otype" for t in otypes]
  decl += [f"{t}Type - rtype" for t in rtypes]
  all_objects = [o for o, _ in objects]
  lamp = None
  if lamp_on is not None:
    lamp_id = _mangle("DeskLamp|" + "|".join(_coord(rng) for _ in range(3)))
    lamp = _Thing("DeskLamp", lamp_id)
  decl += [f"{o.pddl_id} - object" for o in all_objects + ([lamp] if lamp else [])]
  decl += [f"{r.pddl_id} - receptacle" for r in receptacles]
  decl += [f"{loc} - location" for loc in list(recep_loc.values()) + [agent_loc]]

  init = ["(= (total-cost) 0)"]
  init += [f"(receptacleType {r.pddl_id} {r.cls}Type)" for r in receptacles]
  init += [f"(objectType {o.pddl_id} {o.cls}Type)" for o in all_objects]
  if lamp:
    init.append(f"(objectType {lamp.pddl_id} DeskLampType)")
  for rcls in sorted(classes_here):
    for ocls in sorted(c.VAL_RECEPTACLE_OBJECTS.get(rcls, ())):
      if ocls in otypes:
        init.append(f"(canContain {rcls}Type {ocls}Type)")
  init += [f"(pickupable {o.pddl_id})" for o in all_objects]
  init += [f"(isReceptacleObject {o.pddl_id})" for o in all_objects
           if o.cls in c.MOVABLE_RECEPTACLES_SET]
  init += [f"(openable {r.pddl_id})" for r in receptacles if r.cls in c.OPENABLE_CLASS_LIST]
  init.append(f"(atLocation agent1 {agent_loc})")
  for fact, ability_name in (("cleanable", "Cleanable"), ("heatable", "Heatable"),
                             ("coolable", "Coolable"),
                             ("sliceable", "Sliceable")):
    init += [f"({fact} {o.pddl_id})" for o in all_objects
             if o.cls in c.VAL_ACTION_OBJECTS[ability_name]]
  if lamp:
    init.append(f"(toggleable {lamp.pddl_id})")
    init.append(f"(inReceptacle {lamp.pddl_id} {lamp_on.pddl_id})")
  init += [f"(inReceptacle {o.pddl_id} {r.pddl_id})" for o, r in objects]
  init += [f"(receptacleAtLocation {r.pddl_id} {recep_loc[r.pddl_id]})" for r in receptacles]
  init += [f"(objectAtLocation {o.pddl_id} {recep_loc[r.pddl_id]})" for o, r in objects]
  if lamp:
    init.append(f"(objectAtLocation {lamp.pddl_id} {recep_loc[lamp_on.pddl_id]})")

  glib = _alfworld(engine=False)["goal_library"]
  goal = glib.gdict[task_type]["pddl"].format(obj=obj_cls, recep=parent_cls,
                                             toggle=params["toggle_target"],
                                             mrecep="")
  goal = goal.replace("#", "-")
  indent = "\n        "
  problem = (f"\n(define (problem {problem_name})\n(:domain alfred)\n(:objects{indent}"
             + indent.join(decl) + f"{indent})\n\n(:init{indent}" + indent.join(init)
             + f"{indent})\n\n{goal}")
  # The goal text of the library closes the (define ...) form itself.
  return problem, params, room


def generate_game(rng: random.Random, task_type: str, trial: str, num_distractors=(6, 14)) -> dict:
  """Draws one game of `task_type`; returns its three files as {file name: text} plus its path.

  The path is "<task_type>-<Object>-None-<Parent or Toggle>-<scene>/<trial>", ALFWorld's layout.
  The game is not yet checked by the expert (see `generate_game_dirs`).
  """
  if task_type not in TASK_TYPES:
    raise ValueError(f"task_type {task_type!r} is not one of {TASK_TYPES}")
  for _ in range(1000):
    drawn = _layout_problem(rng, task_type, f"plan_{trial}", num_distractors)
    if drawn is not None:
      break
  else:
    raise RuntimeError(f"could not draw a layout for {task_type}")
  problem, params, room = drawn
  scene_num = ROOM_SCENES[room] + rng.randint(1, 30)
  traj = {
      "task_id": trial,
      "task_type": task_type,
      "pddl_params": params,
      "scene": {"floor_plan": f"FloorPlan{scene_num}", "scene_num": scene_num,
                "random_seed": rng.getrandbits(32), "init_action": {}, "object_poses": [],
                "object_toggles": [], "dirty_and_empty": False},
      "turk_annotations": {"anns": []},
      "plan": {"high_pddl": [], "low_actions": []},
      "images": [],
  }
  traj["turk_annotations"]["anns"].append(
      {"task_desc": task_description(traj, rng.randrange(2)), "high_descs": [], "votes": []})
  domain, grammar = alfred_logic()
  grammar = grammar.replace("UNKNOWN GOAL", traj["turk_annotations"]["anns"][0]["task_desc"])
  game = {"pddl_domain": domain, "grammar": grammar, "pddl_problem": problem, "solvable": None,
          "walkthrough": None}
  slot4 = params["parent_target"] or params["toggle_target"] or "None"
  task_dir = f"{task_type}-{params['object_target']}-None-{slot4}-{scene_num}"
  return {"path": f"{task_dir}/{trial}", PDDL_FILE: problem, TRAJ_FILE: json.dumps(traj, indent=2),
          GAME_FILE: game}


@contextlib.contextmanager
def _seeded_global_random(seed: int):
  # ALFWorld's hand-coded expert draws from the global `random`; seed it for reproducible
  # walkthroughs, and put the caller's generator state back afterwards.
  state = random.getstate()
  random.seed(seed)
  try:
    yield
  finally:
    random.setstate(state)


def expert_walkthrough(game_dir: str, max_steps: int = 150, seed: int = 0) -> list[str] | None:
  """Plays a game directory with ALFWorld's hand-coded expert on the engine.

  Returns the commands that reached the goal, or None if the expert failed or timed out.
  """
  aw = _alfworld()
  _install_engine_caches()
  tw_env = aw["alfred_tw_env"]
  infos = aw["textworld"].EnvInfos(admissible_commands=True, won=True,
                                   extras=["gamefile", "expert_plan"])
  env = tw_env.AlfredExpert(tw_env.AlfredInfos(tw_env.AlfredDemangler(aw["PddlEnv"](infos))),
                            expert_type=tw_env.AlfredExpertType.HANDCODED)
  commands = []
  with _seeded_global_random(seed):
    try:
      # A game the engine cannot load is a bug, not an unsolved game: that raises.
      env.load(os.path.join(game_dir, GAME_FILE))
      state = env.reset()
      done = False
      while not done and len(commands) < max_steps:
        command = state["extra.expert_plan"][0]
        try:
          state, _, done = env.step(command)
        except Exception as e:  # pylint: disable=broad-except
          # The expert gives up by raising: HandCodedAgentFailed (a NameError), or ALFWorld's
          # wrapper turns its timeout into Exception("Timeout"). Then the game is unsolved.
          if isinstance(e, NameError) or e.args == ("Timeout",):
            return None
          raise
        commands.append(command)
    finally:
      env.close()
  return commands if state["won"] else None


def _trial_name(rng: random.Random) -> str:
  # ALFRED trial ids read "trial_T<date>_<time>_<micros>"; ours are drawn, not dated.
  return "trial_T%08d_%06d_%06d" % (rng.randrange(10**8), rng.randrange(10**6),
                                    rng.randrange(10**6))


def _split_seed(split: str, seed: int) -> int:
  return int.from_bytes(hashlib.sha256(f"alfworld/{split}/{seed}".encode()).digest()[:8], "little")


def generate_game_dirs(out_dir: str, split: str, num: int, seed: int,
                       task_types: Sequence[str] = TASK_TYPES, num_distractors=(6, 14),
                       max_expert_steps: int = 150) -> list[str]:
  """Writes `num` expert-solved games to `out_dir/split/...` in ALFWorld's format.

  Task types cycle through `task_types` so that every type appears once `num >= len(task_types)`.
  Each drawn game is played by ALFWorld's hand-coded expert; a game the expert cannot solve is
  discarded and redrawn, and every written game.tw-pddl carries `solvable: true` and the expert's
  `walkthrough`, as ALFWorld's own generated files do. Deterministic in (split, num, seed, ...).

  Returns the written game directories, in generation order.
  """
  if num < 0:
    raise ValueError(f"num must be >= 0, got {num}")
  bad = [t for t in task_types if t not in TASK_TYPES]
  if bad or not task_types:
    raise ValueError(f"task_types must be a non-empty subset of {TASK_TYPES}, "
                     f"got {list(task_types)}")
  rng = random.Random(_split_seed(split, seed))
  written = []
  for i in range(num):
    task_type = task_types[i % len(task_types)]
    for attempt in range(20):
      files = generate_game(rng, task_type, _trial_name(rng), num_distractors)
      game_dir = os.path.join(out_dir, split, files["path"])
      os.makedirs(game_dir, exist_ok=True)
      for name in (PDDL_FILE, TRAJ_FILE):
        with open(os.path.join(game_dir, name), "w", encoding="utf-8") as f:
          f.write(files[name])
      game = files[GAME_FILE]
      with open(os.path.join(game_dir, GAME_FILE), "w", encoding="utf-8") as f:
        json.dump(game, f)
      walkthrough = expert_walkthrough(game_dir, max_steps=max_expert_steps,
                                       seed=rng.getrandbits(32))
      if walkthrough is not None:
        game["solvable"] = True
        game["walkthrough"] = walkthrough
        with open(os.path.join(game_dir, GAME_FILE), "w", encoding="utf-8") as f:
          json.dump(game, f)
        written.append(game_dir)
        break
      shutil.rmtree(game_dir)
      task_dir = os.path.dirname(game_dir)
      if not os.listdir(task_dir):
        os.rmdir(task_dir)
    else:
      raise RuntimeError(f"the expert failed 20 drawn {task_type} games in a row")
  return written


# Keyword options of make_sandbox and of make_tasks (each accepts, and ignores, the other's).
SANDBOX_OPTIONS = ("max_steps", "max_action_chars")
TASK_OPTIONS = ("data_path", "cache_dir", "task_types", "num_distractors", "max_expert_steps")
# Bumped whenever the generator's output for the same arguments changes (invalidates caches).
GENERATOR_VERSION = 1
# ALFWorld's data has no "test" split: its held-out games are valid_unseen (unseen rooms).
DATA_SPLIT_ALIASES = {"test": "valid_unseen"}


def make_tasks(split: str, num: int, seed: int, **config) -> list[AlfworldTask]:
  """ALFWorld tasks for `split`.

  With `data_path` (an ALFWorld data root such as $ALFWORLD_DATA/json_2.1.1), loads the first
  `num` solvable games of `split` after a seeded shuffle (num <= 0: all of them); "test" reads
  valid_unseen when the data has no test directory. Without it, generates `num` expert-checked
  games (see `generate_game_dirs`) through the same loader; different splits draw from
  independent seeds, and their task ids differ by the split prefix.

  Options: data_path, task_types (default: all six), num_distractors, max_expert_steps, and
  cache_dir: keep generated games there (one folder per distinct set of arguments) and load them
  instead of generating again. The sandbox's options (max_steps, max_action_chars) are accepted
  and ignored.
  """
  _, task_config = _split_options(config)
  data_path = task_config.pop("data_path", None)
  cache_dir = task_config.pop("cache_dir", None)
  task_types = tuple(task_config.pop("task_types", TASK_TYPES))
  generator_config = task_config
  if data_path is not None:
    if not os.path.isdir(os.path.join(data_path, split)) and split in DATA_SPLIT_ALIASES:
      split = DATA_SPLIT_ALIASES[split]
    dirs = [d for d in find_game_dirs(data_path, split)
            if _read_json(d, TRAJ_FILE)["task_type"] in task_types]
    random.Random(seed).shuffle(dirs)
    if num > 0:
      dirs = dirs[:num]
    return [load_game_dir(d, root=data_path) for d in dirs]
  if cache_dir is None:
    with tempfile.TemporaryDirectory() as tmp:
      dirs = generate_game_dirs(tmp, split, num, seed, task_types=task_types, **generator_config)
      return [load_game_dir(d, root=tmp) for d in dirs]
  # Generation is deterministic in its arguments, so a finished run can be kept and reloaded.
  key = json.dumps({"version": GENERATOR_VERSION, "split": split, "num": num, "seed": seed,
                    "task_types": list(task_types),
                    **{k: list(v) if isinstance(v, (list, tuple)) else v
                       for k, v in sorted(generator_config.items())}}, sort_keys=True)
  root = os.path.join(cache_dir, hashlib.sha256(key.encode()).hexdigest()[:16])
  manifest = os.path.join(root, "manifest.json")
  if not os.path.isfile(manifest):
    if os.path.isdir(root):
      shutil.rmtree(root)  # an unfinished earlier run
    dirs = generate_game_dirs(root, split, num, seed, task_types=task_types, **generator_config)
    with open(manifest + ".tmp", "w", encoding="utf-8") as f:
      json.dump({"key": json.loads(key), "games": [os.path.relpath(d, root) for d in dirs]}, f)
    os.replace(manifest + ".tmp", manifest)
  with open(manifest, encoding="utf-8") as f:
    games = json.load(f)["games"]
  return [load_game_dir(os.path.join(root, g), root=root) for g in games]


# ---------------------------------------------------------------------------------------------
# The engine.
# ---------------------------------------------------------------------------------------------

_ENGINE_CACHES_INSTALLED = False
_ENGINE_ORIGINALS: dict[str, Any] = {}


def _install_engine_caches() -> None:
  """Memoises the pure text-to-structure conversions TextWorld's PDDL engine repeats.

  The engine re-parses the same grammar strings with tatsu at every step (about 75% of a step)
  and translates the same PDDL problem twice per load and twice again per reset. Both are pure
  functions of their text, so they are cached per process: a step drops from ~150 ms to ~40 ms
  and a reset after load no longer re-translates. Cached grammar symbols are deep-copied on the
  way out because a derivation writes its context into them.
  """
  global _ENGINE_CACHES_INSTALLED
  if _ENGINE_CACHES_INSTALLED:
    return
  import fast_downward  # pylint: disable=g-import-not-at-top
  import textworld.envs.pddl.textgen as textgen  # pylint: disable=g-import-not-at-top
  import textworld.logic as tw_logic  # pylint: disable=g-import-not-at-top

  parse_symbols = textgen._parse_and_convert  # pylint: disable=protected-access

  @functools.lru_cache(maxsize=8192)
  def cached_symbols(text, rule_name, trace):
    return parse_symbols(text, rule_name=rule_name, trace=trace)

  def symbols(text, rule_name=None, trace=False, **kwargs):
    if kwargs or not isinstance(text, str):
      return parse_symbols(text, rule_name=rule_name, trace=trace, **kwargs)
    return copy.deepcopy(cached_symbols(text, rule_name, bool(trace)))

  parse_logic = tw_logic._parse_and_convert  # pylint: disable=protected-access

  @functools.lru_cache(maxsize=8192)
  def cached_query(text):
    return tuple(parse_logic(text, rule_name="conjunctiveQuery"))

  def logic(text, rule_name=None, **kwargs):
    # Only conjunctive queries (grammar conditions) are cached: a list of immutable propositions.
    if rule_name == "conjunctiveQuery" and not kwargs and isinstance(text, str):
      return list(cached_query(text))
    return parse_logic(text, rule_name=rule_name, **kwargs)

  translate = fast_downward.pddl2sas

  @functools.lru_cache(maxsize=16)
  def pddl2sas(domain, problem, verbose=False, optimize=False):
    # The translator overwrites sys.argv for its option parser; give the caller's back.
    argv = list(sys.argv)
    try:
      return translate(domain, problem, verbose=verbose, optimize=optimize)
    finally:
      sys.argv[:] = argv

  _ENGINE_ORIGINALS.update(symbols=parse_symbols, logic=parse_logic, pddl2sas=translate)
  textgen._parse_and_convert = symbols  # pylint: disable=protected-access
  tw_logic._parse_and_convert = logic  # pylint: disable=protected-access
  fast_downward.pddl2sas = pddl2sas
  _ENGINE_CACHES_INSTALLED = True


@contextlib.contextmanager
def _engine_caches_disabled():
  """Runs the engine's own, uncached functions inside the block (to check the caches change
  nothing: the tests compare a game played both ways)."""
  import fast_downward  # pylint: disable=g-import-not-at-top
  import textworld.envs.pddl.textgen as textgen  # pylint: disable=g-import-not-at-top
  import textworld.logic as tw_logic  # pylint: disable=g-import-not-at-top
  _install_engine_caches()
  # pylint: disable=protected-access
  cached = (textgen._parse_and_convert, tw_logic._parse_and_convert, fast_downward.pddl2sas)
  textgen._parse_and_convert = _ENGINE_ORIGINALS["symbols"]  # pylint: disable=protected-access
  tw_logic._parse_and_convert = _ENGINE_ORIGINALS["logic"]  # pylint: disable=protected-access
  fast_downward.pddl2sas = _ENGINE_ORIGINALS["pddl2sas"]
  try:
    yield
  finally:
    textgen._parse_and_convert, tw_logic._parse_and_convert, fast_downward.pddl2sas = cached


@dataclasses.dataclass(frozen=True, eq=False)
class _EngineState:
  """The engine's state in this process: what `restore` needs to resume without replay."""

  engine: Any  # the PddlEnv the state belongs to (a state id means nothing elsewhere)
  epoch: int  # bumped at every game load, which resets the Fast Downward state registry
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

  Example:
    sb = AlfworldSandbox(max_steps=50)
    sb.reset(task)
    for command in task.walkthrough:
      step = sb.step(command)
    assert step.info["success"] and step.reward == 1.0
  """

  def __init__(self, max_steps: int = 50, max_action_chars: int = MAX_ACTION_CHARS):
    if max_steps < 1:
      raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if max_action_chars < 1:
      raise ValueError(f"max_action_chars must be >= 1, got {max_action_chars}")
    aw = _alfworld()
    _install_engine_caches()
    self.max_steps = int(max_steps)
    self.max_action_chars = int(max_action_chars)
    infos = aw["textworld"].EnvInfos(admissible_commands=True, won=True)
    self._pddl_env = aw["PddlEnv"](infos)
    self._env = aw["alfred_tw_env"].AlfredDemangler(self._pddl_env, shuffle=False)
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
    observation = self._pddl_env.state.feedback
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
    """Frees this sandbox's Fast Downward state; the sandbox cannot be used afterwards. Closing
    twice is a no-op.

    Each sandbox loads its own copy of the Fast Downward library (about 4 MB). The copy stays
    mapped: unloading it (`fast_downward.close_lib`, a dlclose) leaves exit-time destructors
    pointing into unmapped code, and the process then dies with a segmentation fault at exit.
    """
    if self._closed:
      return
    self._env.close()
    self._pddl_env.downward_lib.cleanup()
    self._closed = True
    self._progress = None

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
    self._epoch += 1
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


def _split_options(config: Mapping[str, Any]) -> tuple[dict, dict]:
  """Splits one options dict into the sandbox's and the task source's keyword arguments.

  An experiment passes the same options to make_sandbox and make_tasks; each takes its own.
  """
  unknown = sorted(set(config) - set(SANDBOX_OPTIONS) - set(TASK_OPTIONS))
  if unknown:
    raise TypeError(f"unknown ALFWorld options {unknown}; "
                    f"sandbox options: {list(SANDBOX_OPTIONS)}, "
                    f"task options: {list(TASK_OPTIONS)}")
  return ({k: v for k, v in config.items() if k in SANDBOX_OPTIONS},
          {k: v for k, v in config.items() if k in TASK_OPTIONS})


def make_sandbox(**config) -> AlfworldSandbox:
  """A fresh ALFWorld sandbox (max_steps, max_action_chars); task options are accepted and
  ignored, so one options dict serves make_sandbox and make_tasks."""
  sandbox_config, _ = _split_options(config)
  return AlfworldSandbox(**sandbox_config)
