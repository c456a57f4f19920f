"""RolloutTree, TreeBuilder, validate, stacking: structure checks and property tests."""

import re

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from bpo_jax import estimators
from bpo_jax.testing.tolerance import assert_close
from bpo_jax.tree import (RolloutTree, TreeBuilder, empty_tree, from_parents, pad_tree,
                          stack_trees, validate)


def _example_builder():
  b = TreeBuilder(capacity=8)
  a = b.add(-1, entropy=0.1, state_id=3)
  c1 = b.add(a, entropy=1.2)
  c2 = b.add(a, entropy=1.2)
  b.set_outcome(a, 0.5)
  b.set_outcome(c1, 1.0, terminal=True)
  b.set_outcome(c2, 0.0, truncated=True)
  return b


def test_builder_fields_and_padding():
  tree = _example_builder().build()
  validate(tree)
  np.testing.assert_array_equal(tree.parent, [-1, 0, 0, -1, -1, -1, -1, -1])
  np.testing.assert_array_equal(tree.valid, [1, 1, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(tree.depth[:3], [0, 1, 1])
  np.testing.assert_array_equal(tree.reward[:3], [0.5, 1.0, 0.0])  # Stored as given.
  np.testing.assert_array_equal(tree.terminal[:3], [0, 1, 0])
  np.testing.assert_array_equal(tree.truncated[:3], [0, 0, 1])
  assert tree.state_id[0] == 3 and tree.state_id[1] == -1
  assert tree.parent.dtype == np.int32 and tree.reward.dtype == np.float32


def test_tree_is_a_pytree():
  """Flattening and unflattening (through `jit` and `tree_map`) keeps every field in its place."""
  tree = _example_builder().build()
  leaves = jax.tree_util.tree_leaves(tree)
  assert len(leaves) == 8
  back = jax.jit(lambda t: t)(tree)
  assert isinstance(back, RolloutTree)
  for name in tree.__dataclass_fields__:
    np.testing.assert_array_equal(getattr(back, name), getattr(tree, name), err_msg=name)
  batched = jax.tree_util.tree_map(lambda x: x[None], tree)
  assert batched.parent.shape == (1, 8)
  np.testing.assert_array_equal(batched.reward[0], tree.reward)


def test_builder_errors_name_the_fault():
  b = TreeBuilder(capacity=2)
  b.add(-1)
  with pytest.raises(ValueError, match="node 1: parent 5 is not -1 or an existing node"):
    b.add(5)
  b.add(0)
  with pytest.raises(ValueError, match="capacity exceeded"):
    b.add(1)
  with pytest.raises(ValueError, match="node 0 has children and cannot be terminal"):
    b.set_outcome(0, 1.0, terminal=True)
  b2 = TreeBuilder(capacity=3)
  b2.add(-1)
  b2.set_outcome(0, 1.0, terminal=True)
  with pytest.raises(ValueError, match="parent 0 is terminal"):
    b2.add(0)


def test_mark_failed_invalidates_subtree_only():
  b = TreeBuilder(capacity=6)
  r = b.add(-1)
  x = b.add(r)
  y = b.add(r)
  b.add(x)
  b.add(y)
  assert [b.parent_of(i) for i in range(5)] == [-1, 0, 0, 1, 2]
  assert b.children_of(r) == [1, 2] and b.children_of(-1) == [0] and b.children_of(4) == []
  b.mark_failed(x)
  tree = b.build()
  np.testing.assert_array_equal(tree.valid[:5], [1, 0, 1, 0, 1])
  assert [b.is_valid(i) for i in range(5)] == [True, False, True, False, True]
  validate(tree)


@pytest.mark.parametrize("field,index,value,message", [
    ("parent", 2, 7, "node 2: parent 7 out of range"),
    ("parent", 1, 2, "node 1: parent 2 comes after its child"),
    ("reward", 2, np.nan, "node 2: reward is nan"),
    ("terminal", 0, True, "node 1: parent 0 is terminal"),
    ("depth", 2, 5, "node 2: depth 5"),
])
def test_validate_rejects_with_node_named(field, index, value, message):
  tree = from_parents([-1, 0, 0], [0.0, 1.0, 2.0])
  getattr(tree, field)[index] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    validate(tree)


def test_validate_rejects_cycle():
  tree = from_parents([-1, 0, 1], [0.0, 1.0, 2.0])
  tree.parent[1] = 2
  with pytest.raises(ValueError, match=r"node \d: parent pointers form a cycle"):
    validate(tree)


def test_stack_and_pad():
  t1 = from_parents([-1, 0], [1.0, 2.0], capacity=4)
  t2 = from_parents([-1, -1, 0], [1.0, 2.0, 3.0], capacity=4)
  batch = stack_trees([t1, t2])
  assert batch.parent.shape == (2, 4)
  with pytest.raises(ValueError, match="one capacity"):
    stack_trees([t1, from_parents([-1], [0.0])])
  padded = pad_tree(t1, 6)
  assert padded.capacity == 6 and padded.valid.sum() == 2
  validate(padded)
  with pytest.raises(ValueError, match="capacity exceeded"):
    pad_tree(t2, 2)
  assert empty_tree(3).valid.sum() == 0


@st.composite
def random_trees(draw, max_nodes=12):
  n = draw(st.integers(1, max_nodes))
  parents = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]
  rewards = draw(st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=n,
                          max_size=n))
  b = TreeBuilder(capacity=max_nodes)
  for p in parents:
    b.add(p, entropy=draw(st.floats(0, 5, width=32)), state_id=draw(st.integers(-1, 3)))
  has_child = {p for p in parents if p >= 0}
  for i, r in enumerate(rewards):
    b.set_outcome(i, r, terminal=(i not in has_child) and draw(st.booleans()))
  for i in range(n):
    if draw(st.integers(0, 9)) == 0:
      b.mark_failed(i)
  return b.build()


_all_estimators = jax.jit(lambda t: (
    estimators.bpo_advantages(t, gamma=0.9, trunk_baseline=0.3),
    estimators.rloo_advantages(t), estimators.grpo_advantages(t),
    estimators.gigpo_advantages(t), estimators.effective_num_samples(t),
    estimators.prefix_explained_variance(t, 0.9)))


@pytest.mark.slow
@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(random_trees())
def test_random_valid_trees_never_give_nan(tree):
  validate(tree)
  out = jax.tree_util.tree_leaves(_all_estimators(tree))
  for x in out:
    assert np.all(np.isfinite(np.asarray(x)))
  bpo = _all_estimators(tree)[0]
  leaves = np.asarray(estimators.leaf_mask(tree))
  if tree.valid.any():
    # Each leaf weight is ≤ depth divisions, then one sum over ≤ N leaves: relative roundings.
    assert_close(np.asarray(bpo.weights)[leaves].sum(), 1.0, steps=2 * tree.capacity)
  np.testing.assert_array_equal(np.asarray(bpo.advantages)[~tree.valid], 0.0)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(random_trees(), st.data())
def test_malformed_trees_are_rejected_naming_the_node(tree, data):
  valid_nodes = np.flatnonzero(tree.valid)
  hypothesis.assume(len(valid_nodes) >= 2)
  node = int(data.draw(st.sampled_from(valid_nodes[1:].tolist())))
  fault = data.draw(st.sampled_from(["range", "after", "nan", "terminal_parent"]))
  n = tree.capacity
  if fault == "range":
    tree.parent[node] = n + data.draw(st.integers(0, 5))
    expected = f"node {node}: parent"
  elif fault == "after":
    tree.parent[node] = node  # A self-loop: a cycle and a parent not before its child.
    expected = f"node {node}: parent pointers form a cycle"
  elif fault == "nan":
    tree.reward[node] = np.nan
    expected = f"node {node}: reward is nan"
  else:
    hypothesis.assume(tree.parent[node] >= 0)
    p = tree.parent[node]
    tree.terminal[p] = True
    first_child = int(np.flatnonzero(tree.valid & (tree.parent == p))[0])
    expected = f"node {first_child}: parent {p} is terminal"
  with pytest.raises(ValueError, match=re.escape(expected)):
    validate(tree)
