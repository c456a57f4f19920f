"""SWE: bug-fix tasks in SWE-bench's instance schema, in a confined, snapshot-able sandbox.

    from bpo_jax.sandboxes import swe
    sandbox = swe.make_sandbox(max_steps=20)
    task = swe.make_tasks("train", num=1, seed=0)[0]
    obs = sandbox.reset(task)
    sandbox.step("run python -m pytest -q")
    step = sandbox.step("submit")       # step.info["success"]: graded by swebench's report

Modules: `sandbox` (actions, reward), `confinement` (how commands are contained), `workspace`
(git trees and snapshot bytes), `grading` (swebench's log parser and report), `tasks` (the
shipped tasks and a loader for real SWE-bench instance JSON).

Commands run in namespaces by default; `make_sandbox(confinement="rlimits-only")` (the
`env.options.confinement` of a run) is the explicit fallback for hosts without them.
`protections_record(**options)` is what a run records of it in its config.json.
"""

from __future__ import annotations

from typing import Any

from bpo_jax.sandboxes.swe.confinement import (MODES, CommandResult, ConfinementError, Limits,
                                               protections, run_confined)
from bpo_jax.sandboxes.swe.grading import GradingError, evaluate_patch
from bpo_jax.sandboxes.swe.sandbox import SweSandbox
from bpo_jax.sandboxes.swe.tasks import (SweTask, load_shipped_task, load_swebench_instances,
                                         make_tasks, shipped_task_names)


def make_sandbox(**config) -> SweSandbox:
  """A `SweSandbox`; `config` are its constructor arguments."""
  return SweSandbox(**config)


def protections_record(**options: Any) -> dict[str, Any]:
  """The confinement mode that sandboxes built with `options` use and the protections their
  commands get here, e.g. {"confinement": "namespaces", "protections": {"network_namespace":
  True, ...}}. Other sandbox options are ignored.

  Raises:
    ValueError: an unknown mode. ConfinementError: the mode cannot be had on this host.
  """
  mode = options.get("confinement", "namespaces")
  return {"confinement": mode, "protections": dict(protections(mode))}


__all__ = ["MODES", "CommandResult", "ConfinementError", "GradingError", "Limits", "SweSandbox",
           "SweTask", "evaluate_patch", "load_shipped_task", "load_swebench_instances",
           "make_sandbox", "make_tasks", "protections", "protections_record", "run_confined",
           "shipped_task_names"]
