"""Training: the configuration, the loop and its parts, the jitted update, checkpoints, metrics.

How the parts fit together: docs/DESIGN.md §2.

  config.py              the schema and its validation
  settings.py            the configuration read once into typed, frozen settings
  translate.py           the settings -> ModelConfig, RolloutConfig, UpdateConfig, mesh
  estimator_registry.py  the estimators by name (advantage function, topology)
  loop.py                train / resume / evaluate; the parts it calls: experiment.py,
                         warm_start.py, evaluation.py, placement.py, iteration.py
  display.py             one tree grown with a checkpoint, drawn as text
  update.py              train state, optimisers, the jitted policy-gradient and SFT steps
  program_memory.py      a pod layout's programs compiled, against a chip's HBM (chips.py);
                         dry_run.py its command line, on fake devices

Import the submodules directly (`from bpo_jax.training import update`); this package imports
nothing itself, so loading one part does not load the others.
"""
