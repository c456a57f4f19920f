"""Gymnasium toy-text sandboxes: text, rewards, and snapshots that carry the RNG state."""

import collections

import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import gym_text
from bpo_jax.sandboxes import registry
from bpo_jax.sandboxes.gym_text import blackjack
from bpo_jax.sandboxes.gym_text import frozenlake

NAMES = ("frozenlake", "taxi", "cliffwalking", "blackjack")
# Actions whose outcome is random in the default (stochastic) configuration.
RANDOM_ACTIONS = {"frozenlake": ["right", "down"] * 15, "taxi": ["north", "south"] * 15,
                  "cliffwalking": ["up", "down"] * 15, "blackjack": ["hit"] * 5}


@pytest.mark.parametrize("name", NAMES)
def test_snapshot_carries_the_rng_and_without_it_replays_diverge(name):
  module = registry.get_environment(name)
  diverged = 0
  for task in module.make_tasks("train", 4, 0):
    sandbox = module.make_sandbox()
    sandbox.reset(task)
    snap = sandbox.snapshot()
    actions = RANDOM_ACTIONS[name]
    assert base.check_replay(sandbox, snap, actions, other=module.make_sandbox()) is None
    first = base.replay(sandbox, snap, actions)
    # Control: the same restore, then one extra draw from the generator, as if the RNG state had
    # not been restored. The replay then tells a different story (for most tasks).
    sandbox.restore(snap)
    sandbox._env.np_random.random()
    second = [sandbox.step(a) for a in actions[:len(first)]]
    diverged += base.first_divergence(first, second) is not None
  assert diverged >= 2, name


def _path(desc):
  """Shortest move list from S to G on a FrozenLake map, avoiding holes (breadth-first)."""
  moves = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
  size = len(desc)
  previous = {(0, 0): None}
  queue = collections.deque([(0, 0)])
  while queue:
    cell = queue.popleft()
    if desc[cell[0]][cell[1]] == "G":
      path = []
      while previous[cell] is not None:
        cell, move = previous[cell]
        path.append(move)
      return path[::-1]
    for move, (dr, dc) in moves.items():
      nxt = (cell[0] + dr, cell[1] + dc)
      if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in previous \
          and desc[nxt[0]][nxt[1]] != "H":
        previous[nxt] = (cell, move)
        queue.append(nxt)
  raise AssertionError("generated map without a path")


def test_frozenlake_without_slipping_follows_the_map():
  for task in frozenlake.make_tasks("test", 3, 0, is_slippery=False):
    desc = dict(task.env_kwargs)["desc"]
    sandbox = frozenlake.make_sandbox()
    first = sandbox.reset(task)
    assert first.startswith("Goal: cross the ice") and "Row 1, column 1 of 4" in first
    path = _path(desc)
    steps = [sandbox.step(a) for a in path]
    assert [s.reward for s in steps] == [0.0] * (len(path) - 1) + [1.0]
    assert steps[-1].done and steps[-1].info["success"]
    assert "Row 4, column 4 of 4, on the goal." in steps[-1].observation


@pytest.mark.parametrize("size", [4, 5])
def test_frozenlake_expert_is_a_shortest_path_from_any_cell(size):
  """Without slipping, `expert_actions()` from the start and from a cell reached on the way is
  as long as the breadth-first path above and wins; slippery ice and an ended episode have
  none."""
  for task in frozenlake.make_tasks("train", 20, 3, size=size, is_slippery=False):
    sandbox = frozenlake.make_sandbox()
    sandbox.reset(task)
    path = _path(dict(task.env_kwargs)["desc"])
    expert = sandbox.expert_actions()
    assert len(expert) == len(path) >= 2 * size - 2
    sandbox.step(expert[0])
    rest = sandbox.expert_actions()
    assert len(rest) == len(path) - 1
    steps = [sandbox.step(a) for a in rest]
    assert steps[-1].info["success"] and sandbox.expert_actions() is None
  slippery = frozenlake.make_sandbox()
  slippery.reset(frozenlake.make_tasks("train", 1, 0, size=size)[0])
  assert slippery.expert_actions() is None
  with pytest.raises(RuntimeError, match="reset"):
    frozenlake.make_sandbox().expert_actions()


@pytest.mark.parametrize("desc, expert", [
    (("SFFF", "FFFF", "FFFF", "FFFG"), ["right"] * 3 + ["down"] * 3),
    # right first; past the hole at the top, down then right again.
    (("SFHF", "FFFF", "FFFF", "FFFG"), ["right", "down", "right", "right", "down", "down"]),
    # right leads into a dead end (a hole to its right and below), so down first.
    (("SFHF", "FHFF", "FFFF", "FFFG"), ["down", "down", "right", "right", "right", "down"]),
    # the only way round goes up and left.
    (("SFFF", "HHHF", "FFFF", "FHHH", "FFFG"),
     ["right"] * 3 + ["down"] * 2 + ["left"] * 3 + ["down"] * 2 + ["right"] * 3),
])
def test_frozenlake_expert_breaks_ties_by_its_preference(desc, expert):
  task = gym_text.GymTask("frozenlake-1", "frozenlake", 1,
                          (("desc", desc), ("is_slippery", False)))
  sandbox = frozenlake.make_sandbox()
  sandbox.reset(task)
  assert sandbox.expert_actions() == expert


def test_frozenlake_neighbours_name_the_cells_around_the_agent():
  """With `neighbours`, each description names the cells right, down, left and up of the
  agent's, by hand on one map (the edge where there is none), and says nothing else new; the
  option draws the same maps, and a restored snapshot describes as the original does."""
  desc = ("SFH", "HFF", "FFG")
  task = gym_text.GymTask("frozenlake-1", "frozenlake", 1,
                          (("desc", desc), ("is_slippery", False), ("neighbours", True)))
  plain = gym_text.GymTask("frozenlake-1", "frozenlake", 1,
                           (("desc", desc), ("is_slippery", False)))
  sandbox, other = frozenlake.make_sandbox(), frozenlake.make_sandbox()
  first = sandbox.reset(task)
  assert "on the start. Right F, down H, left edge, up edge. Map: X F H / H F F / F F G." in first
  assert first.replace(" Right F, down H, left edge, up edge.", "") == other.reset(plain)
  middle = sandbox.step("right").observation
  assert middle == ("Row 1, column 2 of 3, on frozen ice. Right H, down F, left S, up edge. "
                    "Map: S X H / H F F / F F G.")
  snapshot = sandbox.snapshot()
  below = ("Row 2, column 2 of 3, on frozen ice. Right F, down F, left H, up F. "
           "Map: S F H / H X F / F F G.")
  assert sandbox.step("down").observation == below
  other.restore(snapshot)
  assert other.step("down").observation == below
  options = {"size": 5, "is_slippery": False}
  with_neighbours = frozenlake.make_tasks("test", 20, 4, neighbours=True, **options)
  assert [dict(t.env_kwargs)["desc"] for t in with_neighbours] == [
      dict(t.env_kwargs)["desc"] for t in frozenlake.make_tasks("test", 20, 4, **options)]


def test_frozenlake_held_out_maps_are_never_training_maps():
  """At size 4 maps repeat often (about 520 distinct in 1600 draws), yet no map of the test
  split is a map of the training split, and each split's maps are those `map_split` names."""
  maps = {split: {dict(t.env_kwargs)["desc"]
                  for t in frozenlake.make_tasks(split, n, 0, size=4, is_slippery=False)}
          for split, n in (("train", 1600), ("test", 512))}
  assert len(maps["train"]) < 1000 and len(maps["test"]) < 400
  assert not maps["train"] & maps["test"]
  assert {frozenlake.map_split(m) for m in maps["train"]} == {"train"}
  assert {frozenlake.map_split(m) for m in maps["test"]} == {"test"}
  # CRC-32 of the rows joined: gymnasium's 4x4 map 428120831 (odd), the other 1676615000.
  assert frozenlake.map_split(("SFFF", "FHFH", "FFFH", "HFFG")) == "test"
  assert frozenlake.map_split(("SFFF", "FFFF", "FFFH", "FFFG")) == "train"


def test_frozenlake_size_without_maps_of_a_split_is_an_input_error():
  """At size 2 every valid map (SFFG, SHFG, SFHG) has an even CRC-32, so the test split has
  none: one TaskInputError naming the option, after a bounded number of draws, not a hang."""
  assert len(frozenlake.make_tasks("train", 3, 0, size=2)) == 3
  with pytest.raises(base.TaskInputError, match=r"^env.options.size = 2: no test map in 1000"):
    frozenlake.make_tasks("test", 1, 0, size=2)


def test_taxi_without_rain_rewards():
  taxi = registry.get_environment("taxi")
  task = taxi.make_tasks("train", 1, 0, is_rainy=False, fickle_passenger=False)[0]
  sandbox = taxi.make_sandbox()
  sandbox.reset(task)
  env = sandbox._env
  row, col, passenger, _ = env.decode(int(env.s))
  assert passenger != 4
  # Picking up where the passenger is not costs 10; a move costs 1.
  assert sandbox.step("pickup").reward == -10.0
  assert sandbox.step("north").reward == -1.0


def test_blackjack_text_matches_the_hand():
  task = blackjack.make_tasks("train", 1, 0)[0]
  sandbox = blackjack.make_sandbox()
  text = sandbox.reset(task)
  player = sandbox._env.player
  total = sum(player) + (10 if 1 in player and sum(player) + 10 <= 21 else 0)
  assert f"(sum {total}" in text
  assert f"The dealer shows {sandbox._env.dealer[0]}." in text
  assert len(sandbox._env.dealer) == 2 and str(sandbox._env.dealer[1]) not in text.split(
      "The dealer shows")[1][2:]


@pytest.mark.parametrize("name", NAMES)
def test_unknown_action_lists_the_valid_ones_and_tasks_are_disjoint(name):
  module = registry.get_environment(name)
  task = module.make_tasks("train", 1, 0)[0]
  sandbox = module.make_sandbox()
  sandbox.reset(task)
  step = sandbox.step("fly away")
  assert step.observation.startswith("Invalid action: unknown action. Use one of: ")
  assert step.info["invalid_action"] == "unknown action"
  assert sandbox.admissible_actions() == list(module.SPEC.actions)
  train = {t.task_id for t in module.make_tasks("train", 30, 0)}
  test = {t.task_id for t in module.make_tasks("test", 30, 0)}
  assert len(train) == 30 and not train & test
  other = "taxi" if name == "frozenlake" else "frozenlake"
  with pytest.raises(ValueError, match=f"a {other} sandbox cannot play a {name} task"):
    registry.get_environment(other).make_sandbox().reset(task)
