"""Host-side sandboxes: the protocol, a worker pool, and environments."""

from bpo_jax.sandboxes.base import MAX_ACTION_CHARS, Sandbox, Snapshot, Step, check_action, invalid_action_step
