"""The testbed's policy gradient, averaged over every tree it can grow, is the true gradient.

On a world of two decisions among two actions and two tasks, each tree (or group) is fixed by
its task and the action every branch slot takes at every depth; all of them are enumerated with
their probabilities (a slot that holds no branch takes any action with probability 1/A, so the
probabilities sum to 1), and the expectation of the iteration's gradient g is compared with
∇J(θ) from the exact success `worlds.expected_success`.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax.testbed import grow
from bpo_jax.testbed import learn
from bpo_jax.testbed import worlds
from bpo_jax.testing.tolerance import assert_close

WORLD = worlds.ChainWorld(0.75, horizon=2, num_actions=2, num_tasks=2)
BUDGET = 5  # two whole episodes of 2 steps, plus 1: a tree of 3 leaves (root fork, one more)


@functools.partial(jax.jit, static_argnames="m")
def _gradients(m, logits, tables, tasks):
  """g and the log-probability of the table's live entries, per (task, action table)."""
  def one(table, task):
    grown = grow.grow(WORLD, m.topology, logits, task, lambda depth, _: table[depth])
    batch = jax.tree_util.tree_map(lambda x: x[None], grown)
    g = learn.policy_gradient(logits, batch, learn.coefficients(m, batch))
    logp = jax.nn.log_softmax(logits, axis=-1)[grown.row, grown.action]
    return g, jnp.sum(jnp.where(grown.tree.valid, logp, 0.0)), jnp.sum(grown.tree.valid)
  return jax.vmap(one)(tables, tasks)


def expected_gradient(m: learn.Method, logits) -> tuple[np.ndarray, np.ndarray, float]:
  """(E[g] in float64, max |g| over outcomes, total probability)."""
  slots = m.topology.slots(WORLD.horizon)
  cells = WORLD.horizon * slots
  tables = np.array(list(itertools.product(range(WORLD.num_actions), repeat=cells)), np.int32)
  tables = np.tile(tables.reshape(-1, WORLD.horizon, slots), (WORLD.num_tasks, 1, 1))
  tasks = np.repeat(np.arange(WORLD.num_tasks, dtype=np.int32), len(tables) // WORLD.num_tasks)
  g, logp, live = (np.asarray(x, np.float64) for x in _gradients(m, logits, tables, tasks))
  p = np.exp(logp) * WORLD.num_actions ** -(cells - live) / WORLD.num_tasks
  return np.tensordot(p, g, axes=1), np.abs(g).max(), p.sum()


LOGITS = jnp.asarray([[0.7, -0.4], [0.1, 0.0], [2.0, 0.0]], jnp.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name, threshold", [("bpo", 0.0), ("bpo", 0.5), ("rloo", 0.0)])
def test_expected_gradient_is_the_true_gradient(name, threshold):
  # Threshold 0.5 lies between the rows' entropies (0.56 at the root, 0.69 after a wrong first
  # action, 0.36 after the right one), so whether a branch forks at depth 1 depends on the state
  # its first action led to: the online rule's stopping time.
  m = learn.Method(name, grow.Topology(
      "tree" if name == "bpo" else "group", BUDGET, max_leaves=3, entropy_threshold=threshold))
  mean, scale, total = expected_gradient(m, LOGITS)
  assert total == pytest.approx(1.0, abs=1e-6)
  true = np.asarray(jax.grad(worlds.expected_success)(LOGITS, WORLD), np.float64)
  # Each outcome's g goes through a few dozen float32 roundings at most at its magnitude; the
  # expectation is a convex combination of them.
  assert_close(mean, true, steps=64, magnitude=scale, dtype=np.float32)
  assert np.abs(true).max() > 0.05


def test_grpo_is_biased_here():
  """GRPO's std normalisation: the same enumeration gives a gradient that is not ∇J. With two
  episodes and returns 0 or 1 GRPO's advantages are RLOO's (±1 where the returns differ), so
  the group here has three."""
  m = learn.Method("grpo", grow.Topology("group", 3 * WORLD.horizon))
  mean, scale, _ = expected_gradient(m, LOGITS)
  true = np.asarray(jax.grad(worlds.expected_success)(LOGITS, WORLD), np.float64)
  assert np.abs(mean - true).max() > 100 * 64 * np.finfo(np.float32).eps * scale
