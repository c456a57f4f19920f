"""Growing rollout trees (BPO) and independent groups (baselines) with a policy and sandboxes.

One call to `RolloutEngine.rollout(params, tasks, key)` plays every task at once. Each task gets
a *backbone*: a branch (a live sandbox plus a row of the policy's KV cache) that starts at the
task's first observation. Each turn, for all live branches of all tasks together, the engine
decides at every branch's state whether to fork there (from the entropy at the state and the
budget used so far: a stopping-time rule, docs/DESIGN.md §3), forks (one snapshot restored into
the new branches, the cache row copied on the batch axis: the prefix is never replayed), decodes
one action per row in one call, steps every sandbox in one pool call and records the outcomes.
The baselines' group topology is the same loop with the decision "fork N at the root state,
never after". Failed branches are recorded with their reason and the rest goes on
(docs/DESIGN.md §4).

Modules:
  config       `RolloutConfig`: topology, fork rule, budgets, sampling, batch buckets.
  records      what comes out: `RolloutBatch`, `TaskRollout`, `Decision`, `Failure`, `Compute`.
  engine       `RolloutEngine`, the loop and its phases.
  policies     fork policies behind one interface: entropy, random, never, group at the root.
  top_k_after  the biased after-the-fact top-k rule, kept for comparison.
  budget       what the budgets allow at a turn's decisions.
  entropy      the entropy at a state (first token, or summed along the greedy action).
  keys         the per-branch PRNG keys (docs/DESIGN.md §5).
  branches     live branches, and new ones started from a snapshot.
  tree_state   one task's growing tree on a `tree.TreeBuilder`.
  state_ids    hashes of states (`RolloutTree.state_id`, decision digests).

Every token the policy processes is counted: for a tree without failures, tokens prefilled +
tokens decoded equals `TreeTokens.num_unique_tokens()` exactly.

Example:

  engine = RolloutEngine(graphdef, model_config, fmt, pool,
                         RolloutConfig(k=4, entropy_threshold=2.0, max_leaves=8))
  batch = engine.rollout(params, tasks, jax.random.key(0))
  trees = batch.stacked_trees()              # RolloutTree with a leading task axis
  tokens = batch.tree_tokens()               # for packing.pack_trees
  batch.summary()                            # compute counters, seconds per phase
"""

from bpo_jax.rollout.config import (BUDGET_ACCOUNTING, ENTROPY_MEASURES, FORK_RULES, STATE_IDS,
                                    TOPOLOGIES, RolloutConfig)
from bpo_jax.rollout.engine import RolloutEngine
from bpo_jax.rollout.entropy import first_token_entropy
from bpo_jax.rollout.keys import child_key
from bpo_jax.rollout.records import (PHASES, ROOT, Compute, Decision, Failure, RolloutBatch,
                                     TaskRollout, matched_group_size)
from bpo_jax.rollout.state_ids import text_state_id

__all__ = [
    "BUDGET_ACCOUNTING", "Compute", "Decision", "ENTROPY_MEASURES", "FORK_RULES", "Failure",
    "PHASES", "ROOT", "RolloutBatch", "RolloutConfig", "RolloutEngine", "STATE_IDS",
    "TOPOLOGIES", "TaskRollout", "child_key", "first_token_entropy", "matched_group_size",
    "text_state_id",
]
