"""Live branches, and new ones started from a sandbox snapshot (the sibling actions of a fork)."""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable, Sequence

import numpy as np

from bpo_jax.rollout.keys import BranchKeys
from bpo_jax.rollout.records import ROOT, Failure
from bpo_jax.rollout.tree_state import TreeState
from bpo_jax.sandboxes import pool as pool_lib


@dataclasses.dataclass
class Branch:
  """A live branch: a sandbox in the pool and a row of the decode state."""

  task: int
  branch_id: Hashable
  node: int             # the last step on this branch (-1: at the root state)
  depth: int            # steps taken so far
  length: int           # tokens in its cache row
  can_fork: bool
  state_id: int = -1
  row: int = -1
  key: np.ndarray | None = None  # raw words of the branch's PRNG key (`keys`)


@dataclasses.dataclass(frozen=True)
class Sibling:
  """A branch to start from `snapshot`, the `child`-th action tried at its state, keyed from
  `parent_key` (the forked branch's key); `branch` is its record without a key."""

  branch: Branch
  snapshot: Any
  parent_key: np.ndarray
  child: int


def start_siblings(pool: pool_lib.SandboxPool, keys: BranchKeys, trees: Sequence[TreeState],
                   siblings: Sequence[Sibling]) -> list[Branch | None]:
  """Restores each sibling's snapshot into its new branch (one pool call) and keys it
  `child_key(parent_key, depth, child)`.

  Returns, per sibling in order, its branch or None if the restore failed: then the failure is
  recorded against the step whose state it was to start from, and its branch is closed.
  """
  restored = pool.restore_many({s.branch.branch_id: s.snapshot for s in siblings})
  key_data = keys.child_key_data([s.parent_key for s in siblings],
                                 [s.branch.depth for s in siblings],
                                 [s.child for s in siblings])
  out = []
  for n, sibling in enumerate(siblings):
    branch, tree = sibling.branch, trees[sibling.branch.task]
    result = restored[branch.branch_id]
    tree.compute.restores += 1
    if isinstance(result, pool_lib.BranchFailure):
      tree.failures.append(Failure(node=ROOT, parent=branch.node, op="restore",
                                   reason=result.reason))
      tree.compute.failed_branches += 1
      pool.close(branch.branch_id)
      out.append(None)
      continue
    branch.key = key_data[n]
    out.append(branch)
  return out
