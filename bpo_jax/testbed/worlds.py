"""The testbed's world: a chain of decisions whose success depends on an early and a late action.

An episode is `horizon` (H) decisions among `num_actions` (A) actions. Action 0 is the right one.
A task is a threshold u_m = (m + 1/2) / M, m = 0..M−1, hidden from the policy. The episode ends
after its H-th step with reward

  G = 1[u_m < w · e + (1 − w) · l],   e = 1[a_0 = 0],  l = 1[a_{H−1} = 0],

and 0 before. The middle actions change nothing. `early_weight` w moves the return's variance
between the first decision and the last: with w = 1 the state after the first step decides G,
with w = 0 only the last action does. Averaged over tasks, P(G = 1 | a) = w · e + (1 − w) · l
(up to the tasks' grid), so the optimum is 1 for every w, and a uniform policy succeeds with
about 1/A.

The sandbox state (the snapshot) is three integers (task, t, e): everything the rest of the
episode depends on, so a restore is a copy and siblings forked at a state share its future up to
their own actions (docs/DESIGN.md §4). The tabular policy sees the state without the task: its
row is s = 0 at t = 0 and s = 1 + 2(t − 1) + e after, 1 + 2(H − 1) rows in all. A state's exact
key (GiGPO's `state_id`) is task · S + s.

`prefix_share` is the quantity the variance theorem names (docs/DESIGN.md §3): the share of the
return's variance that the state s_t at a fork explains, Var(E[G | s_t]) / Var(G), within a task
(a group and a tree are both grown for one task) and averaged over tasks as
Σ_m Var_m(E[G | s_t]) / Σ_m Var_m(G). In this world it is the same at every depth 1..H−1.
Everything is computed by enumerating the A^H action sequences.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

TASK, TIME, EARLY = 0, 1, 2  # fields of the sandbox state


@functools.partial(jax.tree_util.register_dataclass, data_fields=["early_weight"],
                   meta_fields=["horizon", "num_actions", "num_tasks"])
@dataclasses.dataclass(frozen=True)
class ChainWorld:
  """One world of the family (module docstring).

  Attributes:
    early_weight: w in [0, 1], the weight of the first decision in the success probability.
    horizon: H ≥ 2 decisions per episode.
    num_actions: A ≥ 2 actions per decision.
    num_tasks: M ≥ 1 tasks (thresholds u_m).
  """
  early_weight: float
  horizon: int = 4
  num_actions: int = 4
  num_tasks: int = 16

  def __post_init__(self):
    if isinstance(self.early_weight, (int, float)) and not 0.0 <= self.early_weight <= 1.0:
      raise ValueError(f"early_weight must be in [0, 1], got {self.early_weight}")
    if self.horizon < 2 or self.num_actions < 2 or self.num_tasks < 1:
      raise ValueError(f"need horizon >= 2, num_actions >= 2, num_tasks >= 1; got "
                       f"{self.horizon}, {self.num_actions}, {self.num_tasks}")

  @property
  def num_states(self) -> int:
    """Rows of the policy's table."""
    return 1 + 2 * (self.horizon - 1)

  def thresholds(self) -> np.ndarray:
    """float32[M]: the tasks' u_m."""
    return ((np.arange(self.num_tasks) + 0.5) / self.num_tasks).astype(np.float32)


def reset(task: jax.Array) -> jax.Array:
  """int32[3]: the state at the start of `task`."""
  return jnp.stack([jnp.asarray(task, jnp.int32), jnp.int32(0), jnp.int32(0)])


def step(world: ChainWorld, state: jax.Array, action: jax.Array):
  """(next state, reward, terminal) of `action` at `state`: pure, so a snapshot is the state.

  The reward is paid at the last step: 1[u_task < w · e + (1 − w) · 1[action = 0]].
  """
  t = state[TIME]
  early = jnp.where(t == 0, (action == 0).astype(jnp.int32), state[EARLY])
  terminal = t == world.horizon - 1
  p = world.early_weight * early + (1.0 - world.early_weight) * (action == 0)
  u = jnp.asarray(world.thresholds())[state[TASK]]
  reward = jnp.where(terminal & (u < p), 1.0, 0.0).astype(jnp.float32)
  return jnp.stack([state[TASK], t + 1, early]), reward, terminal


def policy_row(state: jax.Array) -> jax.Array:
  """The policy's table row for a state: 0 at t = 0, 1 + 2(t − 1) + e after."""
  return jnp.where(state[TIME] == 0, 0, 1 + 2 * (state[TIME] - 1) + state[EARLY])


def state_key(world: ChainWorld, state: jax.Array) -> jax.Array:
  """The state's exact key, task · S + row (a step group of GiGPO holds one key)."""
  return (state[TASK] * world.num_states + policy_row(state)).astype(jnp.int32)


def _sequences(world: ChainWorld) -> np.ndarray:
  """int32[A^H, H]: every action sequence, the first action the slowest-varying."""
  return np.array(list(itertools.product(range(world.num_actions), repeat=world.horizon)),
                  np.int32).reshape(-1, world.horizon)


def enumerate_episodes(world: ChainWorld):
  """Every episode of every task: (rows int32[A^H, H], actions int32[A^H, H], returns
  float32[M, A^H]); rows are the policy's table rows visited, the same for every task. The
  returns are jnp (traced with the world's `early_weight`), the rest NumPy."""
  actions = _sequences(world)
  early = (actions[:, 0] == 0).astype(np.int32)
  t = np.arange(world.horizon)
  rows = np.where(t == 0, 0, 1 + 2 * (t - 1) + early[:, None]).astype(np.int32)
  w = jnp.asarray(world.early_weight, jnp.float32)
  p = w * early + (1.0 - w) * (actions[:, -1] == 0)
  returns = (jnp.asarray(world.thresholds())[:, None] < p[None, :]).astype(jnp.float32)
  return rows, actions, returns


def sequence_probabilities(logits: jax.Array, rows: np.ndarray, actions: np.ndarray):
  """float[A^H]: each action sequence's probability under the softmax table `logits` [S, A]."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.exp(jnp.sum(logp[rows, actions], axis=-1))


def expected_success(logits: jax.Array, world: ChainWorld) -> jax.Array:
  """J(θ) = mean over tasks of E[G], exact; differentiable (its gradient is the true one)."""
  rows, actions, returns = enumerate_episodes(world)
  p = sequence_probabilities(logits, rows, actions)
  return jnp.mean(jnp.asarray(returns, logits.dtype) @ p)


def prefix_share(world: ChainWorld, logits: np.ndarray | None = None, depth: int = 1) -> float:
  """Σ_m Var_m(E[G | s_depth]) / Σ_m Var_m(G) under the policy `logits` (uniform if None), exact
  in float64; 0 when G never varies. E[G | s_t] is E[G | a_0..a_{t−1}]: the state after a
  prefix is all its future depends on.

  Example: H = 2, A = 2, tasks u = 1/4, 3/4, w = 3/4, uniform policy: in the first task G = e
  (variances 1/4 and 1/4), in the second G = e · l (1/16 and 3/16), share 5/16 / 7/16 = 5/7.
  """
  if not 1 <= depth <= world.horizon - 1:
    raise ValueError(f"depth must be in [1, {world.horizon - 1}], got {depth}")
  rows, actions, returns = enumerate_episodes(world)
  if logits is None:
    logits = np.zeros((world.num_states, world.num_actions))
  logp = np.log(_softmax(np.asarray(logits, np.float64)))
  p = np.exp(logp[rows, actions].sum(-1))
  g = np.asarray(returns, np.float64)
  mean = g @ p
  var_total = np.sum((g**2) @ p - mean**2)
  prefix_p = p.reshape(world.num_actions**depth, -1)
  conditional = (g.reshape(world.num_tasks, world.num_actions**depth, -1) * prefix_p).sum(-1)
  conditional = conditional / np.maximum(prefix_p.sum(-1), 1e-300)
  var_explained = np.sum((conditional**2) @ prefix_p.sum(-1) - mean**2)
  return float(var_explained / var_total) if var_total > 0 else 0.0


def _softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(axis=-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=-1, keepdims=True)
