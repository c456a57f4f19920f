"""A sandbox wrapper that misbehaves on request, for testing the pool's fault handling.

`FaultySandbox` passes every call to a wrapped sandbox, except the actions

    "fault raise"     raise RuntimeError
    "fault hang"      sleep for an hour (past any pool timeout)
    "fault exit"      os._exit(3): the process ends without cleanup
    "fault segfault"  read address 0 through ctypes: the process dies of SIGSEGV

`make_sandbox(inner="rooms", **config)` wraps an environment from the registry, so a pool can
build it in its workers: `SandboxPool.for_environment("faulty", ...)` is not registered on
purpose; use `SandboxPool(functools.partial(faults.make_sandbox, inner="rooms"))`.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import registry

FAULT_ACTIONS = ("fault raise", "fault hang", "fault exit", "fault segfault")


class FaultySandbox(base.SandboxWrapper):
  """Wraps `inner`; the actions in `FAULT_ACTIONS` trigger their fault during `step`."""

  def step(self, action: Any) -> base.Step:
    if action == "fault raise":
      raise RuntimeError("injected fault")
    if action == "fault hang":
      time.sleep(3600)
    if action == "fault exit":
      os._exit(3)  # pylint: disable=protected-access
    if action == "fault segfault":
      ctypes.string_at(0)
    return self.inner.step(action)


def make_sandbox(inner: str = "rooms", **config) -> FaultySandbox:
  return FaultySandbox(registry.get_environment(inner).make_sandbox(**config))
