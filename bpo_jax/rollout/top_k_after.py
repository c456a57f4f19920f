"""The after-the-fact top-k fork rule (`fork_rule="top_k_after"`), kept to measure its bias.

The backbone runs to the end, its states snapshotted, then forks at its `max_forks`
highest-entropy states (`branching.top_k_fork_steps`). The new siblings restore a state's
snapshot and start from a copy of the backbone's cache row cut back to that state (one token
re-run to recover the logits there): the prefix is not replayed. Where the forks go depends on
the backbone's own later actions, which biases the estimator (docs/DESIGN.md §3).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Hashable, Sequence

import jax.numpy as jnp
import numpy as np

from bpo_jax import branching
from bpo_jax import sampling
from bpo_jax.rollout.branches import Branch, Sibling, start_siblings
from bpo_jax.rollout.config import RolloutConfig
from bpo_jax.rollout.keys import BranchKeys
from bpo_jax.rollout.policies import ForkPolicy, Verdict
from bpo_jax.rollout.records import Decision
from bpo_jax.rollout.state_ids import _digest
from bpo_jax.rollout.tree_state import TreeState
from bpo_jax.sandboxes import pool as pool_lib


@dataclasses.dataclass(frozen=True)
class _PastState:
  """A backbone state kept for forking after the fact."""

  decision: Decision   # as it would be logged without a fork
  snapshot: Any        # the sandbox at the state
  state_id: int
  cue_token: int       # the last token before the action there
  length: int          # the row's length at the state


class TopKAfter(ForkPolicy):
  """Snapshots every backbone state; forks a finished backbone at its top-k entropy states.

  Args:
    config: the rollout's config (`max_forks` of them per tree, K siblings each).
    pool, keys, sampler: the call's sandbox pool, key derivation and sampler.
    new_branch_id: task index -> a fresh branch id.
  """

  def __init__(self, config: RolloutConfig, pool: pool_lib.SandboxPool, keys: BranchKeys,
               sampler: sampling.Sampler, new_branch_id: Callable[[int], Hashable]):
    self._config = config
    self._pool = pool
    self._keys = keys
    self._sampler = sampler
    self._new_branch_id = new_branch_id
    self._history: dict[Hashable, list[_PastState]] = {}  # backbone -> its states so far
    self._decided: dict[Hashable, float] = {}  # new branch -> the entropy of its decided state
    self._rewinds: dict[Hashable, int] = {}    # new branch -> the cue token to re-run

  def decide(self, branch, tree, entropy, budget):
    if branch.branch_id in self._decided:  # started after the fact: its state is decided
      return Verdict(entropy=self._decided.pop(branch.branch_id))
    if branch.can_fork:  # the backbone: decided once it finishes
      return Verdict(entropy=entropy, eligible=True, counters=tree.counters(),
                     keep_snapshot=True)
    return Verdict(entropy=entropy, counters=tree.counters())

  def record(self, tree, branch, verdict, decision, snapshot):
    if not verdict.keep_snapshot:
      tree.decisions.append(decision)
      return
    self._history.setdefault(branch.branch_id, []).append(_PastState(
        decision, snapshot, branch.state_id, tree.cue_token(branch.node), branch.length))

  def branch_ended(self, tree, branch):
    # A failed backbone leaves no valid state to fork after the fact.
    tree.decisions.extend(past.decision for past in self._history.pop(branch.branch_id, []))

  def after_steps(self, ended, trees):
    """Forks each finished backbone at its highest-entropy states; logs its decisions."""
    backbones = [b for b in ended if self._history.get(b.branch_id)]
    if not backbones:
      return []
    picks = {b.branch_id: self._picks(self._history[b.branch_id]) for b in backbones}
    siblings, at = [], []
    for backbone in backbones:
      tree = trees[backbone.task]
      for index in picks[backbone.branch_id]:
        past = self._history[backbone.branch_id][index]
        tree.compute.forks += 1
        tree.branches_started += self._config.k - 1
        for child in range(1, self._config.k):
          branch = Branch(task=backbone.task, branch_id=self._new_branch_id(backbone.task),
                          node=past.decision.node, depth=past.decision.depth,
                          length=past.length, can_fork=False, state_id=past.state_id,
                          row=backbone.row)
          siblings.append(Sibling(branch, past.snapshot, backbone.key, child))
          at.append((backbone.branch_id, index))
    started = collections.Counter()
    out = []
    for sibling, place, branch in zip(siblings, at,
                                      start_siblings(self._pool, self._keys, trees, siblings)):
      if branch is not None:
        started[place] += 1
        past = self._history[place[0]][place[1]]
        self._decided[branch.branch_id] = past.decision.entropy
        self._rewinds[branch.branch_id] = past.cue_token
        out.append(branch)
    for backbone in backbones:
      self._log(trees[backbone.task], backbone, set(picks[backbone.branch_id]), started)
    return out

  def before_decode(self, params, decode_state, live, trees):
    """Cuts the rows of branches started after the fact back to their state.

    Such a row is a copy of the finished backbone's row, whose first `length` slots hold the
    path to the state. Its length is set to `length - 1` and the state's last token (the action
    cue) is appended again, which recomputes the next-token logits there; later appends
    overwrite the stale slots, which no query attends before then.
    """
    rewinds = {b.row: b for b in live if b.branch_id in self._rewinds}
    if not rewinds:
      return decode_state
    decode_state = self._sampler.truncate(
        decode_state, {row: branch.length - 1 for row, branch in rewinds.items()})
    decode_state = self._sampler.append(
        params, decode_state, {row: [self._rewinds[b.branch_id]] for row, b in rewinds.items()})
    for branch in rewinds.values():
      trees[branch.task].compute.tokens_prefilled += 1
      del self._rewinds[branch.branch_id]
    return decode_state

  def _picks(self, history: Sequence[_PastState]) -> list[int]:
    """Indices into `history` of the states to fork, in order."""
    k = min(self._config.max_forks, len(history))
    if not k:
      return []
    entropy = jnp.asarray([past.decision.entropy for past in history], jnp.float32)
    picked = branching.top_k_fork_steps(entropy, jnp.ones(len(history), bool), k)
    return sorted(int(i) for i in np.asarray(picked) if i >= 0)

  def _log(self, tree: TreeState, backbone: Branch, forked: set[int],
           started: collections.Counter) -> None:
    """Logs a finished backbone's decisions, those it forked at with their siblings."""
    for index, past in enumerate(self._history.pop(backbone.branch_id)):
      decision = past.decision
      if index in forked:
        decision = dataclasses.replace(
            decision, rule=True, affordable=True,
            num_siblings=1 + started[(backbone.branch_id, index)],
            snapshot_digest=_digest(past.snapshot.data))
      tree.decisions.append(decision)
