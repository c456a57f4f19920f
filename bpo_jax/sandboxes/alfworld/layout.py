"""Generated households in ALFRED's PDDL: the initial_state.pddl of a generated ALFWorld game.

A room kind is drawn among those ALFRED allows for the task type (heat and cool: kitchens;
examine in light: living rooms and bedrooms; ...), then its receptacles (each at its own
location, ids in ALFRED's "Class|x|y|z" form), the task's object class (one with the ability the
task needs: Cleanable, Heatable, Coolable, from ALFRED's tables) and goal receptacle class (one
that can contain it, never the appliance), the target instances (never already in a goal-class
receptacle, so the goal cannot hold at the start; two in one receptacle for pick-two), a desk
lamp for examine-in-light, and distractor objects where ALFRED's affordances allow them. The goal
is ALFWorld's own PDDL goal for the type (`alfworld.gen.goal_library`).

`_layout_problem` reads as its steps: receptacles, task, objects, locations, then the problem
text (:objects, :init, goal). Every draw comes from the caller's generator, in a fixed order.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any, Callable, Sequence

from bpo_jax.sandboxes.alfworld.engine import _alfworld

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


@dataclasses.dataclass
class _Household:
  """A drawn room, filled in step by step by `_layout_problem`."""

  room: str
  receptacles: list[_Thing]
  used_ids: set[str]  # the ALFRED ids of its receptacles and objects (the lamp's aside)
  objects: list[tuple[_Thing, _Thing]] = dataclasses.field(default_factory=list)  # (object, where)
  lamp_on: _Thing | None = None  # the receptacle the desk lamp stands on (examine in light)
  lamp: _Thing | None = None
  recep_loc: dict[str, str] = dataclasses.field(default_factory=dict)  # receptacle -> location
  agent_loc: str = ""

  @property
  def classes(self) -> set[str]:
    return {r.cls for r in self.receptacles}


def _draw_new(used: set[str], draw: Callable[[], str]) -> str:
  """Calls `draw` until it gives a value not in `used`, adds that value to `used`, returns it."""
  while True:
    value = draw()
    if value not in used:
      used.add(value)
      return value


def _receptacle_id(rng: random.Random, cls: str) -> str:
  coords = "|".join(_coord(rng) for _ in range(3))
  return f"{_BASIN_FIXTURE[cls]}|{coords}|{cls}" if cls in _BASIN_FIXTURE else f"{cls}|{coords}"


def _object_id(rng: random.Random, cls: str) -> str:
  return f"{cls}|" + "|".join(_coord(rng) for _ in range(3))


def _location_id(rng: random.Random) -> str:
  return "loc|%d|%d|%d|%d" % (rng.randint(-12, 12), rng.randint(-12, 12),
                              rng.choice((0, 1, 2, 3)), rng.choice((0, 15, 30, 45, 60)))


def _containers(c: Any, house: _Household, obj_cls: str) -> list[_Thing]:
  """The receptacles of `house` that can hold objects of class `obj_cls`."""
  return [r for r in house.receptacles if obj_cls in c.VAL_RECEPTACLE_OBJECTS.get(r.cls, ())]


def _add_object(rng: random.Random, house: _Household, cls: str, where: _Thing) -> None:
  oid = _draw_new(house.used_ids, functools.partial(_object_id, rng, cls))
  house.objects.append((_Thing(cls, _mangle(oid)), where))


def _draw_receptacles(rng: random.Random, c: Any, task_type: str) -> _Household:
  """Step 1: the room kind and its receptacles, each with its own id, in a shuffled order."""
  room = rng.choice(sorted(c.GOALS_VALID[task_type]))
  counts = {cls: rng.randint(lo, hi) for cls, (lo, hi) in sorted(ROOM_RECEPTACLES[room].items())}
  if task_type == "look_at_obj_in_light" and not any(counts.get(r, 0) for r in LAMP_RECEPTACLES):
    counts["SideTable"] = 1
  receptacles: list[_Thing] = []
  used_ids: set[str] = set()
  for cls, n in counts.items():
    for _ in range(n):
      rid = _draw_new(used_ids, functools.partial(_receptacle_id, rng, cls))
      receptacles.append(_Thing(cls, _mangle(rid)))
  rng.shuffle(receptacles)
  return _Household(room=room, receptacles=receptacles, used_ids=used_ids)


def _holdable(c: Any, house: _Household) -> list[str]:
  """Object classes this room can hold somewhere (sliced variants are not ALFWorld tasks)."""
  return sorted({o for r in house.classes for o in c.VAL_RECEPTACLE_OBJECTS.get(r, ())
                 if "Sliced" not in o and o in c.OBJECTS})


def _choose_task(rng: random.Random, c: Any, task_type: str, house: _Household,
                 holdable: Sequence[str]) -> tuple[dict, list[_Thing]] | None:
  """Step 2: the task's object class and the receptacle class it must end up in.

  Returns (pddl_params, the receptacles the targets may start in), or None when the room cannot
  host the task.
  """
  params = {"object_target": "", "parent_target": "", "mrecep_target": "", "toggle_target": "",
            "object_sliced": False}
  ability = _ABILITY.get(task_type)
  appliance = _APPLIANCE.get(task_type)
  if appliance and appliance not in house.classes:
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
    parents = sorted({r.cls for r in _containers(c, house, obj_cls)} - _NOT_A_PARENT - {appliance})
    if not parents:
      return None
    params["parent_target"] = rng.choice(parents)
  parent_cls = params["parent_target"]
  # The target must start somewhere other than the goal's receptacle class (else the goal could
  # hold at the start), and a cool task's target not in the fridge (ALFRED marks those cold).
  start_places = [r for r in _containers(c, house, obj_cls)
                  if r.cls != parent_cls and r.cls != appliance]
  if not start_places:
    return None
  return params, start_places


def _place_objects(rng: random.Random, c: Any, task_type: str, house: _Household, obj_cls: str,
                   start_places: Sequence[_Thing], holdable: Sequence[str],
                   num_distractors: Sequence[int]) -> None:
  """Step 3: the target instances, the desk lamp's receptacle, and the distractors."""
  if task_type == "pick_two_obj_and_place":
    # Both instances start in one receptacle: ALFWorld's hand-coded expert goes back to where it
    # saw the class, and only a layout it can solve is kept.
    where = rng.choice(start_places)
    _add_object(rng, house, obj_cls, where)
    _add_object(rng, house, obj_cls, where)
  else:
    for _ in range(rng.randint(1, 2)):
      _add_object(rng, house, obj_cls, rng.choice(start_places))
  if task_type == "look_at_obj_in_light":
    house.lamp_on = rng.choice([r for r in house.receptacles if r.cls in LAMP_RECEPTACLES])
  # Distractors: other classes, anywhere they fit (never the target class, so the goal's
  # count of target objects is what the layout says).
  others = [o for o in holdable if o != obj_cls]
  for _ in range(rng.randint(*num_distractors)):
    if not others:
      break
    cls = rng.choice(others)
    _add_object(rng, house, cls, rng.choice(_containers(c, house, cls)))


def _place_locations_and_lamp(rng: random.Random, house: _Household) -> None:
  """Step 4: one location per receptacle, the agent's start in the middle of the room, and the
  desk lamp's id (drawn last)."""
  loc_ids: set[str] = set()
  house.recep_loc = {r.pddl_id: _mangle(_draw_new(loc_ids, functools.partial(_location_id, rng)))
                     for r in house.receptacles}
  house.agent_loc = _mangle(_draw_new(loc_ids, functools.partial(_location_id, rng)))
  if house.lamp_on is not None:
    house.lamp = _Thing("DeskLamp", _mangle("DeskLamp|" + "|".join(_coord(rng) for _ in range(3))))


def _object_types(c: Any, house: _Household) -> list[str]:
  """The object types this game names: its classes and the constants the domain's actions name.

  ALFWorld's files declare all ~130, which only slows the engine's grounding down.
  """
  all_otypes = set(c.OBJECTS) - set(c.RECEPTACLES) | c.MOVABLE_RECEPTACLES_SET
  return sorted(({o.cls for o, _ in house.objects} | {"Knife", "ButterKnife"}
                 | ({"DeskLamp"} if house.lamp_on is not None else set())) & all_otypes)


def _declarations(house: _Household, otypes: Sequence[str]) -> list[str]:
  """:objects, as ALFWorld writes them: the type constants the domain and goals name, then the
  scene's objects, receptacles and locations."""
  rtypes = sorted(house.classes | {"SinkBasin", "Microwave", "Fridge"})
  decl = ["agent1 - agent"]
  decl += [f"{t}Type - otype" for t in otypes]
  decl += [f"{t}Type - rtype" for t in rtypes]
  all_objects = [o for o, _ in house.objects]
  decl += [f"{o.pddl_id} - object" for o in all_objects + ([house.lamp] if house.lamp else [])]
  decl += [f"{r.pddl_id} - receptacle" for r in house.receptacles]
  decl += [f"{loc} - location" for loc in list(house.recep_loc.values()) + [house.agent_loc]]
  return decl


def _initial_facts(c: Any, house: _Household, otypes: Sequence[str]) -> list[str]:
  """:init: types, affordances, where the agent, the receptacles and the objects are."""
  receptacles, objects, lamp, recep_loc = (house.receptacles, house.objects, house.lamp,
                                           house.recep_loc)
  all_objects = [o for o, _ in objects]
  init = ["(= (total-cost) 0)"]
  init += [f"(receptacleType {r.pddl_id} {r.cls}Type)" for r in receptacles]
  init += [f"(objectType {o.pddl_id} {o.cls}Type)" for o in all_objects]
  if lamp:
    init.append(f"(objectType {lamp.pddl_id} DeskLampType)")
  for rcls in sorted(house.classes):
    for ocls in sorted(c.VAL_RECEPTACLE_OBJECTS.get(rcls, ())):
      if ocls in otypes:
        init.append(f"(canContain {rcls}Type {ocls}Type)")
  init += [f"(pickupable {o.pddl_id})" for o in all_objects]
  init += [f"(isReceptacleObject {o.pddl_id})" for o in all_objects
           if o.cls in c.MOVABLE_RECEPTACLES_SET]
  init += [f"(openable {r.pddl_id})" for r in receptacles if r.cls in c.OPENABLE_CLASS_LIST]
  init.append(f"(atLocation agent1 {house.agent_loc})")
  for fact, ability_name in (("cleanable", "Cleanable"), ("heatable", "Heatable"),
                             ("coolable", "Coolable"),
                             ("sliceable", "Sliceable")):
    init += [f"({fact} {o.pddl_id})" for o in all_objects
             if o.cls in c.VAL_ACTION_OBJECTS[ability_name]]
  if lamp:
    init.append(f"(toggleable {lamp.pddl_id})")
    init.append(f"(inReceptacle {lamp.pddl_id} {house.lamp_on.pddl_id})")
  init += [f"(inReceptacle {o.pddl_id} {r.pddl_id})" for o, r in objects]
  init += [f"(receptacleAtLocation {r.pddl_id} {recep_loc[r.pddl_id]})" for r in receptacles]
  init += [f"(objectAtLocation {o.pddl_id} {recep_loc[r.pddl_id]})" for o, r in objects]
  if lamp:
    init.append(f"(objectAtLocation {lamp.pddl_id} {recep_loc[house.lamp_on.pddl_id]})")
  return init


def _goal(task_type: str, params: dict) -> str:
  """ALFWorld's PDDL goal for the task type; it closes the (define ...) form itself."""
  glib = _alfworld(engine=False)["goal_library"]
  goal = glib.gdict[task_type]["pddl"].format(obj=params["object_target"],
                                             recep=params["parent_target"],
                                             toggle=params["toggle_target"],
                                             mrecep="")
  return goal.replace("#", "-")


def _problem_text(problem_name: str, decl: Sequence[str], init: Sequence[str], goal: str) -> str:
  indent = "\n        "
  return (f"\n(define (problem {problem_name})\n(:domain alfred)\n(:objects{indent}"
          + indent.join(decl) + f"{indent})\n\n(:init{indent}" + indent.join(init)
          + f"{indent})\n\n{goal}")


def _layout_problem(rng: random.Random, task_type: str, problem_name: str,
                    num_distractors: Sequence[int]) -> tuple[str, dict, str] | None:
  """Samples one household and a task of `task_type` in it.

  Returns (initial_state.pddl text, pddl_params, room kind), or None when the sampled room
  cannot host the task (the caller draws again).
  """
  c = _alfworld(engine=False)["constants"]
  house = _draw_receptacles(rng, c, task_type)
  holdable = _holdable(c, house)
  chosen = _choose_task(rng, c, task_type, house, holdable)
  if chosen is None:
    return None
  params, start_places = chosen
  _place_objects(rng, c, task_type, house, params["object_target"], start_places, holdable,
                 num_distractors)
  _place_locations_and_lamp(rng, house)
  otypes = _object_types(c, house)
  problem = _problem_text(problem_name, _declarations(house, otypes),
                          _initial_facts(c, house, otypes), _goal(task_type, params))
  return problem, params, house.room
