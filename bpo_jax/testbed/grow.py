"""Growing one task's tree or group in a `ChainWorld`, jitted: the rollout engine's rules on arrays.

The rules are the engine's (`rollout/policies.py`, `rollout/budget.py`, docs/DESIGN.md §3):

* All branches of a tree advance in lockstep, one depth per turn. At each turn every branch that
  was live when the turn began decides once, in order, from what is known at its state: the
  entropy there above `entropy_threshold` (`branching.online_fork_decision`), forks used below
  `max_forks`, and the budgets affording K − 1 more branches, charged worst-case: every live
  branch its remaining H − t steps, so env steps used + those + (K − 1)(H − t) ≤ `max_env_steps`
  and branches started + K − 1 ≤ `max_leaves`. A fork's K − 1 new branches start at the same
  state (a restore of its snapshot) and decide from the next turn on, if `siblings_fork`.
  K is `root_k` at the root state when set, else `k`.
* A group (the baselines' topology) forks N = `max_env_steps` // H episodes at the root and
  never after (N fixed before any episode starts).

Then every live branch samples its action from the softmax table and steps; each step is one
node of a `RolloutTree` (parent: the branch's previous step). Episodes all last H steps, so the
live branches are always slots 0..started−1 and the nodes of a turn are numbered in slot order.
Actions come from a `choose(depth, logits[L, A]) -> int32[L]` function: sampling in training,
a fixed table when a test enumerates every tree.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from bpo_jax import branching
from bpo_jax.testbed import worlds
from bpo_jax.tree import RolloutTree


@dataclasses.dataclass(frozen=True)
class Topology:
  """What is grown per task.

  Attributes:
    kind: "tree" (BPO) or "group" (GRPO, RLOO, GiGPO).
    max_env_steps: the env-step budget per task, the same for every method.
    k, root_k, max_leaves, siblings_fork, entropy_threshold: the tree's fork rule, as the
      rollout config's keys of the same names (root_k 0: K at the root too).
  """
  kind: str
  max_env_steps: int
  k: int = 2
  root_k: int = 0
  max_leaves: int = 8
  siblings_fork: bool = True
  entropy_threshold: float = 0.0

  def __post_init__(self):
    if self.kind not in ("tree", "group"):
      raise ValueError(f"Topology.kind must be 'tree' or 'group', got {self.kind!r}")
    if self.k < 2 or (self.root_k and self.root_k < 2) or self.max_leaves < 1:
      raise ValueError(f"need k >= 2, root_k 0 or >= 2, max_leaves >= 1; got {self.k}, "
                       f"{self.root_k}, {self.max_leaves}")

  def group_size(self, horizon: int) -> int:
    """N: the whole episodes of H steps that fit the budget."""
    return self.max_env_steps // horizon

  def slots(self, horizon: int) -> int:
    """Branches (leaves) a tree or group can have."""
    return self.group_size(horizon) if self.kind == "group" else self.max_leaves

  def siblings_at(self, depth: int) -> int:
    return self.root_k if depth == 0 and self.root_k else self.k

  def max_forks(self) -> int:
    return (self.max_leaves - 1) // (self.k - 1)


class Grown(NamedTuple):
  """One task's tree: the `RolloutTree` plus what the policy gradient needs per node."""
  tree: RolloutTree
  row: jax.Array  # int32[C]: the policy table row of each node's state
  action: jax.Array  # int32[C]


class _Branches(NamedTuple):
  live: jax.Array  # bool[L]
  state: jax.Array  # int32[L, 3]
  last: jax.Array  # int32[L]: the branch's latest node (-1 before its first step)
  can_fork: jax.Array  # bool[L]
  started: jax.Array  # int32: branches started (live slots are 0..started−1)
  forks: jax.Array  # int32: forks made


def _entropy(logits: jax.Array) -> jax.Array:
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def _decide_turn(topo: Topology, horizon: int, depth: int, b: _Branches, entropy: jax.Array,
                 env_steps: jax.Array) -> _Branches:
  """The turn's fork decisions, slot by slot (earlier forks are charged before later ones)."""
  if topo.kind == "group":  # N − 1 new episodes beside the first, at the root only
    if depth > 0:
      return b
    n = topo.group_size(horizon)
    return b._replace(live=jnp.arange(b.live.shape[0]) < n, started=jnp.int32(n),
                      forks=jnp.int32(1), can_fork=jnp.zeros_like(b.can_fork))
  new = topo.siblings_at(depth) - 1
  deciders = b.live & b.can_fork
  slots = b.live.shape[0]

  def decide(slot, carry):
    b, worst = carry
    rule = branching.online_fork_decision(entropy[slot], topo.entropy_threshold, b.forks,
                                          topo.max_forks())
    affordable = ((b.started + new <= topo.max_leaves)
                  & (env_steps + worst + new * (horizon - depth) <= topo.max_env_steps))
    fork = deciders[slot] & rule & affordable
    # The new branches take slots started..started+new−1; without a fork, an index past the
    # end, whose writes are dropped.
    target = jnp.where(fork, b.started + jnp.arange(new), slots)
    b = b._replace(live=b.live.at[target].set(True, mode="drop"),
                   state=b.state.at[target].set(b.state[slot], mode="drop"),
                   last=b.last.at[target].set(b.last[slot], mode="drop"),
                   can_fork=b.can_fork.at[target].set(topo.siblings_fork, mode="drop"),
                   started=b.started + jnp.where(fork, new, 0),
                   forks=b.forks + fork.astype(jnp.int32))
    return b, worst + jnp.where(fork, new * (horizon - depth), 0)

  worst = jnp.sum(b.live) * (horizon - depth)
  b, _ = jax.lax.fori_loop(0, slots, decide, (b, worst))
  return b


def grow(world: worlds.ChainWorld, topo: Topology, logits: jax.Array, task: jax.Array,
         choose: Callable[[int, jax.Array], jax.Array]) -> Grown:
  """One task's tree (or group) under the softmax table `logits` [S, A]; see module docstring."""
  h = world.horizon
  slots = topo.slots(h)
  capacity = slots * h
  b = _Branches(live=jnp.zeros((slots,), bool).at[0].set(True),
                state=jnp.broadcast_to(worlds.reset(task), (slots, 3)),
                last=jnp.full((slots,), -1, jnp.int32),
                can_fork=jnp.zeros((slots,), bool).at[0].set(True),
                started=jnp.int32(1), forks=jnp.int32(0))
  fields = {name: [] for name in ("parent", "reward", "terminal", "valid", "entropy",
                                  "state_id", "row", "action")}
  nodes = jnp.int32(0)
  for depth in range(h):
    rows = jax.vmap(worlds.policy_row)(b.state)
    entropy = _entropy(logits[rows])
    b = _decide_turn(topo, h, depth, b, entropy, nodes)
    rows = jax.vmap(worlds.policy_row)(b.state)
    entropy = _entropy(logits[rows])
    action = choose(depth, logits[rows])
    state, reward, terminal = jax.vmap(lambda s, a: worlds.step(world, s, a))(b.state, action)
    index = nodes + jnp.arange(slots, dtype=jnp.int32)
    for name, value in (("parent", b.last), ("reward", reward), ("terminal", terminal),
                        ("valid", b.live), ("entropy", entropy), ("row", rows),
                        ("action", action),
                        ("state_id", jax.vmap(lambda s: worlds.state_key(world, s))(b.state))):
      fields[name].append(value)
    b = b._replace(state=jnp.where(b.live[:, None], state, b.state),
                   last=jnp.where(b.live, index, b.last))
    nodes = nodes + jnp.sum(b.live)
  return _compact(fields, capacity, h)


def _compact(fields: dict, capacity: int, horizon: int) -> Grown:
  """Per-turn slot arrays [H, L] to a topologically ordered tree: each turn's live slots, in slot
  order, after the previous turn's (a turn's node indices were assigned that way)."""
  valid = jnp.stack(fields["valid"]).reshape(-1)
  order = jnp.argsort(~valid, stable=True)  # live (turn, slot) pairs first, in turn-slot order
  take = lambda name: jnp.stack(fields[name]).reshape(-1)[order]
  depth = jnp.repeat(jnp.arange(horizon, dtype=jnp.int32), capacity // horizon)[order]
  valid = valid[order]
  tree = RolloutTree(
      parent=jnp.where(valid, take("parent"), -1).astype(jnp.int32),
      reward=jnp.where(valid, take("reward"), 0.0),
      terminal=valid & take("terminal"),
      truncated=jnp.zeros((capacity,), bool),
      valid=valid,
      entropy=jnp.where(valid, take("entropy"), 0.0).astype(jnp.float32),
      state_id=jnp.where(valid, take("state_id"), -1).astype(jnp.int32),
      depth=jnp.where(valid, depth, 0))
  return Grown(tree, jnp.where(valid, take("row"), 0), jnp.where(valid, take("action"), 0))


def sampler(key: jax.Array) -> Callable[[int, jax.Array], jax.Array]:
  """`choose` that samples each slot's action: slot l at depth d uses fold_in(fold_in(key, d), l),
  so a branch's draws do not depend on how many other branches are live."""
  def choose(depth, logits):
    keys = jax.vmap(lambda l: jax.random.fold_in(jax.random.fold_in(key, depth), l))(
        jnp.arange(logits.shape[0]))
    return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)
  return choose
