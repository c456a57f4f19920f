"""The sandbox contract's helpers: snapshots, replay checking, the gymnasium adapter, the
registry."""

import pickle

import gymnasium
import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import registry
from bpo_jax.sandboxes import rooms


class _LeakyRooms(rooms.RoomsSandbox):
  """Rooms with a hidden counter that the snapshot leaves out: replays must diverge."""

  def __init__(self):
    super().__init__()
    self.hidden = 0

  def step(self, action):
    self.hidden += 1
    step = super().step(action)
    return base.Step(f"{step.observation} ({self.hidden})", step.reward, step.done,
                     step.truncated, step.info)


def test_check_replay_reports_the_first_divergence():
  task = rooms.make_tasks("train", 1, 0)[0]
  leaky = _LeakyRooms()
  leaky.reset(task)
  snap = leaky.snapshot()
  divergence = base.check_replay(leaky, snap, ["go north", "go south"])
  assert divergence.step == 0 and divergence.field == "observation"
  assert divergence.first.endswith("(1)") and divergence.second.endswith("(3)")
  assert str(divergence).startswith("step 0: observation differs")
  honest = rooms.make_sandbox()
  honest.reset(task)
  assert base.check_replay(honest, honest.snapshot(), ["go north", "go south"]) is None


def test_first_divergence_compares_every_field_exactly():
  a = base.Step("x", 1.0, False)
  assert base.first_divergence([a], [base.Step("x", 1.0, False)]) is None
  assert base.first_divergence([a], [base.Step("x", 1.0 + 2**-52, False)]).field == "reward"
  assert base.first_divergence([a], [base.Step("x", 1.0, True)]).field == "done"
  assert base.first_divergence([a], [base.Step("x", 1.0, False, True)]).field == "truncated"
  assert base.first_divergence([a, a], [a]) == base.Divergence(1, "length", 2, 1)


def test_snapshot_pickles_bytes_only():
  snap = base.Snapshot(b"state", handle=object())
  copy = pickle.loads(pickle.dumps(snap))
  assert copy.data == b"state" and copy.handle is None and copy == snap and len(copy) == 5


def test_gymnasium_adapter_plays_a_sandbox():
  tasks = rooms.make_tasks("train", 3, 0)
  env = base.make_gym_env(rooms.make_sandbox(), tasks)
  assert isinstance(env, gymnasium.Env) and isinstance(env, base.SandboxGymEnv)
  assert isinstance(env.observation_space, gymnasium.spaces.Text)
  assert isinstance(env.action_space, gymnasium.spaces.Text)
  observation, info = env.reset(seed=0, options={"task": tasks[1]})
  assert observation.startswith("Goal:") and info["task_id"] == tasks[1].task_id
  plan = rooms.expert_actions(tasks[1])
  assert plan[0] in info["admissible_actions"]
  for action in plan:
    observation, reward, terminated, truncated, info = env.step(action)
  assert (reward, terminated, truncated) == (1.0, True, False) and info["success"]
  # Seeded task choice is reproducible.
  assert env.reset(seed=5)[1]["task_id"] == env.reset(seed=5)[1]["task_id"]
  truncating = base.make_gym_env(rooms.make_sandbox(max_steps=1), tasks)
  truncating.reset(seed=0)
  assert truncating.step("go up")[2:4] == (False, True)
  with pytest.raises(ValueError, match="at least one task"):
    base.make_gym_env(rooms.make_sandbox(), [])


MINE = ("rooms", "textworld", "frozenlake", "taxi", "cliffwalking", "blackjack")


@pytest.mark.parametrize("name", MINE)
def test_registry_modules_expose_the_environment_interface(name):
  module = registry.get_environment(name)
  assert callable(module.make_sandbox) and callable(module.make_tasks)
  assert isinstance(module.make_sandbox(), base.Sandbox)


def test_registry_unknown_name_lists_known_names():
  with pytest.raises(KeyError, match="unknown environment 'nope'; known environments: .*rooms"):
    registry.get_environment("nope")
  assert set(MINE) <= set(registry.environment_names())


@pytest.mark.slow
def test_importing_the_package_imports_no_environment_package():
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  code = ("import sys, bpo_jax.sandboxes; print(sorted(m for m in ('gymnasium', 'textworld', "
          "'jericho', 'bpo_jax.sandboxes.rooms') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=root)).stdout
  assert out.strip() == "[]"
