"""Every environment: fork three actions from one snapshot; replays are byte-identical,
in the same sandbox, in a fresh sandbox, and in other worker processes."""

import os

import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import registry

GAMES_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                         "textworld_games")

# name -> (sandbox config, task config, prefix actions, three fork actions, continuation).
CASES = {
    "rooms": ({}, {"difficulty": 3}, ["take red key"],
              ["go north", "open red door", "take red key"], ["go south", "go north", "look"]),
    "frozenlake": ({}, {}, ["right"], ["down", "right", "up"], ["down", "right"] * 4),
    "taxi": ({}, {}, ["north"], ["south", "east", "pickup"], ["west", "north", "east"] * 3),
    "cliffwalking": ({}, {}, ["up"], ["up", "right", "left"], ["right"] * 6),
    "blackjack": ({}, {}, [], ["hit", "stick", "double"], ["hit", "hit"]),
    "textworld": ({}, {"games_dir": GAMES_DIR}, ["look"],
                  ["go north", "examine box", "unlock box with keycard"],
                  ["open box", "take desktop computer from box", "inventory"]),
}


def _task(name, task_config):
  module = registry.get_environment(name)
  tasks = module.make_tasks("train", 2, 0, **task_config)
  if name == "textworld":  # the fixture game whose objects the actions above name
    return next(t for t in tasks if t.task_id.endswith("custom-s1"))
  if name == "rooms":
    return next(t for t in module.make_tasks("test", 1, 0, difficulty=3))
  return tasks[0]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
  name = request.param
  sandbox_config, task_config, prefix, forks, continuation = CASES[name]
  module = registry.get_environment(name)
  sandbox = module.make_sandbox(**sandbox_config)
  task = _task(name, task_config)
  sandbox.reset(task)
  for action in prefix:
    assert not sandbox.step(action).done
  snapshot = sandbox.snapshot()
  yield name, sandbox_config, module, sandbox, snapshot, forks, continuation
  sandbox.close()


def test_forks_replay_identically_in_process(case):
  name, sandbox_config, module, sandbox, snapshot, forks, continuation = case
  fresh = module.make_sandbox(**sandbox_config)
  sequences = []
  for action in forks:
    actions = [action] + continuation
    divergence = base.check_replay(sandbox, snapshot, actions)
    assert divergence is None, f"{name}: {divergence}"
    divergence = base.check_replay(sandbox, base.Snapshot(snapshot.data), actions, other=fresh)
    assert divergence is None, f"{name} (fresh sandbox, bytes only): {divergence}"
    sequences.append(base.replay(sandbox, snapshot, actions))
  # The forks really are different branches. In the deterministic worlds each action has its own
  # outcome; in the stochastic ones two actions may slip into the same cell, but not all three.
  distinct = len({tuple(s.observation for s in seq) for seq in sequences})
  assert distinct == 3 if name in ("rooms", "textworld") else distinct >= 2, name
  fresh.close()


@pytest.fixture(scope="module")
def pools():
  opened = {}

  def get(name, sandbox_config):
    if name not in opened:
      opened[name] = pool_lib.SandboxPool.for_environment(
          name, num_workers=2, timeout_s=60.0, **sandbox_config)
    return opened[name]

  yield get
  for pool in opened.values():
    pool.shutdown()


@pytest.mark.slow
def test_forks_replay_identically_in_other_processes(case, pools):
  name, sandbox_config, _, sandbox, snapshot, forks, continuation = case
  pool = pools(name, sandbox_config)
  expected = {i: base.replay(sandbox, snapshot, [a] + continuation) for i, a in enumerate(forks)}
  branches = [f"{name}-fork{i}" for i in range(3)]
  assert all(r is None for r in pool.restore_many({b: snapshot for b in branches}).values())
  # Siblings are spread over both workers.
  assert {pool.worker_of(b) for b in branches} == {0, 1}
  got = {i: [] for i in range(3)}
  for t in range(1 + len(continuation)):
    live = {b: ([forks[i]] + continuation)[t] for i, b in enumerate(branches)
            if len(got[i]) == t and not (got[i] and got[i][-1].done)}
    for b, step in pool.step_many(live).items():
      assert isinstance(step, base.Step), step
      got[branches.index(b)].append(step)
  for i in range(3):
    assert base.first_divergence(expected[i], got[i]) is None, (name, i)
  # A snapshot taken in one worker restores in the other, and replays identically.
  mid = pool.snapshot(branches[0])
  assert isinstance(mid, base.Snapshot)
  source_worker = pool.worker_of(branches[0])
  assert pool.restore_many({f"{name}-copy": mid})[f"{name}-copy"] is None
  if pool.worker_of(f"{name}-copy") == source_worker:  # force the other worker
    pool.close(f"{name}-copy")
    pool.restore_many({f"{name}-pad": mid})
    pool.restore_many({f"{name}-copy": mid})
  assert pool.worker_of(f"{name}-copy") != source_worker
  continuation_again = continuation[:2]
  there = [pool.step(f"{name}-copy", a) for a in continuation_again]
  here = base.replay(sandbox, mid, continuation_again)
  assert base.first_divergence(here, there[:len(here)]) is None, name
  pool.close_many(branches + [f"{name}-copy", f"{name}-pad"])


BAD_ACTIONS = {
    "empty": "",
    "one megabyte": "go " * ((1 << 20) // 3),
    "invalid utf-8": b"\xff\xfe go north",
    "control character": "go\x00north",
    "escape sequence": "\x1b[2J",
}


@pytest.mark.parametrize("kind", sorted(BAD_ACTIONS))
def test_bad_actions_get_an_observation_not_an_exception(case, kind):
  name, _, _, sandbox, snapshot, _, _ = case
  sandbox.restore(snapshot)
  step = sandbox.step(BAD_ACTIONS[kind])
  assert "Invalid action" in step.observation, (name, step.observation)
  assert step.info["invalid_action"], name
  assert step.reward == 0.0 and not step.done
  # The state did not change apart from the step count: the next real action still works.
  assert not sandbox.step("look" if name in ("rooms", "textworld") else "up").observation == ""
