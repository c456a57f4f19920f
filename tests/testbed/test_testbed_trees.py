"""The testbed's trees: the engine's fork rule and budget, and the library's estimators on them."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import estimators
from bpo_jax import tree as tree_lib
from bpo_jax.testbed import grow
from bpo_jax.testbed import learn
from bpo_jax.testbed import worlds
from bpo_jax.testing.tolerance import assert_close

WORLD = worlds.ChainWorld(0.5, horizon=4, num_actions=3, num_tasks=4)


@functools.partial(jax.jit, static_argnames="topo")
def _grow_seeds(topo, logits, seeds):
  return jax.vmap(lambda s: grow.grow(WORLD, topo, logits, jnp.int32(2),
                                      grow.sampler(jax.random.key(s))))(seeds)


def _grown(topo, seed=0, logits=None):
  logits = learn.initial_logits(WORLD) if logits is None else logits
  g = _grow_seeds(topo, logits, jnp.array([seed]))
  return jax.tree_util.tree_map(lambda x: np.asarray(x)[0], g)


@pytest.mark.slow
def test_tree_under_the_budget_by_hand():
  # Budget 19 = 4 episodes of 4 steps + 3. Turn 0: one branch, 0 + 4 + 4 ≤ 19, fork (2 live).
  # Turn 1 (2 steps used, live worst 6): 2 + 6 + 3 = 11 and 2 + 9 + 3 = 14 fork (4 live).
  # Turn 2 (6 used, worst 8): 16 and 18 fork, 20 does not (6 live). Turn 3 (12 used, worst 6):
  # 19 forks, 20 does not. 19 nodes, 7 leaves; new branches take the next slots.
  g = _grown(grow.Topology("tree", max_env_steps=19))
  tree_lib.validate(g.tree)
  n = int(g.tree.valid.sum())
  assert n == 19
  assert g.tree.parent[:n].tolist() == [-1, -1, 0, 1, 0, 1, 2, 3, 4, 5, 2, 3,
                                        6, 7, 8, 9, 10, 11, 6]
  assert g.tree.depth[:n].tolist() == [0] * 2 + [1] * 4 + [2] * 6 + [3] * 7
  assert g.tree.terminal[:n].tolist() == [False] * 12 + [True] * 7
  assert int(estimators.leaf_mask(g.tree).sum()) == 7


def test_group_is_whole_episodes_at_the_root():
  g = _grown(grow.Topology("group", max_env_steps=19))
  tree_lib.validate(g.tree)
  assert g.tree.parent[:16].tolist() == [-1] * 4 + list(range(12))
  assert int(g.tree.valid.sum()) == 16


@pytest.mark.slow
def test_threshold_above_every_entropy_grows_one_episode():
  g = _grown(grow.Topology("tree", max_env_steps=19, entropy_threshold=np.log(3.0) + 0.1))
  assert g.tree.parent[:int(g.tree.valid.sum())].tolist() == [-1, 0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("budget", [7, 30])
def test_no_tree_spends_more_than_its_budget(budget):
  topo = grow.Topology("tree", max_env_steps=budget, root_k=3, max_leaves=8)
  logits = jax.random.normal(jax.random.key(budget), (WORLD.num_states, 3))
  g = _grow_seeds(topo, logits, jnp.arange(16))
  assert np.asarray(g.tree.valid).sum(-1).max() <= budget
  assert np.asarray(jax.vmap(estimators.leaf_mask)(g.tree)).sum(-1).max() <= 8
  # The root forks 3 ways whenever the budget holds 3 whole episodes (3 · 4 ≤ budget).
  at_root = (np.asarray(g.tree.parent) == -1) & np.asarray(g.tree.valid)
  assert (at_root.sum(-1) == (3 if budget >= 12 else 1)).all()


def _rebuilt(g):
  """The grown tree rebuilt node by node with the library's TreeBuilder (the host's path)."""
  n = int(g.tree.valid.sum())
  b = tree_lib.TreeBuilder(g.tree.capacity)
  for i in range(n):
    b.add(int(g.tree.parent[i]), entropy=float(g.tree.entropy[i]), state_id=int(g.tree.state_id[i]))
    b.set_outcome(i, float(g.tree.reward[i]), terminal=bool(g.tree.terminal[i]))
  return jax.tree_util.tree_map(jnp.asarray, b.build())


REFERENCE = {
    "bpo": lambda t: (estimators.bpo_advantages(t).advantages, estimators.path_weights(t)),
    "rloo": lambda t: (estimators.rloo_advantages(t), estimators.path_weights(t)),
    "grpo": lambda t: (estimators.grpo_advantages(t), estimators.path_weights(t)),
    "gigpo": lambda t: (estimators.gigpo_advantages(t), estimators.path_weights(t)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", learn.METHODS)
def test_coefficients_are_the_library_estimators(name):
  m = learn.method(name, 19)
  logits = jax.random.normal(jax.random.key(3), (WORLD.num_states, 3))
  tasks = jnp.arange(4, dtype=jnp.int32)
  grown = jax.jit(lambda k: learn.grow_batch(WORLD, m, logits, tasks, k))(jax.random.key(5))
  coef = np.asarray(jax.jit(lambda g: learn.coefficients(m, g))(grown))
  for t in range(4):
    one = jax.tree_util.tree_map(lambda x: np.asarray(x)[t], grown)
    advantages, weights = REFERENCE[name](_rebuilt(one))
    expected = np.asarray(advantages * weights)
    # A handful of roundings at most per value (sums over at most 8 siblings, a division).
    assert_close(coef[t], expected, steps=16, magnitude=max(1.0, np.abs(expected).max()),
                 err_msg=f"{name}, tree {t}")
  assert np.abs(coef).max() > 0  # some tree with signal, so the comparison has teeth


def test_method_refuses_a_topology_its_estimator_does_not_grow():
  with pytest.raises(ValueError, match="needs a 'group' topology"):
    learn.Method("rloo", grow.Topology("tree", 19))
