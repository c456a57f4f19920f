"""Display: one tree grown with a checkpoint, drawn as text with its advantages."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import rollout as rollout_lib
from bpo_jax.training import estimator_registry
from bpo_jax.training import loop
from bpo_jax.training import translate


def trunk_batch(config) -> tuple[int, int, str]:
  """`(tasks, trees per task, trunk)` to grow so that a drawn tree gets the trunk baseline
  training gives it (`rollout.trunk_baseline`): the tree alone ("zero", or an estimator without
  a trunk), `rollout.trees_per_task` trees of its task ("loo"), or an iteration's worth of
  trees ("batch")."""
  r = config.rollout
  trunk = r.trunk_baseline if estimator_registry.get(r.estimator).trunk_baseline else "zero"
  if trunk == "zero":
    return 1, 1, trunk
  return (r.tasks_per_iteration if trunk == "batch" else 1), r.trees_per_task, trunk


def sample_tree(config, workdir: str, task_index: int = 0, seed: int = 0):
  """Grows one tree (or group) with the latest checkpoint of `workdir` on training task
  `task_index`; returns `(TaskRollout, advantages)` for `render_tree`.

  The advantages are the ones training would give the tree: its estimator, and its trunk
  baseline from the other trees of its task or of a batch of the tasks that follow it, which
  are grown too (`trunk_batch`).
  """
  num_tasks, trees_per_task, trunk = trunk_batch(config)
  exp, state, _ = loop.load_checkpoint(config, workdir)
  n = len(exp.train_tasks)
  tasks = [exp.train_tasks[(task_index + j) % n] for j in range(num_tasks)
           for _ in range(trees_per_task)]
  try:
    engine = rollout_lib.RolloutEngine(exp.graphdef, exp.model_config, exp.fmt, exp.pool,
                                       translate.rollout_config(config))
    batch = engine.rollout(exp.full_params(state.params), tasks, jax.random.key(seed))
  finally:
    exp.close()
  advantages, _ = estimator_registry.advantages_and_weights(
      jax.tree.map(jnp.asarray, batch.stacked_trees()), estimator=config.rollout.estimator,
      gamma=float(config.rollout.gamma), trees_per_task=trees_per_task, trunk=trunk,
      options=estimator_registry.config_options(config))
  return batch.rollouts[0], np.asarray(advantages[0])


def render_tree(rollout: rollout_lib.TaskRollout, advantages: np.ndarray | None = None) -> str:
  """A text drawing of one task's rollout tree: each step's action, reward and outcome.

  Example line: `├─ take apple  r=0  A=+0.50` (A only when advantages are given); forks show as
  several children under one step.
  """
  tokens = rollout.tokens
  kids = tokens.children()
  lines = [f"[root] {rollout.first_observation[:90]}"]
  reward = np.asarray(rollout.tree.reward)

  def visit(node: int, prefix: str, last: bool):
    connector = "└─ " if last else "├─ "
    outcome = ""
    if rollout.node_success[node]:
      outcome = "  SUCCESS"
    elif bool(rollout.tree.truncated[node]):
      outcome = "  (cut)"
    elif bool(rollout.tree.terminal[node]):
      outcome = "  (end)"
    adv = "" if advantages is None else f"  A={advantages[node]:+.2f}"
    lines.append(f"{prefix}{connector}{rollout.action_texts[node] or '<empty>'}  "
                 f"r={reward[node]:g}{adv}{outcome}")
    children = kids[node]
    for j, child in enumerate(children):
      visit(child, prefix + ("   " if last else "│  "), j == len(children) - 1)

  roots = kids[tokens.num_nodes]
  for j, node in enumerate(roots):
    visit(node, "", j == len(roots) - 1)
  return "\n".join(lines)
