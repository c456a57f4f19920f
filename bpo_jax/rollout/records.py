"""What a rollout returns: per-task `TaskRollout`s in a `RolloutBatch`, with their fork
`Decision`s, `Failure`s and `Compute` counters."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import branching
from bpo_jax import packing
from bpo_jax import tree as tree_lib

ROOT = tree_lib.ROOT
PHASES = ("reset", "prefill", "fork", "decode", "env", "append", "host")


@dataclasses.dataclass
class Compute:
  """What growing one tree (or a batch of trees) cost.

  Attributes:
    tokens_prefilled: prompt and observation tokens run through the policy (plus, with
      "top_k_after", the one token each after-the-fact sibling re-runs).
    tokens_decoded: action tokens the policy generated (each runs through it once).
    env_steps: sandbox steps taken (failed ones included).
    snapshots: sandbox snapshots taken.
    restores: sandbox restores (one per new branch at a fork).
    forks: fork decisions carried out.
    failed_branches: branches that ended in a failure (step, snapshot, restore or reset).
    tokens_probed: tokens decoded by the "greedy_action" entropy measure to score states (not
      part of any tree, so not in `tokens_processed`).
  """

  tokens_prefilled: int = 0
  tokens_decoded: int = 0
  env_steps: int = 0
  snapshots: int = 0
  restores: int = 0
  forks: int = 0
  failed_branches: int = 0
  tokens_probed: int = 0

  @property
  def tokens_processed(self) -> int:
    return self.tokens_prefilled + self.tokens_decoded

  def add(self, other: "Compute") -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

  def as_dict(self) -> dict[str, int]:
    out = dataclasses.asdict(self)
    out["tokens_processed"] = self.tokens_processed
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
  """A fork decision at a state (one per state a branch reached; logged for audits).

  `node` is the step that led to the state (-1: the root state); `entropy` the entropy there
  (`RolloutConfig.entropy_measure`); `eligible` whether the branch may fork at all; `rule` what
  the fork rule said; `affordable` whether the budgets allowed the new branches; `num_siblings`
  the branches that
  took an action at the state (1: no fork; fewer than asked if restores failed; 0 if the
  branch's snapshot failed). `forks_used`, `leaves_started`, `env_steps_used` and `tokens_used`
  are the tree's counters the decision saw; `snapshot_digest` identifies the forked state.
  """

  node: int
  depth: int
  entropy: float
  eligible: bool
  rule: bool
  affordable: bool
  num_siblings: int
  forks_used: int = 0
  leaves_started: int = 0
  env_steps_used: int = 0
  tokens_used: int = 0
  snapshot_digest: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Failure:
  """A failed branch: `node` is its failed step (-1: it failed before taking one, e.g. a failed
  restore), `parent` the step that led to its state, `op` the sandbox call that failed."""

  node: int
  parent: int
  op: str
  reason: str


@dataclasses.dataclass
class TaskRollout:
  """Everything grown for one task.

  Attributes:
    task: the task.
    tree: the `RolloutTree` (NumPy arrays padded to the capacity).
    tokens: the `packing.TreeTokens` (nodes as in `tree`; padding nodes left out).
    first_observation: what `reset` returned.
    action_texts, observation_texts: per node (for drawing a tree).
    node_success: bool per node, `info["success"]` of the step that ended an episode.
    decisions: every fork decision, in the order made.
    failures: every failed branch.
    compute: what the tree cost.
  """

  task: Any
  tree: tree_lib.RolloutTree
  tokens: packing.TreeTokens
  first_observation: str
  action_texts: list[str]
  observation_texts: list[str]
  node_success: np.ndarray
  decisions: list[Decision]
  failures: list[Failure]
  compute: Compute

  @property
  def num_nodes(self) -> int:
    return self.tokens.num_nodes

  def leaves(self) -> np.ndarray:
    """Indices of valid nodes without valid children (one per finished path)."""
    alive = self.tokens.alive()
    has_child = np.zeros(self.num_nodes, bool)
    for i in range(self.num_nodes):
      if alive[i] and self.tokens.parent[i] >= 0:
        has_child[self.tokens.parent[i]] = True
    return np.nonzero(alive & ~has_child)[0]

  def path(self, node: int) -> list[int]:
    """The nodes from the root state down to `node`."""
    out = []
    while node != ROOT:
      out.append(int(node))
      node = int(self.tokens.parent[node])
    return out[::-1]

  def leaf_returns(self) -> np.ndarray:
    """Undiscounted return of each leaf's path, in `leaves()` order."""
    reward = np.asarray(self.tree.reward)
    return np.asarray([reward[self.path(leaf)].sum() for leaf in self.leaves()], np.float32)

  def success_rate(self) -> float:
    """The fraction of leaves whose episode succeeded (0 for a tree without leaves)."""
    leaves = self.leaves()
    return float(np.mean(self.node_success[leaves])) if leaves.size else 0.0

  def path_tokens(self) -> int:
    """Tokens of all leaf paths counted separately: what rolling each leaf out on its own,
    replaying the shared prefixes, would run through the policy."""
    total = 0
    for leaf in self.leaves():
      total += self.tokens.prompt.size + sum(self.tokens.segment(i).size for i in self.path(leaf))
    return total


UPDATE_QUANTILE = jax.jit(branching.update_quantile_threshold,
                          static_argnames=("quantile", "decay"))
THRESHOLD_DECAY = 0.9  # the running threshold's weight on its past (`update_threshold`)


def threshold_size(decisions: int) -> int:
  """The length `decisions` state entropies are padded to (masked out) for the threshold's
  update: the power of two ≥ max(decisions, 16), one compiled program per size bucket rather
  than per number of decisions. Example: 5 → 16, 17 → 32, 64 → 64."""
  return 1 << max(decisions - 1, 15).bit_length()


def threshold_key(size: int, quantile: float, decay: float) -> tuple:
  """The threshold update's program in a run's start-up set (`precompiled.ProgramSet`): one per
  padded size, for the run's quantile and decay (static arguments of its program)."""
  return ("threshold", size, float(quantile), float(decay))


@dataclasses.dataclass
class RolloutBatch:
  """The rollouts of one `rollout` call, their total compute and the wall time per phase."""

  rollouts: list[TaskRollout]
  compute: Compute
  phase_seconds: dict[str, float]
  device_row_tokens: int  # rows x decode steps the device ran, padding included
  turns: int
  threshold: float        # the entropy threshold the rule used
  decode_devices: int = 1  # devices the rows were decoded on (the parameters' mesh)
  decode_steps: int = 0    # decode loop steps the device ran (one token per row each)

  @classmethod
  def concatenate(cls, batches: Sequence["RolloutBatch"],
                  side_by_side: bool = True) -> "RolloutBatch":
    """One batch of the parts' rollouts in order.

    Compute counters, device row-tokens and decode steps add up. Parts that ran side by side
    (each process's share of the tasks): the wall time of each phase and the turns are the
    largest part's, and the decode devices add up. Parts grown one after another on the same
    devices (`side_by_side=False`: an iteration's rounds, `iteration.grow_rounds`): times and
    turns add up, the devices are the first part's. The parts must share the threshold.
    """
    batches = list(batches)
    if not batches:
      raise ValueError("concatenate needs at least one batch")
    if len(batches) == 1:
      return batches[0]
    thresholds = {b.threshold for b in batches}
    if len(thresholds) != 1:
      raise ValueError(f"the batches used different fork thresholds: {sorted(thresholds)}")
    compute = Compute()
    for b in batches:
      compute.add(b.compute)
    combine = max if side_by_side else sum
    return cls(rollouts=[r for b in batches for r in b.rollouts], compute=compute,
               phase_seconds={k: combine(b.phase_seconds.get(k, 0.0) for b in batches)
                              for k in batches[0].phase_seconds},
               device_row_tokens=sum(b.device_row_tokens for b in batches),
               turns=combine(b.turns for b in batches), threshold=batches[0].threshold,
               decode_devices=(sum(b.decode_devices for b in batches) if side_by_side
                               else batches[0].decode_devices),
               decode_steps=sum(b.decode_steps for b in batches))

  def select(self, indices: Sequence[int]) -> "RolloutBatch":
    """The batch of the rollouts at `indices`, in that order, with this batch's compute and
    times: what was spent to draw them all."""
    return dataclasses.replace(self, rollouts=[self.rollouts[i] for i in indices])

  def stacked_trees(self) -> tree_lib.RolloutTree:
    return tree_lib.stack_trees([r.tree for r in self.rollouts])

  def tree_tokens(self) -> list[packing.TreeTokens]:
    return [r.tokens for r in self.rollouts]

  def state_entropies(self) -> np.ndarray:
    """float32[S]: the entropy of every state a fork decision was made at, once per
    state (the siblings of a fork share their state's entropy, so the nodes would repeat it)."""
    return np.asarray([d.entropy for r in self.rollouts for d in r.decisions], np.float32)

  def update_threshold(self, threshold: branching.QuantileThreshold, quantile: float,
                       decay: float = THRESHOLD_DECAY,
                       programs=None) -> branching.QuantileThreshold:
    """The running entropy threshold for the NEXT batch (`branching.update_quantile_threshold`
    over this batch's state entropies); pass its `.threshold` to the next `rollout` call. Run
    from `programs`' executable (`threshold_key`) where a start-up set holds one.

    Example:
      running = branching.init_quantile_threshold(1.0)
      batch = engine.rollout(params, tasks, key, threshold=float(running.threshold))
      running = batch.update_threshold(running, quantile=0.8)
    """
    entropy = self.state_entropies()
    if not entropy.size:
      return threshold
    # Padded (masked out) to a size bucket; the padding is NaN to the quantile, which skips it.
    size = threshold_size(entropy.size)
    padded = np.zeros((size,), np.float32)
    padded[:entropy.size] = entropy
    args = (threshold, jax.device_put(padded), jax.device_put(np.arange(size) < entropy.size))
    update = functools.partial(UPDATE_QUANTILE, quantile=float(quantile), decay=float(decay))
    if programs is None:
      return update(*args)
    return programs.run(threshold_key(size, quantile, decay), args, {}, update)

  def summary(self) -> dict[str, Any]:
    out = self.compute.as_dict()
    out["unique_tokens"] = sum(r.tokens.num_unique_tokens() for r in self.rollouts)
    out["leaves"] = int(sum(r.leaves().size for r in self.rollouts))
    out["success_rate"] = float(np.mean([r.success_rate() for r in self.rollouts]))
    out["turns"] = self.turns
    out["threshold"] = self.threshold
    out["device_row_tokens"] = self.device_row_tokens
    out["decode_steps"] = self.decode_steps
    out.update({f"seconds_{k}": v for k, v in self.phase_seconds.items()})
    return out


def matched_group_size(rollout: TaskRollout, by: str = "leaves") -> int:
  """How many independent rollouts cost what this tree cost.

  `by="leaves"`: one per leaf. `by="env_steps"`: the tree's steps over the mean leaf depth (an
  independent rollout is one root-to-leaf path). `by="tokens"`: the tokens the tree's policy
  processed over the mean tokens of one leaf path. Uses `branching.matched_group_size` (>= 2).
  """
  leaves = rollout.leaves()
  if not leaves.size:
    raise ValueError("matched_group_size: the tree has no valid leaves")
  if by == "leaves":
    return branching.matched_group_size(float(leaves.size))
  if by == "env_steps":
    mean_steps = float(np.mean([len(rollout.path(leaf)) for leaf in leaves]))
    return branching.matched_group_size(float(rollout.compute.env_steps), mean_steps)
  if by == "tokens":
    mean_tokens = rollout.path_tokens() / leaves.size
    return branching.matched_group_size(float(rollout.compute.tokens_processed), mean_tokens)
  raise ValueError(f"by must be 'leaves', 'env_steps' or 'tokens', got {by!r}")
