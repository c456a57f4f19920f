"""The built-in rooms world: hand-checked dynamics, optimal experts, traps, vocabulary."""

import os
import pickle
import random
import subprocess
import sys

import pytest

from bpo_jax.sandboxes import rooms

# A two-room world written out by hand: the apple is east of the start, the box at the start.
TINY = rooms.World(
    rooms=("kitchen", "hall"),
    doors=(rooms._Door(a=0, b=1, direction="east", color=None, one_way=False),),
    items=(rooms._Item(name="apple", room=1, is_key=False, color=None),),
    container="box", container_room=0, goal_item=0, start_room=0)


def test_hand_written_world_dynamics_and_shortest_solution():
  state = rooms._initial_state(TINY)
  assert rooms._describe(TINY, state) == (
      "You are in the kitchen. You see: box. Exits: east to hall. You carry nothing.")
  assert rooms._admissible(TINY, state) == ["go east"]
  state, feedback, won = rooms._transition(TINY, state, "take apple")
  assert (feedback, won) == ("You do not see that here.", False)
  state, feedback, _ = rooms._transition(TINY, state, "go east")
  assert feedback == "You go east." and state.room == 1
  state, feedback, _ = rooms._transition(TINY, state, "take apple")
  assert state.item_locations == (rooms._CARRIED,)
  state, feedback, won = rooms._transition(TINY, state, "put apple in box")
  assert (feedback, won) == ("There is no such container here.", False)
  assert rooms._solve(TINY) == ["go east", "take apple", "go west", "put apple in box"]


def _play(task, actions, **kwargs):
  sandbox = rooms.make_sandbox(**kwargs)
  sandbox.reset(task)
  return sandbox, [sandbox.step(a) for a in actions]


@pytest.mark.parametrize("difficulty", rooms.DIFFICULTIES)
def test_expert_wins_every_world(difficulty):
  for task in rooms.make_tasks("train", 20, 0, difficulty=difficulty):
    plan = rooms.expert_actions(task)
    _, steps = _play(task, plan)
    assert [s.done for s in steps] == [False] * (len(plan) - 1) + [True]
    assert steps[-1].reward == 1.0 and steps[-1].info["success"] is True
    assert sum(s.reward for s in steps) == 1.0


def _shortest_by_search(task, limit):
  """Breadth-first search through the public API only: snapshots (bytes) are the state keys,
  every admissible action, dropping included, is tried."""
  sandbox = rooms.make_sandbox(max_steps=100)
  sandbox.reset(task)
  frontier = [sandbox.snapshot()]
  seen = {frontier[0].data}
  for depth in range(1, limit + 1):
    next_frontier = []
    for snap in frontier:
      sandbox.restore(snap)
      for action in sandbox.admissible_actions():
        sandbox.restore(snap)
        step = sandbox.step(action)
        if step.reward == 1.0:
          return depth
        # The step counter is in the snapshot; key the state by everything else.
        child = sandbox.snapshot()
        key = pickle.loads(child.data)[:7]
        if key not in seen:
          seen.add(key)
          next_frontier.append(child)
    frontier = next_frontier
  return None


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_expert_is_shortest_against_an_independent_search(difficulty):
  for task in rooms.make_tasks("test", 4, 1, difficulty=difficulty):
    n = len(rooms.expert_actions(task))
    assert _shortest_by_search(task, n) == n


def test_difficulty_sets_solution_length():
  lengths = {d: [len(rooms.expert_actions(t)) for t in rooms.make_tasks("train", 40, 0,
                                                                       difficulty=d)]
             for d in rooms.DIFFICULTIES}
  assert set(lengths[1]) == {3, 4}
  means = [sum(v) / len(v) for v in lengths.values()]
  assert means == sorted(means) and means[-1] > 2 * means[0]


def _fatal_actions(task, depth):
  """(verb of the action, observation) for every action, in states reachable within `depth`
  steps, that turns a winnable state into an unwinnable one."""
  sandbox = rooms.make_sandbox(max_steps=100)
  sandbox.reset(task)
  frontier, seen, fatal = [sandbox.snapshot()], set(), []
  for _ in range(depth):
    next_frontier = []
    for snap in frontier:
      sandbox.restore(snap)
      if sandbox.expert_actions() is None:
        continue
      for action in sandbox.admissible_actions():
        sandbox.restore(snap)
        step = sandbox.step(action)
        if step.done:
          continue
        key = pickle.loads(sandbox.snapshot().data)[:7]
        if sandbox.expert_actions() is None:
          fatal.append((action.split()[0], step.observation))
        elif key not in seen:
          seen.add(key)
          next_frontier.append(sandbox.snapshot())
    frontier = next_frontier
  return fatal


def test_traps_early_choices_can_lose_the_game():
  # Level 1 has no trap: nothing can make it unwinnable.
  for task in rooms.make_tasks("train", 5, 0, difficulty=1):
    assert _fatal_actions(task, 6) == []
  # Level 2 has a one-way door into a dead end; level 3 a decoy door that uses up the key.
  for task in rooms.make_tasks("train", 5, 0, difficulty=2):
    verbs = {verb for verb, _ in _fatal_actions(task, 6)}
    assert verbs == {"go"}
  for task in rooms.make_tasks("train", 5, 0, difficulty=3):
    fatal = _fatal_actions(task, 8)
    assert {verb for verb, _ in fatal} == {"open"}
    assert all("key stays in the lock" in obs for _, obs in fatal)


def test_one_way_door_is_a_trap():
  task, world = next(
      (t, w) for t in rooms.make_tasks("train", 100, 3, difficulty=2)
      for w in [rooms.generate_world(t.seed, t.difficulty)]
      if any(d.one_way and d.a == w.start_room for d in w.doors))
  door = next(d for d in world.doors if d.one_way and d.a == world.start_room)
  sandbox = rooms.make_sandbox()
  observation = sandbox.reset(task)
  assert f"{door.direction} one-way door to {world.rooms[door.b]}" in observation
  step = sandbox.step(f"go {door.direction}")
  assert "The door shuts behind you." in step.observation
  assert sandbox.admissible_actions() == [a for a in sandbox.admissible_actions()
                                          if not a.startswith("go")]
  back = {"north": "south", "south": "north", "east": "west", "west": "east"}[door.direction]
  assert sandbox.step(f"go {back}").observation.startswith(
      f"The {back} door does not open from this side.")
  assert sandbox.expert_actions() is None


def test_observations_are_short_and_words_are_in_the_vocabulary():
  vocabulary = set(rooms.vocabulary())
  rng = random.Random(0)
  extra = ["go up", "open pink door", "eat apple", "take box", "put red key in box", "",
           "x" * 1000, b"\xff", "go\x07"]
  longest = 0
  for difficulty in rooms.DIFFICULTIES:
    for task in rooms.make_tasks("train", 8, 5, difficulty=difficulty):
      sandbox = rooms.make_sandbox()
      texts = [sandbox.reset(task)]
      for _ in range(30):
        admissible = sandbox.admissible_actions()
        texts.extend(admissible)
        step = sandbox.step(rng.choice(admissible + extra))
        texts.append(step.observation)
        if step.done:
          break
      for text in texts:
        words = rooms.split_words(text)
        assert set(words) <= vocabulary, set(words) - vocabulary
        longest = max(longest, len(text.split()))
  assert longest < 60


def test_truncation_after_max_steps():
  task = rooms.make_tasks("train", 1, 0)[0]
  sandbox, steps = _play(task, ["go up"] * 3, max_steps=3)
  assert [(s.done, s.truncated) for s in steps] == [(False, False)] * 2 + [(True, True)]
  assert steps[-1].info["success"] is False and steps[-1].observation.endswith("Out of steps.")
  assert sandbox.step("go north") == rooms.base.Step("The episode is over.", 0.0, True, False,
                                                     {"success": False})
  assert rooms.default_max_steps(task) == 3 * len(rooms.expert_actions(task)) + 4


def test_tasks_are_stable_disjoint_and_validated():
  train = rooms.make_tasks("train", 50, 0, difficulty=2)
  test = rooms.make_tasks("test", 50, 0, difficulty=2)
  assert rooms.make_tasks("train", 50, 0, difficulty=2) == train
  assert not {t.task_id for t in train} & {t.task_id for t in test}
  assert len({t.task_id for t in train}) == 50
  assert rooms.make_tasks("train", 1, 0)[0].task_id == "rooms-d1-2045702498"
  with pytest.raises(ValueError, match="split"):
    rooms.make_tasks("valid", 1, 0)
  with pytest.raises(ValueError, match="difficulty"):
    rooms.make_tasks("train", 1, 0, difficulty=9)
  with pytest.raises(TypeError, match="RoomsTask"):
    rooms.make_sandbox().reset("rooms-d1-2045702498")


@pytest.mark.slow
def test_worlds_are_identical_in_a_process_with_another_hash_seed():
  task = rooms.make_tasks("train", 1, 7, difficulty=5)[0]
  code = ("from bpo_jax.sandboxes import rooms; t = rooms.RoomsTask(%r, %d, %d); "
          "s = rooms.make_sandbox(); print(s.reset(t)); print(rooms.expert_actions(t))"
          % (task.task_id, task.seed, task.difficulty))
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=root)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       check=True).stdout
  sandbox = rooms.make_sandbox()
  assert out == f"{sandbox.reset(task)}\n{rooms.expert_actions(task)}\n"
