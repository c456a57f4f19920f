"""Import smoke test: the flat public API of the pure core."""

import bpo_jax


def test_public_api_is_flat_and_complete():
  for name in bpo_jax.__all__:
    assert getattr(bpo_jax, name) is not None, name
  assert callable(bpo_jax.bpo_advantages) and callable(bpo_jax.policy_loss)
  assert bpo_jax.RolloutTree is bpo_jax.tree.RolloutTree
