"""Training: the configuration, the loop and its parts, the jitted update, checkpoints, metrics.

  config.py              the schema and its validation
  translate.py           the configuration -> ModelConfig, RolloutConfig, UpdateConfig, mesh
  estimator_registry.py  the estimators by name (advantage function, topology)
  loop.py                train / resume / evaluate; the parts it calls: experiment.py,
                         warm_start.py, evaluation.py, placement.py, iteration.py
  display.py             one tree grown with a checkpoint, drawn as text
  update.py              train state, optimisers, the jitted policy-gradient and SFT steps
  dry_run.py, chips.py   a pod layout compiled on fake devices, checked against a chip's HBM

Import the submodules directly (`from bpo_jax.training import update`); this package imports
nothing itself, so loading one part does not load the others.
"""
