"""A `ChainWorld` behind the library's `Sandbox` protocol (docs/DESIGN.md §4), on the host.

The same `worlds.step` the jitted testbed runs, so any host-side code that takes a sandbox (the
rollout engine, the pool, `make_gym_env`) can drive a testbed world. An action is the text of
an action's index ("0" .. "A−1"); anything else gets an observation saying so, costs no step
and changes nothing. The observation is the policy's view, "t=<t> row=<row>", never the task's
hidden threshold. A snapshot is the state's three int32 as 12 bytes: all the future depends on.
"""

from __future__ import annotations

import numpy as np

from bpo_jax.sandboxes.base import Snapshot, Step
from bpo_jax.testbed import worlds


class ChainSandbox:
  """One episode at a time of `world`; `reset(task)` takes the task's index 0..M−1."""

  def __init__(self, world: worlds.ChainWorld):
    self._world = world
    self._state: np.ndarray | None = None

  def _observation(self) -> str:
    return f"t={int(self._state[worlds.TIME])} row={int(worlds.policy_row(self._state))}"

  def reset(self, task) -> str:
    if not 0 <= int(task) < self._world.num_tasks:
      raise ValueError(f"task must be in [0, {self._world.num_tasks}), got {task}")
    self._state = np.asarray(worlds.reset(int(task)))
    return self._observation()

  def step(self, action: str) -> Step:
    if self._state is None:
      raise RuntimeError("step before reset")
    text = action.strip() if isinstance(action, str) else ""
    if not (text.isdigit() and int(text) < self._world.num_actions):
      return Step(f"not an action: give one of 0..{self._world.num_actions - 1}", 0.0, False)
    state, reward, terminal = worlds.step(self._world, self._state, np.int32(int(text)))
    self._state = np.asarray(state)
    return Step(self._observation(), float(reward), bool(terminal))

  def snapshot(self) -> Snapshot:
    return Snapshot(np.asarray(self._state, "<i4").tobytes())

  def restore(self, snapshot: Snapshot) -> None:
    self._state = np.frombuffer(snapshot.data, "<i4").copy()

  def close(self) -> None:
    self._state = None
