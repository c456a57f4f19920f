"""Rooms: a built-in text world with no dependency beyond the standard library.

The embedded default environment. A world is generated from `(seed, difficulty)`: rooms on a
grid joined by doorways, coloured locked doors, keys, objects and a container, with a goal in
words ("put the apple in the box"). Observations are short (under ~60 words), actions are short
("go north", "take red key", "open blue door", "put apple in box").

Early choices change what later choices can achieve, so forks matter:

* opening a locked door uses up the key of its colour, and at higher difficulty a decoy door of
  the same colour leads to a dead end: opening it first leaves the goal unreachable;
* a one-way door leads into a dead-end room that cannot be left.

Difficulty levels (shortest solutions: level 1 takes 3-4 steps, level 3 about 6-11, level 5 about
9-19):

    level  rooms  locked doors  decoy door  one-way trap  distractor objects
    1      2      0             no          no            0
    2      3      0             no          yes           1
    3      4      1             yes         no            1
    4      5      1             yes         yes           2
    5      6      2             yes         yes           2

Reward is 1.0 on the step that achieves the goal (then `done`, `info["success"] = True`);
otherwise 0. An episode is cut after `max_steps` actions (`done` and `truncated`,
`info["success"] = False`); by default that is three times the shortest solution plus four.

Module interface (see `registry.py`):

    sandbox = make_sandbox()                       # RoomsSandbox
    tasks = make_tasks("train", num=8, seed=0, difficulty=2)
    obs = sandbox.reset(tasks[0])                  # states the goal
    sandbox.admissible_actions()                   # e.g. ["go east", "take red key"]
    expert_actions(tasks[0])                       # a shortest solution
    vocabulary()                                   # every word of observations and actions
    parse_action("I need the key.\\ntake red key")  # "take red key" (a model's reply)

Words are what `split_words` returns: runs of letters and each punctuation mark.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import pickle
import random
import re
from typing import Any

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import free_text

ROOM_NAMES = ("kitchen", "hall", "cellar", "study", "garden", "attic", "library", "pantry",
              "bedroom", "office", "bathroom", "garage")
COLORS = ("red", "blue", "green", "yellow", "white", "black")
OBJECTS = ("apple", "book", "coin", "lamp", "cup", "pear", "shoe", "ball")
CONTAINERS = ("box", "chest", "basket")
DIRECTIONS = ("north", "east", "south", "west")
_STEP = {"north": (0, 1), "east": (1, 0), "south": (0, -1), "west": (-1, 0)}
_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
VERBS = ("go", "take", "drop", "open", "put")
DIFFICULTIES = (1, 2, 3, 4, 5)
# World seeds per split: "train" takes the even seeds below 2 x this, "test" the odd ones.
SEEDS_PER_SPLIT = 1 << 30


@dataclasses.dataclass(frozen=True)
class _Level:
  rooms: int
  locks: int
  decoy: bool
  one_way: bool
  distractors: int


_LEVELS = {
    1: _Level(rooms=2, locks=0, decoy=False, one_way=False, distractors=0),
    2: _Level(rooms=3, locks=0, decoy=False, one_way=True, distractors=1),
    3: _Level(rooms=4, locks=1, decoy=True, one_way=False, distractors=1),
    4: _Level(rooms=5, locks=1, decoy=True, one_way=True, distractors=2),
    5: _Level(rooms=6, locks=2, decoy=True, one_way=True, distractors=2),
}


@dataclasses.dataclass(frozen=True)
class RoomsTask:
  """One generated world: `task_id` is stable, `seed` and `difficulty` determine the world."""

  task_id: str
  seed: int
  difficulty: int


@dataclasses.dataclass(frozen=True)
class _Door:
  a: int            # room on the near side
  b: int            # room on the far side
  direction: str    # direction from a to b
  color: str | None  # None: an open doorway; else locked until opened with a key of this colour
  one_way: bool     # passable only from a to b


@dataclasses.dataclass(frozen=True)
class _Item:
  name: str          # "apple" or "red key"
  room: int          # where it starts
  is_key: bool
  color: str | None  # the key's colour


@dataclasses.dataclass(frozen=True)
class World:
  """The static part of a generated world; the dynamic part is a `_State`."""

  rooms: tuple[str, ...]
  doors: tuple[_Door, ...]
  items: tuple[_Item, ...]
  container: str
  container_room: int
  goal_item: int
  start_room: int

  @property
  def goal_text(self) -> str:
    goal = self.items[self.goal_item]
    return (f"Goal: put the {goal.name} in the {self.container}. "
            f"The {goal.name} is in the {self.rooms[goal.room]}.")


# Item locations in a state: a room index, or one of these.
_CARRIED = -1
_IN_CONTAINER = -2
_USED = -3


@dataclasses.dataclass(frozen=True)
class _State:
  room: int
  item_locations: tuple[int, ...]
  opened: tuple[bool, ...]  # per door; doorways count as open


def split_words(text: str) -> list[str]:
  """The words of a text as the vocabulary counts them: letter runs and punctuation marks.

  >>> split_words("You go north to the hall.")
  ['You', 'go', 'north', 'to', 'the', 'hall', '.']
  """
  return re.findall(r"[A-Za-z]+|[^A-Za-z\s]", text)


# ----------------------------------------------------------------------------- generation


def _grow_tree(rng: random.Random, num_rooms: int):
  """Rooms on grid cells joined as a tree; returns (cells, edges [(a, b, direction)])."""
  cells = [(0, 0)]
  occupied = {(0, 0): 0}
  edges = []
  while len(cells) < num_rooms:
    a = rng.randrange(len(cells))
    direction = rng.choice(DIRECTIONS)
    dx, dy = _STEP[direction]
    cell = (cells[a][0] + dx, cells[a][1] + dy)
    if cell in occupied:
      continue
    occupied[cell] = len(cells)
    cells.append(cell)
    edges.append((a, len(cells) - 1, direction))
  return cells, occupied, edges


def _attach_dead_end(rng, cells, occupied, edges, candidates):
  """Adds a room next to one of `candidates`; returns its edge index or None if boxed in."""
  options = []
  for a in candidates:
    for direction in DIRECTIONS:
      dx, dy = _STEP[direction]
      cell = (cells[a][0] + dx, cells[a][1] + dy)
      if cell not in occupied:
        options.append((a, direction, cell))
  if not options:
    return None
  a, direction, cell = rng.choice(options)
  occupied[cell] = len(cells)
  cells.append(cell)
  edges.append((a, len(cells) - 1, direction))
  return len(edges) - 1


def _tree_path(edges, start, goal):
  """Edge indices on the path from start to goal in the tree, in order."""
  adjacency = collections.defaultdict(list)
  for k, (a, b, _) in enumerate(edges):
    adjacency[a].append((b, k))
    adjacency[b].append((a, k))
  previous = {start: None}
  queue = collections.deque([start])
  while queue:
    room = queue.popleft()
    for other, k in adjacency[room]:
      if other not in previous:
        previous[other] = (room, k)
        queue.append(other)
  path = []
  room = goal
  while previous[room] is not None:
    room, k = previous[room]
    path.append(k)
  return path[::-1]


def _reachable(edges, start, cut):
  """Rooms reachable from start without crossing the edge indices in `cut`."""
  adjacency = collections.defaultdict(list)
  for k, (a, b, _) in enumerate(edges):
    if k not in cut:
      adjacency[a].append(b)
      adjacency[b].append(a)
  seen = {start}
  stack = [start]
  while stack:
    for other in adjacency[stack.pop()]:
      if other not in seen:
        seen.add(other)
        stack.append(other)
  return sorted(seen)


def _try_generate(rng: random.Random, level: _Level) -> World | None:
  cells, occupied, edges = _grow_tree(rng, level.rooms)
  start = 0
  goal_room = rng.randrange(level.rooms)
  container_room = rng.choice([r for r in range(level.rooms) if r != goal_room])
  # Lock edges on the path to the goal object; key j lies before lock j.
  path = _tree_path(edges, start, goal_room)
  if len(path) < level.locks:
    return None
  locked = sorted(rng.sample(path, level.locks), key=path.index)
  colors = rng.sample(COLORS, len(COLORS))
  edge_color = {k: colors[j] for j, k in enumerate(locked)}
  # Any room may hold the container: opened doors stay open, so every room is reachable once
  # the keys have been used on the right doors.
  key_rooms = []
  for j, k in enumerate(locked):
    region = _reachable(edges, start, set(locked[j:]))
    key_rooms.append(rng.choice(region))
  one_way_edges = set()
  decoy_edges = set()
  if level.decoy and locked:
    j = rng.randrange(len(locked))
    k = locked[j]
    region = _reachable(edges, start, set(locked[j:]))
    near_rooms = [r for r in region if r not in (edges[k][0], edges[k][1])]
    if not near_rooms:
      return None
    decoy = _attach_dead_end(rng, cells, occupied, edges, near_rooms)
    if decoy is None:
      return None
    decoy_edges.add(decoy)
    edge_color[decoy] = edge_color[k]
  if level.one_way:
    region = _reachable(edges, start, set(locked) | decoy_edges)
    trap = _attach_dead_end(rng, cells, occupied, edges, region)
    if trap is None:
      return None
    one_way_edges.add(trap)
  names = rng.sample(ROOM_NAMES, len(cells))
  doors = tuple(
      _Door(a=a, b=b, direction=d, color=edge_color.get(k), one_way=k in one_way_edges)
      for k, (a, b, d) in enumerate(edges))
  # No room may hold two doors of one colour, or "open red door" would be ambiguous.
  for room in range(len(cells)):
    room_colors = [d.color for d in doors if d.color and room in (d.a, d.b)]
    if len(room_colors) != len(set(room_colors)):
      return None
  object_names = rng.sample(OBJECTS, 1 + level.distractors)
  items = [_Item(name=object_names[0], room=goal_room, is_key=False, color=None)]
  for name in object_names[1:]:
    items.append(_Item(name=name, room=rng.randrange(len(cells)), is_key=False, color=None))
  for j, k in enumerate(locked):
    color = edge_color[k]
    items.append(_Item(name=f"{color} key", room=key_rooms[j], is_key=True, color=color))
  return World(rooms=tuple(names), doors=doors, items=tuple(items),
               container=rng.choice(CONTAINERS), container_room=container_room, goal_item=0,
               start_room=start)


@functools.lru_cache(maxsize=4096)
def generate_world(seed: int, difficulty: int) -> World:
  """The world of `(seed, difficulty)`; the same in every process (no hash-order dependence)."""
  if difficulty not in _LEVELS:
    raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
  rng = random.Random(seed * 10 + difficulty)
  for _ in range(1000):
    world = _try_generate(rng, _LEVELS[difficulty])
    if world is not None and _solve(world) is not None:
      return world
  raise RuntimeError(f"could not generate a rooms world for seed={seed}, difficulty={difficulty}")


# ----------------------------------------------------------------------------- dynamics


def _initial_state(world: World) -> _State:
  return _State(room=world.start_room,
                item_locations=tuple(item.room for item in world.items),
                opened=tuple(d.color is None for d in world.doors))


def _exits(world: World, room: int):
  """(direction, door index, far room, this side is the door's near side) for each exit."""
  out = []
  for k, d in enumerate(world.doors):
    if d.a == room:
      out.append((d.direction, k, d.b, True))
    elif d.b == room:
      out.append((_OPPOSITE[d.direction], k, d.a, False))
  return sorted(out, key=lambda e: DIRECTIONS.index(e[0]))


def _carried(world: World, state: _State) -> list[int]:
  return [i for i, loc in enumerate(state.item_locations) if loc == _CARRIED]


def _describe(world: World, state: _State) -> str:
  room = state.room
  things = [world.items[i].name for i, loc in enumerate(state.item_locations) if loc == room]
  if world.container_room == room:
    things.append(world.container)
  parts = [f"You are in the {world.rooms[room]}."]
  parts.append(f"You see: {', '.join(things)}." if things else "You see nothing.")
  exits = []
  for direction, k, far, near_side in _exits(world, room):
    door = world.doors[k]
    if door.one_way:
      side = "one-way door" if near_side else "one-way door, shut from this side,"
      exits.append(f"{direction} {side} to {world.rooms[far]}")
    elif door.color is None:
      exits.append(f"{direction} to {world.rooms[far]}")
    else:
      status = "open" if state.opened[k] else "locked"
      exits.append(f"{direction} {door.color} door to {world.rooms[far]}, {status}")
  parts.append(f"Exits: {'; '.join(exits)}.")
  carried = [world.items[i].name for i in _carried(world, state)]
  parts.append(f"You carry: {', '.join(carried)}." if carried else "You carry nothing.")
  return " ".join(parts)


def _admissible(world: World, state: _State, include_drop: bool = True) -> list[str]:
  actions = []
  carried = _carried(world, state)
  carried_colors = {world.items[i].color for i in carried if world.items[i].is_key}
  for direction, k, _, near_side in _exits(world, state.room):
    door = world.doors[k]
    if door.one_way and not near_side:
      continue
    if state.opened[k]:
      actions.append(f"go {direction}")
    elif door.color in carried_colors:
      actions.append(f"open {door.color} door")
  for i, loc in enumerate(state.item_locations):
    if loc == state.room:
      actions.append(f"take {world.items[i].name}")
  for i in carried:
    if include_drop:
      actions.append(f"drop {world.items[i].name}")
    if not world.items[i].is_key and world.container_room == state.room:
      actions.append(f"put {world.items[i].name} in {world.container}")
  return actions


def _transition(world: World, state: _State, action: str) -> tuple[_State, str, bool]:
  """Applies a normalised action; returns (next state, feedback sentence, goal achieved)."""
  words = action.lower().split()
  verb, rest = (words[0], words[1:]) if words else ("", [])
  item_index = {item.name: i for i, item in enumerate(world.items)}
  if verb == "go" and len(rest) == 1 and rest[0] in DIRECTIONS:
    direction = rest[0]
    for d, k, far, near_side in _exits(world, state.room):
      if d != direction:
        continue
      door = world.doors[k]
      if door.one_way and not near_side:
        return state, f"The {direction} door does not open from this side.", False
      if not state.opened[k]:
        return state, f"The {door.color} door is locked.", False
      moved = dataclasses.replace(state, room=far)
      note = " The door shuts behind you." if door.one_way else ""
      return moved, f"You go {direction}.{note}", False
    return state, f"There is no exit {direction}.", False
  if verb == "open" and len(rest) == 2 and rest[0] in COLORS and rest[1] == "door":
    color = rest[0]
    for _, k, _, near_side in _exits(world, state.room):
      door = world.doors[k]
      if door.color != color:
        continue
      if state.opened[k]:
        return state, f"The {color} door is already open.", False
      keys = [i for i in _carried(world, state) if world.items[i].color == color]
      if not keys:
        return state, f"You have no {color} key.", False
      locations = list(state.item_locations)
      locations[keys[0]] = _USED
      opened = list(state.opened)
      opened[k] = True
      next_state = dataclasses.replace(state, item_locations=tuple(locations),
                                       opened=tuple(opened))
      return next_state, f"You open the {color} door. The {color} key stays in the lock.", False
    return state, f"There is no {color} door here.", False
  if verb in ("take", "drop"):
    name = " ".join(rest)
    if name in (world.container,):
      return state, f"The {name} is too heavy.", False
    i = item_index.get(name)
    if verb == "take":
      if i is None or state.item_locations[i] != state.room:
        return state, "You do not see that here.", False
      new_loc, feedback = _CARRIED, f"You take the {name}."
    else:
      if i is None or state.item_locations[i] != _CARRIED:
        return state, "You do not carry that.", False
      new_loc, feedback = state.room, f"You drop the {name}."
    locations = list(state.item_locations)
    locations[i] = new_loc
    return dataclasses.replace(state, item_locations=tuple(locations)), feedback, False
  if verb == "put" and "in" in rest:
    split = rest.index("in")
    name, target = " ".join(rest[:split]), " ".join(rest[split + 1:])
    i = item_index.get(name)
    if i is None or state.item_locations[i] != _CARRIED:
      return state, "You do not carry that.", False
    if target != world.container or world.container_room != state.room:
      return state, "There is no such container here.", False
    if world.items[i].is_key:
      return state, "Keys do not go in there.", False
    locations = list(state.item_locations)
    locations[i] = _IN_CONTAINER
    next_state = dataclasses.replace(state, item_locations=tuple(locations))
    return next_state, f"You put the {name} in the {world.container}.", i == world.goal_item
  return state, "I do not understand. Use go, take, drop, open or put.", False


def _solve(world: World, start: _State | None = None) -> list[str] | None:
  """A shortest action sequence reaching the goal from `start` (breadth-first), or None.

  Dropping is left out of the search: capacity is unlimited and nothing needs empty hands, so
  a drop never shortens a solution, and leaving it out keeps the state space small.
  """
  if start is None:
    start = _initial_state(world)
  previous = {start: None}
  queue = collections.deque([start])
  while queue:
    state = queue.popleft()
    for action in _admissible(world, state, include_drop=False):
      next_state, _, achieved = _transition(world, state, action)
      if achieved:
        actions = [action]
        while previous[state] is not None:
          state, taken = previous[state]
          actions.append(taken)
        return actions[::-1]
      if next_state not in previous:
        previous[next_state] = (state, action)
        queue.append(next_state)
  return None


# ----------------------------------------------------------------------------- public API


def expert_actions(task: RoomsTask) -> list[str]:
  """A shortest solution of `task` (the expert policy used for warm-starting)."""
  return list(_solve_cached(task.seed, task.difficulty))


@functools.lru_cache(maxsize=4096)
def _solve_cached(seed: int, difficulty: int) -> tuple[str, ...]:
  return tuple(_solve(generate_world(seed, difficulty)))


def default_max_steps(task: RoomsTask) -> int:
  """Three times the shortest solution plus four."""
  return 3 * len(_solve_cached(task.seed, task.difficulty)) + 4


_FEEDBACK_WORDS = (
    "You are in the . You see : , nothing Exits ; to one - way door shut from this side open "
    "locked carry Goal : put the in is go take drop There no exit does not stays key lock "
    "have here already do see that too heavy such container Keys go there I understand Use or "
    "won The episode over shuts behind you Invalid action empty long UTF 8 text control character "
    "Out of steps")


@functools.lru_cache(maxsize=1)
def vocabulary() -> list[str]:
  """Every word that can appear in this world's observations and actions (see `split_words`)."""
  words = set(split_words(_FEEDBACK_WORDS))
  for group in (ROOM_NAMES, COLORS, OBJECTS, CONTAINERS, DIRECTIONS, VERBS):
    words.update(group)
  words.update(("key", "door", "in"))
  return sorted(words)


# The action syntax for language-model agents (see free_text.py).
SYSTEM_PROMPT = ("Reply with one command: go <direction>, take <object>, drop <object>, open "
                 "<colour> door, or put <object> in <container>.")
NO_ACTION_HINT = "Reply with one command: go, take, drop, open or put."


def parse_action(text: str) -> str | None:
  """The first line of a reply that starts with go, take, drop, open or put; None if none does.

  >>> parse_action("The key first.\\ntake red key")
  'take red key'
  """
  return free_text.first_command(text, VERBS)


def _rejection_text(reason: str) -> str:
  """The rejection reason in vocabulary words (the raw reason may quote numbers or bytes)."""
  if "UTF" in reason:
    return "Invalid action: not UTF - 8 text."
  if "empty" in reason:
    return "Invalid action: empty."
  if "long" in reason:
    return "Invalid action: too long."
  if "control" in reason:
    return "Invalid action: control character."
  return "Invalid action: not text."


class RoomsSandbox:
  """A rooms world behind the `Sandbox` protocol.

  The state is a handful of integers, so a snapshot is a short pickle of
  `(task, state, steps taken, episode over)` that restores in any process.
  """

  _SNAPSHOT_VERSION = 1

  def __init__(self, max_steps: int | None = None):
    if max_steps is not None and max_steps < 1:
      raise ValueError(f"max_steps must be positive, got {max_steps}")
    self._max_steps_override = max_steps
    self._task: RoomsTask | None = None
    self._world: World | None = None
    self._state: _State | None = None
    self._steps = 0
    self._over = False

  @property
  def max_steps(self) -> int:
    self._require_task()
    if self._max_steps_override is not None:
      return self._max_steps_override
    return default_max_steps(self._task)

  def _require_task(self):
    if self._task is None:
      raise RuntimeError("RoomsSandbox: call reset(task) or restore(snapshot) first")

  def reset(self, task: RoomsTask) -> str:
    if not isinstance(task, RoomsTask):
      raise TypeError(f"RoomsSandbox.reset expects a RoomsTask, got {type(task).__name__}")
    self._task = task
    self._world = generate_world(task.seed, task.difficulty)
    self._state = _initial_state(self._world)
    self._steps = 0
    self._over = False
    return f"{self._world.goal_text} {_describe(self._world, self._state)}"

  def step(self, action: Any) -> base.Step:
    self._require_task()
    if self._over:
      return base.Step("The episode is over.", 0.0, True, False, {"success": False})
    text, reason = base.check_action(action, max_chars=200)
    self._steps += 1
    if reason is not None:
      feedback, achieved, info = _rejection_text(reason), False, {"invalid_action": reason}
    else:
      self._state, feedback, achieved = _transition(self._world, self._state, text)
      info = {}
    observation = f"{feedback} {_describe(self._world, self._state)}"
    if achieved:
      self._over = True
      info["success"] = True
      return base.Step(f"{feedback} You won!", 1.0, True, False, info)
    if self._steps >= self.max_steps:
      self._over = True
      info["success"] = False
      return base.Step(f"{observation} Out of steps.", 0.0, True, True, info)
    return base.Step(observation, 0.0, False, False, info)

  def admissible_actions(self) -> list[str]:
    self._require_task()
    if self._over:
      return []
    return _admissible(self._world, self._state)

  def expert_actions(self) -> list[str] | None:
    """A shortest solution from the current state, or None when the goal is out of reach."""
    self._require_task()
    if self._over:
      return None
    return _solve(self._world, self._state)

  def snapshot(self) -> base.Snapshot:
    self._require_task()
    task = self._task
    state = self._state
    payload = (self._SNAPSHOT_VERSION, task.task_id, task.seed, task.difficulty, state.room,
               state.item_locations, state.opened, self._steps, self._over)
    return base.Snapshot(pickle.dumps(payload, protocol=4))

  def restore(self, snapshot: base.Snapshot) -> None:
    if not isinstance(snapshot, base.Snapshot):
      raise TypeError(f"restore expects a Snapshot, got {type(snapshot).__name__}")
    (version, task_id, seed, difficulty, room, locations, opened, steps,
     over) = pickle.loads(snapshot.data)
    if version != self._SNAPSHOT_VERSION:
      raise ValueError(f"rooms snapshot version {version} is not {self._SNAPSHOT_VERSION}")
    self._task = RoomsTask(task_id=task_id, seed=seed, difficulty=difficulty)
    self._world = generate_world(seed, difficulty)
    self._state = _State(room=room, item_locations=tuple(locations), opened=tuple(opened))
    self._steps = steps
    self._over = over

  def close(self) -> None:
    self._task = self._world = self._state = None


def make_sandbox(max_steps: int | None = None, **unused) -> RoomsSandbox:
  """A rooms sandbox; `max_steps` overrides the per-task default truncation."""
  del unused  # e.g. `difficulty`, which belongs to the tasks
  return RoomsSandbox(max_steps=max_steps)


def make_tasks(split: str, num: int, seed: int, difficulty: int = 1, **unused) -> list[RoomsTask]:
  """`num` distinct worlds of one difficulty; "train" uses even world seeds, "test" odd ones."""
  del unused
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if difficulty not in _LEVELS:
    raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
  if not 0 <= num <= SEEDS_PER_SPLIT:
    raise ValueError(f"num must be in [0, {SEEDS_PER_SPLIT}] (the split's seeds), got {num}")
  rng = random.Random(f"rooms/{seed}/{difficulty}")
  parity = 0 if split == "train" else 1
  seeds: list[int] = []
  chosen = set()
  while len(seeds) < num:
    world_seed = 2 * rng.randrange(SEEDS_PER_SPLIT) + parity
    if world_seed not in chosen:
      chosen.add(world_seed)
      seeds.append(world_seed)
  return [RoomsTask(task_id=f"rooms-d{difficulty}-{s}", seed=s, difficulty=difficulty)
          for s in seeds]
