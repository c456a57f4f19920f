"""One task's growing tree on the host: the `TreeBuilder` (structure, outcomes and validity),
the token and text records of its nodes, its fork decisions, failures and compute counters."""

from __future__ import annotations

from typing import Any

import numpy as np

from bpo_jax import packing
from bpo_jax import tree as tree_lib
from bpo_jax.rollout.records import ROOT, Compute, Decision, Failure, TaskRollout


class TreeState:
  """One task's tree while it grows; `result()` is the finished `TaskRollout`.

  Args:
    task: the task.
    capacity: nodes of the `RolloutTree`.
    rule_rng: the random fork rule's draws for this tree.
  """

  def __init__(self, task: Any, capacity: int, rule_rng: np.random.Generator | None = None):
    self.task = task
    self.rule_rng = rule_rng
    self.builder = tree_lib.TreeBuilder(capacity)
    self.action_tokens: list[np.ndarray] = []
    self.action_logprobs: list[np.ndarray] = []
    self.observation_tokens: list[np.ndarray] = []
    self.action_texts: list[str] = []
    self.observation_texts: list[str] = []
    self.success: list[bool] = []
    self.decisions: list[Decision] = []
    self.failures: list[Failure] = []
    self.compute = Compute()
    self.prompt: list[int] | None = None
    self.first_observation = ""
    self.branches_started = 0

  @property
  def num_nodes(self) -> int:
    return len(self.builder)

  def add_node(self, parent: int, entropy: float, state_id: int) -> int:
    """A node under `parent` with empty records, filled once its action is known."""
    node = self.builder.add(parent, entropy=entropy, state_id=state_id)
    self.action_tokens.append(np.zeros((0,), np.int32))
    self.action_logprobs.append(np.zeros((0,), np.float32))
    self.observation_tokens.append(np.zeros((0,), np.int32))
    self.action_texts.append("")
    self.observation_texts.append("")
    self.success.append(False)
    return node

  def fail_node(self, node: int) -> None:
    """Invalidates `node` with its subtree, then every ancestor left without a valid child (so
    an unfinished path never stands in for a finished one)."""
    builder = self.builder
    while True:
      builder.mark_failed(node)
      parent = builder.parent_of(node)
      if parent == ROOT or any(builder.is_valid(c) for c in builder.children_of(parent)):
        return
      node = parent

  def counters(self) -> dict[str, int]:
    """The counters a fork decision sees (`Decision.forks_used` ... `tokens_used`)."""
    return dict(forks_used=self.compute.forks, leaves_started=self.branches_started,
                env_steps_used=self.compute.env_steps,
                tokens_used=self.compute.tokens_processed)

  def cue_token(self, node: int) -> int:
    """The last token before an action at the state after `node` (-1: the root state)."""
    tokens = self.prompt if node == ROOT else self.observation_tokens[node]
    return int(tokens[-1])

  def result(self) -> TaskRollout:
    tree = self.builder.build()
    n = self.num_nodes
    tokens = packing.TreeTokens(
        prompt=np.asarray(self.prompt if self.prompt else [0], np.int32),
        parent=tree.parent[:n].copy(), action_tokens=self.action_tokens,
        action_logprobs=self.action_logprobs, observation_tokens=self.observation_tokens,
        valid=tree.valid[:n].copy())
    return TaskRollout(task=self.task, tree=tree, tokens=tokens,
                       first_observation=self.first_observation,
                       action_texts=self.action_texts, observation_texts=self.observation_texts,
                       node_success=np.asarray(self.success, bool), decisions=self.decisions,
                       failures=self.failures, compute=self.compute)
