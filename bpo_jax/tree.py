"""RolloutTree: one task's tree of agent steps as flat, padded arrays.

A node is one agent step: the action taken at a state. `parent[i]` is the step before it on the
same path, -1 for the steps taken at the task's initial (root) state. Nodes are stored in
topological order (`parent[i] < i`), so a single forward pass visits parents before children and
a single reverse pass visits children before parents. Capacity is fixed (padding nodes have
`valid=False`), so trees of one capacity stack into a batch and every jitted function compiles
once.

Example (a backbone of two steps with a fork of two actions at the second state)::

  builder = TreeBuilder(capacity=8)
  a = builder.add(-1, entropy=0.1)          # backbone step 1, at the root state
  b = builder.add(a, entropy=1.2)           # backbone step 2
  c = builder.add(a, entropy=1.2)           # the fork: an alternative action at b's state
  builder.set_outcome(a, reward=0.0)
  builder.set_outcome(b, reward=1.0, terminal=True)
  builder.set_outcome(c, reward=0.0, terminal=True)
  tree = builder.build()                    # arrays of length 8; nodes 3..7 are padding
  validate(tree)

The pure functions take a `RolloutTree` of jnp arrays (one tree) and are vmapped over a stacked
batch (`stack_trees`). Host code (`TreeBuilder`, `validate`) works on NumPy arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

ROOT = -1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RolloutTree:
  """A tree of agent steps as flat arrays of length N (the capacity).

  Attributes:
    parent: int32[N], index of the previous step on the path; -1 for steps at the root state.
      Topological order: `parent[i] < i` for every valid node.
    reward: float32[N], the reward the step's action received.
    terminal: bool[N], the episode ended after this step (a terminal node has no children).
    truncated: bool[N], the episode was cut (time or token limit) after this step. Its value is
      its reward: there is no bootstrap from a learned value.
    valid: bool[N], False for padding and for failed branches (a node and its whole subtree).
      Invalid nodes affect nothing: counts, baselines and weights use valid nodes only.
    entropy: float32[N], the policy's entropy at the state where the action was chosen.
    state_id: int32[N], a hash of that state (-1 when unknown); GiGPO groups steps by it.
    depth: int32[N], the number of steps before this one on its path (0 at the root state).
  """

  parent: np.ndarray
  reward: np.ndarray
  terminal: np.ndarray
  truncated: np.ndarray
  valid: np.ndarray
  entropy: np.ndarray
  state_id: np.ndarray
  depth: np.ndarray

  @property
  def capacity(self) -> int:
    return self.parent.shape[-1]

  def num_valid(self) -> np.ndarray:
    return np.asarray(self.valid).sum(axis=-1)


def empty_tree(capacity: int) -> RolloutTree:
  """A tree of `capacity` padding nodes (NumPy arrays)."""
  return RolloutTree(
      parent=np.full((capacity,), ROOT, np.int32),
      reward=np.zeros((capacity,), np.float32),
      terminal=np.zeros((capacity,), bool),
      truncated=np.zeros((capacity,), bool),
      valid=np.zeros((capacity,), bool),
      entropy=np.zeros((capacity,), np.float32),
      state_id=np.full((capacity,), -1, np.int32),
      depth=np.zeros((capacity,), np.int32),
  )


class TreeBuilder:
  """Host-side builder: the rollout adds a node when it chooses an action, then records the
  outcome once the sandbox step returns.

  Nodes get consecutive indices in the order they are added, so the topological order holds as
  long as a parent is added before its children (which a rollout cannot avoid).
  """

  def __init__(self, capacity: int):
    if capacity <= 0:
      raise ValueError(f"TreeBuilder capacity must be positive, got {capacity}")
    self.capacity = capacity
    self._parent: list[int] = []
    self._reward: list[float] = []
    self._terminal: list[bool] = []
    self._truncated: list[bool] = []
    self._valid: list[bool] = []
    self._entropy: list[float] = []
    self._state_id: list[int] = []
    self._depth: list[int] = []

  def __len__(self) -> int:
    return len(self._parent)

  def add(self, parent: int, *, entropy: float = 0.0, state_id: int = -1) -> int:
    """Adds a step under `parent` (-1: at the root state) and returns its index."""
    n = len(self._parent)
    if n >= self.capacity:
      raise ValueError(f"capacity exceeded: cannot add node {n} to a tree of capacity "
                       f"{self.capacity}")
    if not ROOT <= parent < n:
      raise ValueError(f"node {n}: parent {parent} is not -1 or an existing node (0..{n - 1})")
    if parent != ROOT and self._terminal[parent]:
      raise ValueError(f"node {n}: parent {parent} is terminal and cannot have children")
    self._parent.append(int(parent))
    self._reward.append(0.0)
    self._terminal.append(False)
    self._truncated.append(False)
    self._valid.append(parent == ROOT or self._valid[parent])
    self._entropy.append(float(entropy))
    self._state_id.append(int(state_id))
    self._depth.append(0 if parent == ROOT else self._depth[parent] + 1)
    return n

  def parent_of(self, node: int) -> int:
    """The step before `node` on its path (-1: `node` was taken at the root state)."""
    return self._parent[node]

  def children_of(self, node: int) -> list[int]:
    """The steps added under `node`, in the order added."""
    return [i for i in range(node + 1, len(self._parent)) if self._parent[i] == node]

  def is_valid(self, node: int) -> bool:
    return self._valid[node]

  def set_outcome(self, node: int, reward: float, *, terminal: bool = False,
                  truncated: bool = False) -> None:
    """Records what the sandbox step of `node` returned."""
    if not 0 <= node < len(self._parent):
      raise ValueError(f"set_outcome: node {node} does not exist (tree has {len(self)} nodes)")
    if terminal and any(p == node for p in self._parent):
      raise ValueError(f"set_outcome: node {node} has children and cannot be terminal")
    self._reward[node] = float(reward)
    self._terminal[node] = bool(terminal)
    self._truncated[node] = bool(truncated)

  def mark_failed(self, node: int) -> None:
    """Invalidates `node` and its whole subtree (a branch whose sandbox failed)."""
    if not 0 <= node < len(self._parent):
      raise ValueError(f"mark_failed: node {node} does not exist (tree has {len(self)} nodes)")
    failed = {node}
    self._valid[node] = False
    for i in range(node + 1, len(self._parent)):
      if self._parent[i] in failed:
        failed.add(i)
        self._valid[i] = False

  def build(self) -> RolloutTree:
    """The tree as NumPy arrays padded to the capacity."""
    tree = empty_tree(self.capacity)
    n = len(self._parent)
    tree.parent[:n] = self._parent
    tree.reward[:n] = self._reward
    tree.terminal[:n] = self._terminal
    tree.truncated[:n] = self._truncated
    tree.valid[:n] = self._valid
    tree.entropy[:n] = self._entropy
    tree.state_id[:n] = self._state_id
    tree.depth[:n] = self._depth
    return tree


def from_parents(parent: Sequence[int], reward: Sequence[float], *, capacity: int | None = None,
                 terminal: Sequence[bool] | None = None,
                 truncated: Sequence[bool] | None = None,
                 valid: Sequence[bool] | None = None,
                 entropy: Sequence[float] | None = None,
                 state_id: Sequence[int] | None = None) -> RolloutTree:
  """A tree from explicit lists (leaves default to terminal); handy in tests and examples.

  Depth is recomputed from `parent`; the result is validated.
  """
  n = len(parent)
  capacity = n if capacity is None else capacity
  if n > capacity:
    raise ValueError(f"capacity exceeded: {n} nodes given for capacity {capacity}")
  tree = empty_tree(capacity)
  tree.parent[:n] = parent
  tree.reward[:n] = reward
  has_child = np.zeros(n, bool)
  for p in parent:
    if 0 <= p < n:
      has_child[p] = True
  tree.terminal[:n] = ~has_child if terminal is None else terminal
  tree.truncated[:n] = False if truncated is None else truncated
  tree.valid[:n] = True if valid is None else valid
  tree.entropy[:n] = 0.0 if entropy is None else entropy
  tree.state_id[:n] = -1 if state_id is None else state_id
  if all(ROOT <= p < i for i, p in enumerate(parent)):
    for i, p in enumerate(parent):
      tree.depth[i] = 0 if p == ROOT else tree.depth[p] + 1
  validate(tree)
  return tree


def _find_cycle(parent: np.ndarray) -> list[int] | None:
  """A cycle of parent pointers, as a list of nodes, or None."""
  n = len(parent)
  for start in range(n):
    seen = []
    i = start
    while 0 <= i < n and i not in seen and len(seen) <= n:
      seen.append(i)
      i = int(parent[i])
    if 0 <= i < n and i in seen:
      return seen[seen.index(i):]
  return None


def validate(tree: RolloutTree) -> None:
  """Raises ValueError naming the first malformed node and its fault; returns None if well formed.

  Checks: equal 1-D shapes; parent in range; no cycle; parent before child (topological order);
  a valid node's parent is valid; a terminal node has no valid children; no NaN or infinite
  reward or entropy; depth consistent with the parents.
  """
  fields = {f.name: np.asarray(getattr(tree, f.name)) for f in dataclasses.fields(tree)}
  shapes = {k: v.shape for k, v in fields.items()}
  if len({s for s in shapes.values()}) != 1 or len(shapes["parent"]) != 1:
    raise ValueError(f"RolloutTree fields must be 1-D arrays of one length, got {shapes}")
  parent, valid = fields["parent"], fields["valid"].astype(bool)
  n = parent.shape[0]
  for i in range(n):
    if valid[i] and not ROOT <= parent[i] < n:
      raise ValueError(f"node {i}: parent {parent[i]} out of range [-1, {n})")
  cycle = _find_cycle(np.where(valid, parent, ROOT))
  if cycle is not None:
    raise ValueError(f"node {cycle[0]}: parent pointers form a cycle {cycle}")
  for i in range(n):
    if not valid[i]:
      continue
    p = int(parent[i])
    if p >= i:
      raise ValueError(f"node {i}: parent {p} comes after its child (nodes must be in "
                       f"topological order, parent < child)")
    if p != ROOT and not valid[p]:
      raise ValueError(f"node {i}: valid node under invalid parent {p}")
    if p != ROOT and fields["terminal"][p]:
      raise ValueError(f"node {i}: parent {p} is terminal and cannot have children")
    if not np.isfinite(fields["reward"][i]):
      raise ValueError(f"node {i}: reward is {fields['reward'][i]} (NaN or infinite)")
    if not np.isfinite(fields["entropy"][i]):
      raise ValueError(f"node {i}: entropy is {fields['entropy'][i]} (NaN or infinite)")
    expected_depth = 0 if p == ROOT else int(fields["depth"][p]) + 1
    if fields["depth"][i] != expected_depth:
      raise ValueError(f"node {i}: depth {fields['depth'][i]} but its parent {p} implies "
                       f"{expected_depth}")


def stack_trees(trees: Sequence[RolloutTree]) -> RolloutTree:
  """Stacks trees of one capacity along a new leading batch axis (NumPy)."""
  if not trees:
    raise ValueError("stack_trees needs at least one tree")
  capacities = {t.capacity for t in trees}
  if len(capacities) != 1:
    raise ValueError(f"stack_trees needs trees of one capacity, got capacities "
                     f"{sorted(capacities)}; pad them with TreeBuilder(capacity) first")
  return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def pad_tree(tree: RolloutTree, capacity: int) -> RolloutTree:
  """The same tree with more padding nodes at the end."""
  n = tree.capacity
  if capacity < n:
    raise ValueError(f"capacity exceeded: cannot pad a tree of capacity {n} to {capacity}")
  out = empty_tree(capacity)
  for f in dataclasses.fields(tree):
    getattr(out, f.name)[:n] = np.asarray(getattr(tree, f.name))
  return out
