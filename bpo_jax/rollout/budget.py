"""What a tree's budgets allow at one turn's fork decisions (`RolloutConfig.budget_accounting`).

With "worst_case" every live branch is charged its most possible remaining cost (`max_turns -
depth` steps, `max_length - row length` tokens), so the budgets are hard limits; with "used" only
what was spent so far counts. Either way a decision depends only on cost already committed,
never on actions sampled at or below its state (docs/DESIGN.md §3).
"""

from __future__ import annotations

import collections
from typing import Sequence

from bpo_jax.rollout.branches import Branch
from bpo_jax.rollout.config import RolloutConfig
from bpo_jax.rollout.tree_state import TreeState


class TurnBudget:
  """The budgets during one turn's decisions: live branches' worst-case remaining cost per tree,
  plus that of the branches this turn's earlier forks added (`charge`).

  Args:
    config: the rollout's config.
    live: the live branches before the turn's forks.
  """

  def __init__(self, config: RolloutConfig, live: Sequence[Branch]):
    self._config = config
    self._steps: dict[int, int] = collections.defaultdict(int)
    self._tokens: dict[int, int] = collections.defaultdict(int)
    for branch in live:
      self._steps[branch.task] += config.max_turns - branch.depth
      self._tokens[branch.task] += config.max_length - branch.length

  def affordable(self, tree: TreeState, branch: Branch, extra: int) -> bool:
    """Whether `tree`'s budgets allow `extra` (K-1) more branches from `branch`'s state."""
    cfg = self._config
    if cfg.max_leaves is not None and tree.branches_started + extra > cfg.max_leaves:
      return False
    worst_steps = self._steps[branch.task]
    worst_tokens = self._tokens[branch.task]
    new_steps = extra * (cfg.max_turns - branch.depth)
    new_tokens = extra * (cfg.max_length - branch.length)
    # Every step is a node, so the node capacity is an env-step limit that always holds.
    if tree.num_nodes + worst_steps + new_steps > cfg.node_capacity:
      return False
    if cfg.budget_accounting == "worst_case":
      steps_needed = tree.compute.env_steps + worst_steps + new_steps
      tokens_needed = tree.compute.tokens_processed + worst_tokens + new_tokens
    else:
      steps_needed = tree.compute.env_steps + extra
      tokens_needed = tree.compute.tokens_processed + extra
    if cfg.max_env_steps is not None and steps_needed > cfg.max_env_steps:
      return False
    if cfg.max_tree_tokens is not None and tokens_needed > cfg.max_tree_tokens:
      return False
    return True

  def charge(self, tree: TreeState, branch: Branch, siblings: int) -> None:
    """Counts a fork of `siblings` new branches at `branch`'s state now, so that later
    decisions of this turn see it."""
    cfg = self._config
    tree.compute.forks += 1
    tree.branches_started += siblings
    self._steps[branch.task] += siblings * (cfg.max_turns - branch.depth)
    self._tokens[branch.task] += siblings * (cfg.max_length - branch.length)
