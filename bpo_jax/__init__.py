"""bpo_jax: Branching Policy Optimization for LLM agents in snapshot-able sandboxes.

The top-level package re-exports the pure core only (jax, numpy, chex), each name loaded on its
first use; flax, transformers, orbax and the environment packages load when their own modules
are imported.
"""

import importlib

# name -> the module that defines it. The names load on first use (PEP 562), so that what reads
# only the configuration (experiments/run.py's validation, the schema) does not load JAX.
_EXPORTS = {
    **dict.fromkeys(("ForkBudget", "QuantileThreshold", "init_quantile_threshold",
                     "matched_group_size", "online_fork_decision", "random_fork_decision",
                     "top_k_fork_steps", "tree_env_steps", "tree_num_leaves",
                     "update_quantile_threshold"), "bpo_jax.branching"),
    **dict.fromkeys(("BPOOutput", "bpo_advantages", "children_counts", "effective_num_samples",
                     "gigpo_advantages", "grpo_advantages", "leaf_mask",
                     "leave_one_out_trunk_baselines", "node_values", "path_weights",
                     "prefix_explained_variance", "rloo_advantages", "root_value",
                     "sibling_baselines", "sibling_counts"), "bpo_jax.estimators"),
    **dict.fromkeys(("ReturnMoments", "fork_moments"), "bpo_jax.fork_variance"),
    **dict.fromkeys(("NORMALIZATIONS", "broadcast_to_tokens", "policy_loss"), "bpo_jax.losses"),
    **dict.fromkeys(("RolloutTree", "TreeBuilder", "empty_tree", "from_parents", "pad_tree",
                     "stack_trees", "validate"), "bpo_jax.tree"),
}


# The core's modules, attributes of the package as the names they define (`bpo_jax.tree`).
_MODULES = ("branching", "estimators", "fork_variance", "losses", "tree")


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  if name in _MODULES:
    return importlib.import_module(f"bpo_jax.{name}")
  raise AttributeError(f"module 'bpo_jax' has no attribute {name!r}")


def __dir__():
  return sorted([*globals(), *_EXPORTS, *_MODULES])


__version__ = "0.1.0"

__all__ = [
    "BPOOutput", "ForkBudget", "NORMALIZATIONS", "QuantileThreshold", "ReturnMoments",
    "RolloutTree", "TreeBuilder", "bpo_advantages", "broadcast_to_tokens", "children_counts",
    "empty_tree",
    "effective_num_samples", "fork_moments", "from_parents", "gigpo_advantages",
    "grpo_advantages", "init_quantile_threshold", "leaf_mask", "leave_one_out_trunk_baselines",
    "matched_group_size", "node_values", "online_fork_decision", "pad_tree", "path_weights",
    "policy_loss", "prefix_explained_variance", "random_fork_decision", "rloo_advantages",
    "root_value", "sibling_baselines", "sibling_counts", "stack_trees", "top_k_fork_steps",
    "tree_env_steps", "tree_num_leaves", "update_quantile_threshold", "validate",
]
