"""Display: a tree training grows with a checkpoint, drawn as text with its advantages.

`draw_tree` grows what training's next iteration would grow from a checkpoint (its tasks, its
key, the fork threshold the checkpoint stored, the configured budgets), computes the advantages
training would give it (the estimator over the whole batch, trunk baseline included) and picks a
tree with a fork whose siblings' returns differ, where the advantages are not all zero.
"""

from __future__ import annotations

import dataclasses
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import estimators
from bpo_jax import rollout as rollout_lib
from bpo_jax.training import estimator_registry
from bpo_jax.training import iteration as iteration_lib
from bpo_jax.training import loop
from bpo_jax.training import translate

ROOT_WIDTH = 96  # characters per line of the root observation


@dataclasses.dataclass
class DrawnTree:
  """One tree of a batch grown as training grows it, with training's advantages.

  Attributes:
    rollout: the tree (`TaskRollout`).
    advantages: float[N], the estimator's per-node advantages of this tree in its batch.
    threshold: the entropy threshold the batch forked at (the checkpoint's).
    iteration: the training iteration whose tasks and key grew the batch (checkpoint + 1).
    draw: 0 for training's own key of that iteration, d > 0 for `fold_in(key, d)`.
    tree_index: the tree's position in the batch.
    differing_forks: the forks whose siblings' values differ (`differing_forks`).
  """

  rollout: rollout_lib.TaskRollout
  advantages: np.ndarray
  threshold: float
  iteration: int
  draw: int
  tree_index: int
  differing_forks: list[int]


def differing_forks(rollout: rollout_lib.TaskRollout, gamma: float = 1.0) -> list[int]:
  """The forks (nodes with two or more valid children; N for the root state) whose children's
  values Q̂ (`estimators.node_values`: r + γ · the mean of the children's) are not all equal:
  where BPO's leave-one-out sibling baseline gives the branches non-zero advantages. Example:
  a root fork into a branch that succeeds (Q̂ = 1) and one that fails (Q̂ = 0)."""
  values = np.asarray(estimators.node_values(jax.tree.map(jnp.asarray, rollout.tree), gamma))
  out = []
  for node, children in enumerate(rollout.tokens.children()):
    if len(children) > 1 and np.ptp(values[children]) > 0:
      out.append(node)
  return out


def training_credit(settings, batch: rollout_lib.RolloutBatch) -> tuple[np.ndarray, np.ndarray]:
  """(advantages, weights), each float[T, N]: what training gives `batch`'s nodes (as
  `iteration.estimate_and_pack`); the update ascends Σ w A ∇log π of each node's action."""
  r = settings.rollout
  advantages, weights = estimator_registry.advantages_and_weights(
      jax.tree.map(jnp.asarray, batch.stacked_trees()), estimator=r.estimator,
      gamma=float(r.gamma), trees_per_task=r.trees_per_task, trunk=r.trunk_baseline,
      options=estimator_registry.config_options(settings.rollout))
  return np.asarray(advantages), np.asarray(weights)


def draw_tree(settings, workdir: str, step: int | None = None, draws: int = 4) -> DrawnTree:
  """A tree of the batch training's iteration `step + 1` grows from checkpoint `step` (default:
  the latest) of `workdir`, with the threshold stored there; the first tree (in batch order)
  with a `differing_forks` entry, trying training's own key and then `draws - 1` others; if no
  draw has one, the first tree with the most forks."""
  if draws < 1:
    raise ValueError(f"draws must be at least 1, got {draws}")
  exp, state, saved = loop.load_checkpoint(settings, workdir, step)
  iteration = int(saved["iteration"]) + 1
  threshold = float(saved["fork_threshold"]["threshold"])
  key = jax.random.fold_in(jax.random.key(settings.seed), iteration)
  fallback = None
  try:
    engine = rollout_lib.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt, exp.pool,
                                       translate.rollout_config(settings))
    tasks = iteration_lib.iteration_tasks(exp, iteration)
    params = exp.sampling_params(state.params)
    for draw in range(draws):
      batch = engine.rollout(params, tasks, jax.random.fold_in(key, draw) if draw else key,
                             threshold=threshold)
      advantages, _ = training_credit(settings, batch)
      for index, tree in enumerate(batch.rollouts):
        drawn = DrawnTree(tree, advantages[index], threshold, iteration, draw, index,
                          differing_forks(tree, float(settings.rollout.gamma)))
        if drawn.differing_forks:
          return drawn
        forks = sum(len(k) > 1 for k in tree.tokens.children())
        if fallback is None or forks > fallback[0]:
          fallback = (forks, drawn)
  finally:
    exp.close()
  return fallback[1]


def render_tree(rollout: rollout_lib.TaskRollout, advantages: np.ndarray | None = None,
                marked: tuple[int, ...] = ()) -> str:
  """A text drawing of one task's rollout tree: each step's action, reward and outcome.

  The root observation is wrapped at word boundaries (`ROOT_WIDTH`). Example step line:
  `├─ take apple  r=0  A=+0.50` (A only when advantages are given); forks show as several
  children under one step, a fork in `marked` (node index, N for the root state) as `◆`.
  """
  tokens = rollout.tokens
  kids = tokens.children()
  root = textwrap.wrap(" ".join(rollout.first_observation.split()), ROOT_WIDTH) or [""]
  lines = ["[root] " + root[0]] + ["       " + line for line in root[1:]]
  if tokens.num_nodes in marked:
    lines[-1] += "  ◆"
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
    fork = "  ◆" if node in marked else ""
    lines.append(f"{prefix}{connector}{rollout.action_texts[node] or '<empty>'}  "
                 f"r={reward[node]:g}{adv}{outcome}{fork}")
    children = kids[node]
    for j, child in enumerate(children):
      visit(child, prefix + ("   " if last else "│  "), j == len(children) - 1)

  roots = kids[tokens.num_nodes]
  for j, node in enumerate(roots):
    visit(node, "", j == len(roots) - 1)
  return "\n".join(lines)
