"""SWE: fix a small Python repository until its tests pass, graded by swebench's report.

Twelve shipped bug-fix tasks (8 train, 4 test) in SWE-bench's instance schema; actions are shell
commands, file views and edits, and `submit` (see bpo_jax/sandboxes/swe/sandbox.py). Commands run
confined (namespaces, a read-only view of the task, the interpreter and the system's files only,
no network, resource limits) in worker processes, with or without root (without, the kernel
must allow unprivileged user namespaces); a host without namespaces needs
`--config.env.options.confinement=rlimits-only`, which only limits resources.
Observations (problem statement, file views, test output) are long, so they are cut at 512
tokens and an episode has at most 12 turns (a path of up to ~10200 tokens in the chat format;
a tree of several is packed into one row of up to `rollout.max_tree_tokens`); the expert (the reference patch as `replace`
actions) solves each task in 2-3. The hidden tests are applied only when `submit` grades (as
SWE-bench asks); `show_tests=True` would show them from the start.

    python experiments/run.py --config=experiments/configs/swe.py --workdir=workdirs/swe
"""

import ml_collections

from bpo_jax.training import config as config_lib
from experiments.configs import base


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = config_lib.default_config()
  c.env.name = "swe"
  c.env.options = ml_collections.ConfigDict(
      {"max_steps": 12, "show_tests": False, "confinement": "namespaces"})
  c.env.num_train_tasks = 8
  c.env.num_eval_tasks = 4
  c.env.max_turns = 12
  c.env.num_workers = 2          # commands and test runs happen in worker processes
  c.env.timeout_s = 120.0        # a submit runs the test suite
  c.env.max_observation_tokens = 512
  # The longest expert edit takes about 300 tokens of the tasks' BPE.
  c.rollout.max_action_tokens = 320
  c.model.max_length = 12288
  c.rollout.max_tree_tokens = 65536
  c.eval.num_tasks = 4
  c.warm_start.num_trajectories = 8  # one expert episode per training task
  return base.variant(c, arg)
