"""bpo_jax: Branching Policy Optimization for LLM agents in snapshot-able sandboxes.

The top-level package re-exports the pure core only (jax, numpy, chex); flax, transformers,
orbax and the environment packages load when their own modules are imported.
"""

from bpo_jax.branching import (ForkBudget, QuantileThreshold, init_quantile_threshold,
                               matched_group_size, online_fork_decision, random_fork_decision,
                               top_k_fork_steps, tree_env_steps, tree_num_leaves,
                               update_quantile_threshold)
from bpo_jax.estimators import (BPOOutput, bpo_advantages, children_counts,
                                effective_num_samples, gigpo_advantages, grpo_advantages,
                                leaf_mask, leave_one_out_trunk_baselines, node_values,
                                path_weights, prefix_explained_variance, rloo_advantages,
                                root_value, sibling_baselines, sibling_counts)
from bpo_jax.fork_variance import ReturnMoments, fork_moments
from bpo_jax.losses import NORMALIZATIONS, broadcast_to_tokens, policy_loss
from bpo_jax.tree import (RolloutTree, TreeBuilder, empty_tree, from_parents, pad_tree,
                          stack_trees, validate)

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
