"""Fork policies: at each live branch's state, whether to fork there, behind one interface.

A policy answers `decide` once per live branch and turn, from what is known at the state only:
its entropy, the tree's counters and the budgets (a stopping-time rule, docs/DESIGN.md §3). The
other hooks serve a rule that decides after the fact (`top_k_after.TopKAfter`); here they log the
decision as it is and do nothing else.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from bpo_jax import branching
from bpo_jax.rollout.branches import Branch
from bpo_jax.rollout.budget import TurnBudget
from bpo_jax.rollout.config import RolloutConfig
from bpo_jax.rollout.records import ROOT, Decision
from bpo_jax.rollout.tree_state import TreeState


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A policy's answer at one branch's state.

  Attributes:
    entropy: the state's entropy (its nodes record it).
    eligible, rule, affordable: as in `Decision`.
    siblings: new branches to start at the state (0: no fork).
    counters: the tree's counters the decision saw (`TreeState.counters`); None if the state was
      decided before (nothing is logged for it now).
    keep_snapshot: snapshot the state although it does not fork now (a rule deciding later).
  """

  entropy: float
  eligible: bool = False
  rule: bool = False
  affordable: bool = False
  siblings: int = 0
  counters: dict[str, int] | None = None
  keep_snapshot: bool = False


class ForkPolicy:
  """The interface; `siblings_fork` says whether branches started at a fork may fork too."""

  siblings_fork = False

  def decide(self, branch: Branch, tree: TreeState, entropy: float,
             budget: TurnBudget) -> Verdict:
    raise NotImplementedError

  def record(self, tree: TreeState, branch: Branch, verdict: Verdict, decision: Decision,
             snapshot: Any) -> None:
    """Logs the decision taken at `branch`'s state (`snapshot`: the state, if taken)."""
    del branch, verdict, snapshot
    tree.decisions.append(decision)

  def branch_ended(self, tree: TreeState, branch: Branch) -> None:
    """`branch` ended in a failure."""

  def after_steps(self, ended: Sequence[Branch], trees: Sequence[TreeState]) -> list[Branch]:
    """Branches to start once `ended` (finished this turn, not failed) have ended."""
    del ended, trees
    return []

  def before_decode(self, params, decode_state, live: Sequence[Branch],
                    trees: Sequence[TreeState]):
    """The decode state to sample from, once the rows are in `live`'s order."""
    del params, live, trees
    return decode_state


class OnlineRule(ForkPolicy):
  """Forks K-1 new branches where `fires` says so, at a branch that may fork, within budget."""

  def __init__(self, config: RolloutConfig):
    self.siblings_fork = config.siblings_fork
    self._config = config
    self._max_forks = (config.max_forks if config.max_forks is not None
                       else np.iinfo(np.int32).max)

  def fires(self, entropy: float, tree: TreeState) -> bool:
    raise NotImplementedError

  def decide(self, branch, tree, entropy, budget):
    counters = tree.counters()
    eligible = branch.can_fork
    rule = eligible and self.fires(entropy, tree)
    new = self._config.siblings_at(branch.depth) - 1
    affordable = rule and budget.affordable(tree, branch, new)
    return Verdict(entropy=entropy, eligible=eligible, rule=rule, affordable=affordable,
                   siblings=new if affordable else 0, counters=counters)


class EntropyRule(OnlineRule):
  """Fires iff the state's entropy exceeds the threshold, forks permitting
  (`branching.online_fork_decision`)."""

  def __init__(self, config: RolloutConfig, threshold: float):
    super().__init__(config)
    self._threshold = threshold

  def fires(self, entropy, tree):
    return bool(branching.online_fork_decision(np.float32(entropy), np.float32(self._threshold),
                                               tree.compute.forks, self._max_forks))


class RandomRule(OnlineRule):
  """Fires with probability `fork_probability` (the tree's own generator), forks permitting."""

  def __init__(self, config: RolloutConfig):
    super().__init__(config)
    self._fork_probability = config.fork_probability

  def fires(self, entropy, tree):
    return (bool(tree.rule_rng.random() < self._fork_probability)
            and tree.compute.forks < self._max_forks)


class Never(OnlineRule):
  """Never fires: a single backbone per task."""

  def fires(self, entropy, tree):
    return False


class GroupAtRoot(ForkPolicy):
  """The baselines' topology: a fork of N at the root state and none after (N independent
  rollouts sharing only the prompt prefill; N = `RolloutConfig.episodes_per_group`, fixed
  before any episode starts)."""

  def __init__(self, config: RolloutConfig):
    self._num_new = config.episodes_per_group - 1

  def decide(self, branch, tree, entropy, budget):
    eligible = branch.node == ROOT and branch.can_fork
    return Verdict(entropy=entropy, eligible=eligible, rule=eligible, affordable=eligible,
                   siblings=self._num_new if eligible else 0, counters=tree.counters())
