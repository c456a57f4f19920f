"""bpo_jax: Branching Policy Optimization for LLM agents in snapshot-able sandboxes.

The top-level package re-exports the pure core only (jax, numpy, chex); flax, transformers,
orbax and the environment packages load when their own modules are imported.
"""

__version__ = "0.1.0"
