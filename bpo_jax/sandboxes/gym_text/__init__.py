"""Gymnasium toy-text environments as text sandboxes whose snapshots include the RNG state.

FrozenLake (slippery), Taxi (rainy, fickle passenger), CliffWalking (slippery) and Blackjack are
all stochastic: restoring only the position and replaying would diverge, because the next
random draw depends on the generator's state. A snapshot here is the pickled tuple
`(task, steps, episode over, the environment's state attributes, the numpy bit generator's
state)`, which any process can restore.

Each environment has its own module (`frozenlake`, `taxi`, `cliffwalking`, `blackjack`) that
describes it in a `GymTextSpec` and takes the registry's interface (docs/DESIGN.md §4) from the
functions here, its spec bound:

    make_sandbox(**config) -> GymTextSandbox
    make_tasks(split, num, seed, **config) -> list[GymTask]

A task is a reset seed (plus, for FrozenLake, a generated map); "train" uses even reset seeds
and "test" odd ones, each split from a generator of its own (FrozenLake's maps are split as
well: `frozenlake.map_split`). A world whose spec has an `expert` (FrozenLake without
slipping) also gives `expert_actions()`, a shortest solution, for warm starts. Actions are
words ("left", "pickup", "hit"); anything else gets an observation listing the valid ones.
For language-model agents each module also has `SYSTEM_PROMPT` and `parse_action(text)` (the
first line of a reply that starts with an action word; see `free_text.py`), from
`system_prompt` and `parse_action` here.
"""

from __future__ import annotations

import dataclasses
import pickle
import random
from typing import Any, Callable

import numpy as np

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import free_text

# Reset seeds per split: "train" takes the even seeds below 2 x this, "test" the odd ones.
SEEDS_PER_SPLIT = 1 << 30


@dataclasses.dataclass(frozen=True)
class GymTask:
  """One episode: `env_kwargs` build the environment, `reset_seed` seeds its generator."""

  task_id: str
  env_name: str
  reset_seed: int
  env_kwargs: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class GymTextSpec:
  """How one toy-text environment is built, described and judged."""

  name: str
  make_env: Callable[..., Any]         # env_kwargs -> the unwrapped gymnasium env
  actions: tuple[str, ...]             # action words, in the env's action index order
  state_attributes: tuple[str, ...]    # what besides the RNG makes the env's state
  goal: str                            # the goal sentence of the first observation
  describe: Callable[[Any], str]       # env -> the current state in words
  is_success: Callable[[float, bool], bool]  # (reward, terminated) -> success
  max_steps: int
  # (rng, split, **task options) -> one task's env_kwargs; the task options are `make_tasks`'s
  # keyword arguments (env.options), and it ignores those it does not name.
  task_env_kwargs: Callable[..., tuple[tuple[str, Any], ...]]
  # env -> a shortest list of action words from its current state to success, or None where
  # the world has no such plan (a stochastic one); None: no expert at all.
  expert: Callable[[Any], list[str] | None] | None = None


# The worlds' success rules, as functions rather than lambdas so that a spec (and a module's
# `make_sandbox`, a partial of it) pickles for the sandbox pool's workers.
def success_on_positive_reward(reward: float, terminated: bool) -> bool:
  del terminated
  return reward > 0


def success_on_termination(reward: float, terminated: bool) -> bool:
  del reward
  return terminated


class GymTextSandbox:
  """A gymnasium toy-text env behind the `Sandbox` protocol (see the package docstring)."""

  _SNAPSHOT_VERSION = 1

  def __init__(self, spec: GymTextSpec, max_steps: int | None = None):
    self.spec = spec
    self.max_steps = spec.max_steps if max_steps is None else int(max_steps)
    if self.max_steps < 1:
      raise ValueError(f"max_steps must be positive, got {max_steps}")
    self._env = None
    self._env_kwargs = None
    self._task: GymTask | None = None
    self._steps = 0
    self._over = False

  def _build(self, task: GymTask):
    if task.env_name != self.spec.name:
      raise ValueError(f"a {self.spec.name} sandbox cannot play a {task.env_name} task")
    if self._env is None or self._env_kwargs != task.env_kwargs:
      if self._env is not None:
        self._env.close()
      self._env = self.spec.make_env(**dict(task.env_kwargs))
      self._env_kwargs = task.env_kwargs
    self._task = task

  def _action_list(self) -> str:
    return ", ".join(self.spec.actions)

  def reset(self, task: GymTask) -> str:
    if not isinstance(task, GymTask):
      raise TypeError(f"reset expects a GymTask, got {type(task).__name__}")
    self._build(task)
    self._env.reset(seed=task.reset_seed)
    self._steps = 0
    self._over = False
    return (f"{self.spec.goal} {self.spec.describe(self._env)} "
            f"Actions: {self._action_list()}.")

  def step(self, action: Any) -> base.Step:
    if self._task is None:
      raise RuntimeError("call reset(task) or restore(snapshot) first")
    if self._over:
      return base.Step("The episode is over.", 0.0, True, False, {"success": False})
    text, reason = base.check_action(action, max_chars=200)
    if reason is None and text.lower() not in self.spec.actions:
      reason = "unknown action"
    if reason is not None:
      self._steps += 1
      truncated = self._steps >= self.max_steps
      self._over = truncated
      info = {"invalid_action": reason}
      if truncated:
        info["success"] = False
      return base.Step(f"Invalid action: {reason}. Use one of: {self._action_list()}. "
                       f"{self.spec.describe(self._env)}", 0.0, truncated, truncated, info)
    _, reward, terminated, _, _ = self._env.step(self.spec.actions.index(text.lower()))
    self._steps += 1
    reward = float(reward)
    truncated = not terminated and self._steps >= self.max_steps
    self._over = bool(terminated) or truncated
    info = {}
    if self._over:
      info["success"] = bool(terminated) and self.spec.is_success(reward, bool(terminated))
    return base.Step(self.spec.describe(self._env), reward, self._over, truncated, info)

  def admissible_actions(self) -> list[str]:
    return [] if self._over else list(self.spec.actions)

  def expert_actions(self) -> list[str] | None:
    """The spec's expert from the current state: a shortest solution, or None where the world
    has no expert, no plan from here, or the episode is over."""
    if self._task is None:
      raise RuntimeError("call reset(task) or restore(snapshot) first")
    if self._over or self.spec.expert is None:
      return None
    return self.spec.expert(self._env)

  def snapshot(self) -> base.Snapshot:
    if self._task is None:
      raise RuntimeError("call reset(task) or restore(snapshot) first")
    env = self._env
    state = {name: getattr(env, name) for name in self.spec.state_attributes}
    payload = (self._SNAPSHOT_VERSION, dataclasses.astuple(self._task), self._steps, self._over,
               state, env.np_random.bit_generator.state)
    return base.Snapshot(pickle.dumps(payload, protocol=4))

  def restore(self, snapshot: base.Snapshot) -> None:
    if not isinstance(snapshot, base.Snapshot):
      raise TypeError(f"restore expects a Snapshot, got {type(snapshot).__name__}")
    version, task_fields, steps, over, state, rng_state = pickle.loads(snapshot.data)
    if version != self._SNAPSHOT_VERSION:
      raise ValueError(f"snapshot version {version} is not {self._SNAPSHOT_VERSION}")
    task = GymTask(*task_fields)
    self._build(task)
    if self._env._np_random is None:  # pylint: disable=protected-access
      self._env.reset(seed=task.reset_seed)
    for name, value in state.items():
      setattr(self._env, name, value)
    generator = np.random.Generator(getattr(np.random, rng_state["bit_generator"])())
    generator.bit_generator.state = rng_state
    self._env.np_random = generator
    self._steps = steps
    self._over = over

  def close(self) -> None:
    if self._env is not None:
      self._env.close()
    self._env = None
    self._task = None


def make_sandbox(spec: GymTextSpec, max_steps: int | None = None, **unused) -> GymTextSandbox:
  """A sandbox of `spec`'s environment; `max_steps` None takes the spec's."""
  del unused  # the task options
  return GymTextSandbox(spec, max_steps=max_steps)


def make_tasks(spec: GymTextSpec, split: str, num: int, seed: int, **options) -> list[GymTask]:
  """`num` distinct tasks of `spec`'s environment; reset seeds are even for "train" and odd for
  "test", drawn from a generator of the split's own. `options` and the split go to
  `spec.task_env_kwargs`, called once per task after its reset seed is drawn, with the same
  generator."""
  env_name = spec.name
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if not 0 <= num <= SEEDS_PER_SPLIT:
    raise ValueError(f"num must be in [0, {SEEDS_PER_SPLIT}] (the split's seeds), got {num}")
  rng = random.Random(f"{env_name}/{split}/{seed}")
  parity = 0 if split == "train" else 1
  tasks, seen = [], set()
  while len(tasks) < num:
    reset_seed = 2 * rng.randrange(SEEDS_PER_SPLIT) + parity
    if reset_seed in seen:
      continue
    seen.add(reset_seed)
    env_kwargs = spec.task_env_kwargs(rng, split=split, **options)
    tasks.append(GymTask(task_id=f"{env_name}-{reset_seed}", env_name=env_name,
                         reset_seed=reset_seed, env_kwargs=env_kwargs))
  return tasks


def system_prompt(spec: GymTextSpec) -> str:
  """The action syntax of a toy-text world, for a language model's system turn."""
  return f"Reply with one action word: {', '.join(spec.actions)}."


def parse_action(spec: GymTextSpec, text: str) -> str | None:
  """The first line of a reply that starts with one of `spec.actions`; None if none does."""
  return free_text.first_command(text, spec.actions)
