"""Training: train state and jitted update, the loop, checkpoints, metrics, configuration.

Import the submodules directly (`from bpo_jax.training import update`); this package imports
nothing itself, so loading one part does not load the others.
"""
