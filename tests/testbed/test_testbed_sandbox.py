"""The testbed world behind the Sandbox protocol: the jitted world's returns, snapshots that
restore the state whole."""

import itertools
import pickle

import numpy as np
import pytest

from bpo_jax.sandboxes.base import Sandbox
from bpo_jax.testbed import worlds
from bpo_jax.testbed.sandbox import ChainSandbox

WORLD = worlds.ChainWorld(0.75, horizon=2, num_actions=2, num_tasks=2)


@pytest.mark.slow
def test_is_a_sandbox_whose_returns_are_the_enumerated_ones():
  sandbox = ChainSandbox(WORLD)
  assert isinstance(sandbox, Sandbox)
  _, actions, returns = worlds.enumerate_episodes(WORLD)
  for task in range(WORLD.num_tasks):
    for index, sequence in enumerate(actions):
      sandbox.reset(task)
      steps = [sandbox.step(str(a)) for a in sequence]
      assert [s.done for s in steps] == [False, True]
      assert sum(s.reward for s in steps) == float(np.asarray(returns)[task, index])


def test_snapshot_restores_the_state_whole():
  sandbox = ChainSandbox(WORLD)
  sandbox.reset(1)
  sandbox.step("0")
  snap = pickle.loads(pickle.dumps(sandbox.snapshot()))  # as bytes, across processes
  outcomes = []
  for last in ("0", "1"):
    sandbox.restore(snap)
    outcomes.append(sandbox.step(last).reward)
  # Task u = 3/4: the first action right, then the last right pays 1, wrong pays 0 (p = 3/4).
  assert outcomes == [1.0, 0.0]
  assert len(snap) == 12


def test_bad_actions_get_an_observation_and_change_nothing():
  sandbox = ChainSandbox(WORLD)
  sandbox.reset(0)
  before = sandbox.snapshot()
  for bad in ("", "7", "-1", "left", "1.0"):
    step = sandbox.step(bad)
    assert step.observation.startswith("not an action") and not step.done and step.reward == 0
  assert sandbox.snapshot() == before
