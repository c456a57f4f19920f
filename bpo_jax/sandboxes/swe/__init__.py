"""SWE: bug-fix tasks in SWE-bench's instance schema, in a confined, snapshot-able sandbox.

    from bpo_jax.sandboxes import swe
    sandbox = swe.make_sandbox(max_steps=20)
    task = swe.make_tasks("train", num=1, seed=0)[0]
    obs = sandbox.reset(task)
    sandbox.step("run python -m pytest -q")
    step = sandbox.step("submit")       # step.info["success"]: graded by swebench's report

Modules: `sandbox` (actions, reward), `confinement` (how commands are contained), `workspace`
(git trees and snapshot bytes), `grading` (swebench's log parser and report), `tasks` (the
shipped tasks), `instances` (real SWE-bench instances selected by config: `env.options.instances`,
`repos_dir`, `envs_dir`), `rows` (each row checked against its clone at load: patches, parser,
tests), `envs` (one Python environment per repository and setup commit).

Commands run in namespaces by default, with or without root (without, in a user namespace);
`make_sandbox(confinement="rlimits-only")` (the `env.options.confinement` of a run) is the
explicit fallback for hosts without them.
`protections_record(**options)` is what a run records of it in its config.json.
"""

from __future__ import annotations

from typing import Any

from bpo_jax.sandboxes.swe.confinement import (MODES, CommandResult, ConfinementError, Limits,
                                               protections, run_confined, unprotected)
from bpo_jax.sandboxes.swe.grading import GradingError, evaluate_patch
from bpo_jax.sandboxes import base
from bpo_jax.sandboxes.swe import instances as instances_lib
from bpo_jax.sandboxes.swe import tasks as tasks_lib
from bpo_jax.sandboxes.swe.envs import EnvBuildError, PythonEnv, ensure_env
from bpo_jax.sandboxes.swe.sandbox import SweSandbox
from bpo_jax.sandboxes.swe.tasks import (SweTask, load_shipped_task, load_swebench_instances,
                                         shipped_task_names)


def make_sandbox(**config) -> SweSandbox:
  """A `SweSandbox`; `config` are its constructor arguments."""
  return SweSandbox(**config)


def make_tasks(split: str, num: int, seed: int, **config) -> list[SweTask]:
  """`num` tasks of `split`: the shipped ones (tasks.make_tasks), or, when `config` names
  `instances`, real SWE-bench instances from local clones (instances.make_tasks); the other keys
  of `config` are the sandbox's options.

  Raises:
    ValueError: bad instance input, one line naming it. TypeError: unknown keys.
  """
  real = {k: config.pop(k) for k in list(config) if k in instances_lib.OPTIONS}
  if real and "instances" not in real:
    raise base.TaskInputError(
        f"env.options.{sorted(real)[0]} is given without env.options.instances")
  tasks = tasks_lib.make_tasks(split, num, seed, **config)  # checks split, num and keys
  if not real:
    return tasks
  return instances_lib.make_tasks(split, num, seed, **real)


def protections_record(**options: Any) -> dict[str, Any]:
  """The confinement mode that sandboxes built with `options` use, the protections their
  commands get here and, in words, what they are not protected against, e.g. {"confinement":
  "rlimits-only", "protections": {"network_namespace": False, ...}, "not_protected": ["the
  network: commands use the host's", ...]}. Other sandbox options are ignored.

  Raises:
    ValueError: an unknown mode. ConfinementError: the mode cannot be had on this host.
  """
  mode = options.get("confinement", "namespaces")
  return {"confinement": mode, "protections": dict(protections(mode)),
          "not_protected": unprotected(mode)}


__all__ = ["MODES", "CommandResult", "ConfinementError", "EnvBuildError", "GradingError",
           "Limits", "PythonEnv", "SweSandbox", "ensure_env",
           "SweTask", "evaluate_patch", "load_shipped_task", "load_swebench_instances",
           "make_sandbox", "make_tasks", "protections", "protections_record", "run_confined",
           "shipped_task_names", "unprotected"]
