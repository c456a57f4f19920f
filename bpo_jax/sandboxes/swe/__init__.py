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
"""

from __future__ import annotations

from bpo_jax.sandboxes.swe.confinement import CommandResult, Limits, protections, run_confined
from bpo_jax.sandboxes.swe.grading import evaluate_patch
from bpo_jax.sandboxes.swe.sandbox import SweSandbox
from bpo_jax.sandboxes.swe.tasks import (SweTask, load_shipped_task, load_swebench_instances,
                                         make_tasks, shipped_task_names)


def make_sandbox(**config) -> SweSandbox:
  """A `SweSandbox`; `config` are its constructor arguments."""
  return SweSandbox(**config)


__all__ = ["CommandResult", "Limits", "SweSandbox", "SweTask", "evaluate_patch",
           "load_shipped_task", "load_swebench_instances", "make_sandbox", "make_tasks",
           "protections", "run_confined", "shipped_task_names"]
