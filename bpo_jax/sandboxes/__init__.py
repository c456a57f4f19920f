"""Host-side sandboxes: the protocol, a worker pool, and environments.

Environments load lazily through `get_environment(name)` (see `registry.py`); importing this
package imports none of them, nor gymnasium, textworld or any other environment package.
"""

from bpo_jax.sandboxes.base import MAX_ACTION_CHARS, Sandbox, Snapshot, Step, check_action, invalid_action_step
from bpo_jax.sandboxes.base import Divergence, check_replay, first_divergence, make_gym_env, replay
from bpo_jax.sandboxes.pool import BranchFailure, SandboxPool
from bpo_jax.sandboxes.registry import ENVIRONMENTS, environment_names, get_environment
