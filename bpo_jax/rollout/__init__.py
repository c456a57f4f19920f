"""Growing rollout trees (BPO) and independent groups (baselines) with a policy and sandboxes."""

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
