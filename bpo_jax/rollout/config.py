"""How trees are grown: `RolloutConfig`, its invariants checked on construction."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from bpo_jax import sampling

TOPOLOGIES = ("tree", "group")
FORK_RULES = ("entropy", "random", "never", "top_k_after")
BUDGET_ACCOUNTING = ("worst_case", "used")
STATE_IDS = ("none", "observation", "snapshot")
ENTROPY_MEASURES = ("first_token", "greedy_action")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """How trees are grown.

  Attributes:
    topology: "tree" (BPO: forks decided online along the way) or "group" (N independent
      rollouts per task: a fork of N at the root state and none after, `episodes_per_group`).
    k: K, the actions tried at a fork (the branch itself plus K-1 new ones).
    root_k: K at the tree's root state (the backbone's first decision, where a group forks
      too); 0: `k`. The number is fixed by the state's depth, known before any action there is
      sampled, so the online rules stay unbiased (`siblings_at`).
    group_size: N for the group topology: > 0 a fixed N (the env-step budget is not read);
      0 as many whole episodes as fit in `max_env_steps` at the worst case, N =
      max_env_steps // max_turns (`episodes_per_group`), at least 2.
    fork_rule: "entropy" (fork when the state's entropy, see `entropy_measure`, exceeds the
      threshold), "random" (fork with probability `fork_probability`), "never" (a single backbone),
      or "top_k_after": once the backbone has finished, fork at its `max_forks`
      highest-entropy states (`rollout.top_k_after`). The last is BIASED (where the forks go
      depends on the backbone's own later actions) and is kept only to measure that bias
      against the online rule; it snapshots every backbone state and supports only the leaf
      budget. The group topology ignores the rule.
    entropy_measure: what "the entropy at a state" is, in nats, for the fork rule and the trees:
      "first_token", the entropy of the policy's first-token distribution there (free: the
      logits are known once the observation is prefilled); or "greedy_action", the sum of the
      token entropies along the greedy action from the state (one extra greedy decode of every
      live row per turn, counted in `Compute.tokens_probed`). Both are functions of the state
      alone, so the online rule stays unbiased. The second sees decisions that come after the
      first token of an action ("put apple in *basket*"), which the first misses.
    entropy_threshold: the threshold of the entropy rule, in nats (`rollout(threshold=...)`
      overrides it per call, e.g. with a running quantile from earlier batches).
    fork_probability: the probability of the random rule (drawn from a NumPy generator per tree,
      seeded with the task key's words).
    siblings_fork: whether branches started at a fork may fork too (else only the backbone).
    max_leaves: most leaves per tree (every started branch ends in one leaf); None: no limit.
    max_env_steps: most sandbox steps per tree (or group, with `group_size` 0); None: no
      limit.
    max_tree_tokens: most tokens the policy processes per tree (prefill + decode); None: no
      limit.
    budget_accounting: "worst_case" (hard limits) or "used" (see `rollout.budget`).
    max_turns: most actions per branch; a branch reaching it is cut (truncated).
    max_action_tokens: most tokens per action.
    temperature, top_p, top_k: sampling (see `sampling.SamplingParams`).
    max_length: KV-cache slots per row: the longest path (prompt, actions, observations).
    kv_page_size: 0 for the dense KV cache (`max_length` slots per row); n > 0 for a paged
      cache of n-slot pages (`models.paged`): a fork shares its source's pages and copies at
      most the last one, and a tree's cache holds a shared prefix once. The same trees either
      way, up to the rounding of attention's sums.
    kv_pool_pages: (a paged cache) the pages per layer of every paged state the engine makes,
      fixed so that its programs keep their shapes (`training.translate.kv_pool_pages`: room
      for the most rows a run decodes at once); 0: a batch's dense size, grown on demand.
    batch_buckets: batch sizes the device sees (rows padded up; beyond the largest, multiples
      of it), so `generate` and `append` compile a bounded number of times.
    capacity: nodes per `RolloutTree`; default `max_leaves * max_turns` (tree) or
      `episodes_per_group * max_turns` (group). Forks that could overflow it are refused.
    state_ids: how `RolloutTree.state_id` is filled: "none" (-1), "observation" (a hash of the
      observation text at the state) or "snapshot" (a hash of the sandbox snapshot, an exact
      state key; costs one snapshot per step).
  """

  topology: str = "tree"
  k: int = 2
  root_k: int = 0
  group_size: int = 2
  fork_rule: str = "entropy"
  entropy_measure: str = "first_token"
  entropy_threshold: float = 0.5
  fork_probability: float = 0.3
  siblings_fork: bool = False
  max_leaves: int | None = 4
  max_env_steps: int | None = 64
  max_tree_tokens: int | None = 1024
  budget_accounting: str = "worst_case"
  max_turns: int = 5
  max_action_tokens: int = 5
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_length: int = 320
  kv_page_size: int = 0
  kv_pool_pages: int = 0
  batch_buckets: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
  capacity: int | None = None
  state_ids: str = "none"

  def __post_init__(self):
    # Invariants the engine relies on; a run's settings are checked, with messages naming
    # their keys, by the schema (`training/config.py`) before they get here.
    for name, options in (("topology", TOPOLOGIES), ("fork_rule", FORK_RULES),
                          ("entropy_measure", ENTROPY_MEASURES),
                          ("budget_accounting", BUDGET_ACCOUNTING), ("state_ids", STATE_IDS)):
      if getattr(self, name) not in options:
        raise ValueError(f"RolloutConfig.{name} must be one of {options}, got "
                         f"{getattr(self, name)!r}")
    for name in ("k", "max_turns", "max_action_tokens", "max_length"):
      if getattr(self, name) < 1:
        raise ValueError(f"RolloutConfig.{name} must be positive, got {getattr(self, name)}")
    for name in ("max_leaves", "max_env_steps", "max_tree_tokens", "capacity"):
      value = getattr(self, name)
      if value is not None and value < 1:
        raise ValueError(f"RolloutConfig.{name} must be positive or None, got {value}")
    if self.kv_pool_pages < 0:
      raise ValueError(f"RolloutConfig.kv_pool_pages must be >= 0, got {self.kv_pool_pages}")
    if self.kv_page_size < 0:
      raise ValueError(f"RolloutConfig.kv_page_size must be >= 0 (0: the dense cache), got "
                       f"{self.kv_page_size}")
    if self.group_size < 0:
      raise ValueError(f"RolloutConfig.group_size must be >= 0 (0: as many episodes as fit "
                       f"max_env_steps), got {self.group_size}")
    if not 0.0 <= self.fork_probability <= 1.0:
      raise ValueError(f"RolloutConfig.fork_probability must be in [0, 1], got "
                       f"{self.fork_probability}")
    buckets = tuple(int(b) for b in self.batch_buckets)
    if not buckets or min(buckets) < 1 or list(buckets) != sorted(set(buckets)):
      raise ValueError(f"RolloutConfig.batch_buckets must be increasing positive sizes, got "
                       f"{self.batch_buckets}")
    object.__setattr__(self, "batch_buckets", buckets)
    self._check_forks()
    self._check_capacity()
    self.sampling_params()  # validates temperature, top_p, top_k

  def _check_forks(self):
    """K and the fork rule's own limits."""
    if self.topology == "tree" and self.fork_rule != "never" and self.k < 2:
      raise ValueError(f"RolloutConfig.k must be >= 2 to fork, got {self.k}")
    if self.root_k:
      if self.root_k < 2:
        raise ValueError(f"RolloutConfig.root_k must be >= 2 or 0, got {self.root_k}")
      if self.topology != "tree" or self.fork_rule == "top_k_after":
        raise ValueError("RolloutConfig.root_k: only a tree grown by an online fork rule "
                         f"has a root fork of its own (topology {self.topology!r}, fork_rule "
                         f"{self.fork_rule!r})")
    if self.topology == "tree" and self.fork_rule == "top_k_after":
      if (self.max_leaves is None or self.max_env_steps is not None
          or self.max_tree_tokens is not None):
        raise ValueError("RolloutConfig: fork_rule 'top_k_after' takes its forks from "
                         "max_leaves and supports no env-step or token budget")
      if self.siblings_fork:
        raise ValueError("RolloutConfig: fork_rule 'top_k_after' forks the backbone only "
                         "(siblings_fork must be False)")

  def _check_capacity(self):
    """The nodes of a tree or group fit its `RolloutTree`."""
    if self.topology == "tree" and self.capacity is None and self.max_leaves is None:
      raise ValueError("RolloutConfig: a tree needs max_leaves or an explicit capacity")
    if self.topology == "group" and self.group_size == 0:
      if self.max_env_steps is None or self.max_env_steps // self.max_turns < 2:
        raise ValueError(f"RolloutConfig: group_size=0 needs max_env_steps to hold two whole "
                         f"episodes of max_turns={self.max_turns} steps, got "
                         f"max_env_steps={self.max_env_steps}")
    if self.node_capacity < self.max_turns:
      raise ValueError(f"RolloutConfig.capacity {self.node_capacity} cannot hold one branch of "
                       f"max_turns={self.max_turns} steps")
    if self.topology == "group" and (self.node_capacity
                                     < self.episodes_per_group * self.max_turns):
      raise ValueError(f"RolloutConfig.capacity {self.node_capacity} cannot hold "
                       f"group_size={self.episodes_per_group} rollouts of "
                       f"max_turns={self.max_turns}")

  @property
  def episodes_per_group(self) -> int:
    """N, the independent episodes of a group: `group_size`, or with `group_size` 0 as many
    whole episodes as fit in `max_env_steps` at the worst case (`max_turns` steps each).

    The rule fixes N before any episode starts, from the budget and the turn limit alone: N
    does not depend on the group's own episodes, so a group is N i.i.d. episodes and the
    group baselines stay what they are for a fixed N (RLOO's leave-one-out mean unbiased).
    Starting more episodes as early ones finish would fill the budget better, but N would then
    depend on the episodes' lengths, which go with their returns (an episode that succeeds ends
    early): with a third episode started only if the first two end early, their weight 1/N in
    the group average would be 1/3 when they are short and 1/2 when they are long, a
    reweighting of episodes by their own outcome, which biases the estimate (and their
    leave-one-out baseline would hold an episode whose existence depends on them). No episode is cut by the budget:
    each has at most `max_turns` steps and N of them fit.

    Example: max_env_steps=12, max_turns=5 → N = 2 (10 steps at most; 2 are never used).
    """
    if self.group_size > 0:
      return self.group_size
    return self.max_env_steps // self.max_turns

  @property
  def node_capacity(self) -> int:
    if self.capacity is not None:
      return self.capacity
    if self.topology == "group":
      return self.episodes_per_group * self.max_turns
    return self.max_leaves * self.max_turns

  def siblings_at(self, depth: int) -> int:
    """K at a state `depth` steps into its branch: `root_k` at the root (depth 0, only the
    backbone decides there) when set, else `k`."""
    if depth == 0 and self.root_k:
      return self.root_k
    return self.k

  @property
  def max_forks(self) -> int | None:
    """Forks a tree may make within `max_leaves` (each adds K-1 leaves)."""
    if self.topology == "group" or self.max_leaves is None:
      return None
    return (self.max_leaves - 1) // (self.k - 1) if self.k > 1 else 0

  def sampling_params(self, stop_token_ids: Sequence[int] = ()) -> sampling.SamplingParams:
    return sampling.SamplingParams(temperature=self.temperature, top_p=self.top_p,
                                   top_k=self.top_k, max_new_tokens=self.max_action_tokens,
                                   stop_token_ids=tuple(stop_token_ids))

  def batch_size(self, rows: int) -> int:
    """The padded batch size for `rows` live rows."""
    for bucket in self.batch_buckets:
      if bucket >= rows:
        return bucket
    largest = self.batch_buckets[-1]
    return -(-rows // largest) * largest

