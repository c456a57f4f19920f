"""The sandbox pool on Ray: each worker a Ray actor, on any node of a cluster.

`RaySandboxPool` is a `pool.SandboxPool` with the same calls, results, failures, backups and
counters, so the rollout engine cannot tell them apart; only where a worker runs differs.

    pool = RaySandboxPool(factory, num_workers=16, timeout_s=30.0, address="auto")

Placement. Each actor asks for `cpus_per_worker` CPUs and a sliver (`RESOURCE_PER_WORKER`) of
the custom resource `resource` ("sandbox_node" unless set; "" asks for none). A node offers
that resource only if it was started with it (`ray start --resources='{"sandbox_node": 1}'`),
so sandboxes land on the CPU nodes and never on an accelerator host; the CPUs a node declares
bound how many fit on it. Actors spread over the nodes that qualify.

Snapshots. A snapshot is bytes in the object store: an actor's answer comes back through it,
and a restore of one snapshot into several branches puts the bytes there once (`ray.put`), from
where an actor on any node pulls them. Sandboxes are deterministic functions of the snapshot
bytes and the actions, so a branch replays byte for byte on any node.

Faults, as in the process pool: a call past `timeout_s` kills its actor; an actor that dies
(its process exits or is killed, or its node goes away) fails the call it was running with the
reason Ray reports. Either way a new actor takes the slot (wherever the resources allow), the
other branches of the lost actor are restored into it from their backups, and the caller gets
a `BranchFailure` for the failed call only.

Shared state per node. Each actor holds its branches in a `pool.SandboxHost`; what environments
share between workers lives on the node's disk (WebShop's index under `index_cache_dir`, SWE
environments under `envs_dir`, each built once behind a file lock), so it is built once per
node and mapped by every actor there.

Ray itself. `address=""` starts a local Ray for this process (one node declaring the machine's
CPUs, at least `num_workers * cpus_per_worker`, and the resource; no dashboard; usage stats off
unless `RAY_USAGE_STATS_ENABLED` says otherwise); "auto" or "host:port" joins a running cluster.
A process already connected to Ray keeps that connection. See docs/DESIGN.md §4.
"""

from __future__ import annotations

import collections
import math
import os
import re
import time
from typing import Any, Callable, Hashable

import ray

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import pool as pool_lib

# Each actor's share of the custom resource: enough to require it, small enough that a node
# declaring 1 unit holds as many actors as its CPUs allow.
RESOURCE_PER_WORKER = 0.001
DEFAULT_RESOURCE = "sandbox_node"


def connect(address: str, num_workers: int, cpus_per_worker: float, resource: str) -> None:
  """Connects this process to Ray: joins `address`, or starts a local Ray when it is empty.

  A local Ray declares max(machine CPUs, ceil(num_workers * cpus_per_worker)) CPUs, as the
  process pool starts `num_workers` processes whatever the core count.
  """
  if ray.is_initialized():
    return
  if address:
    try:
      ray.init(address=address)
    except ConnectionError as error:
      raise ConnectionError(f"env.pool.ray_address = {address!r}: no Ray cluster there "
                            f"({error})") from None
    return
  os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
  num_cpus = max(os.cpu_count() or 1, math.ceil(num_workers * cpus_per_worker))
  ray.init(address="local", num_cpus=num_cpus, resources={resource: 1.0} if resource else None,
           include_dashboard=False)


class _SandboxActor:
  """One worker: the branches of a `SandboxHost`, built in the actor's process."""

  def __init__(self, factory: Callable[[], base.Sandbox]):
    self._factory = factory
    self._host = None

  def ready(self) -> tuple[str, int]:
    """Builds the first sandbox (so imports are not charged to a call's timeout); returns this
    actor's node id and process id."""
    self._host = pool_lib.SandboxHost(self._factory, spare=self._factory(),
                                      catch=BaseException)
    return ray.get_runtime_context().get_node_id(), os.getpid()

  def run(self, op: str, branch: Hashable, argument: Any, want_backup: bool):
    return self._host.run(op, branch, argument, want_backup)

  def close_all(self) -> None:
    self._host.close_all()


def death_reason(error: BaseException) -> str:
  """One line from Ray's error for a lost actor: Ray's own sentence "The actor died because
  ..." (or "is dead because"), else the error's first line."""
  text = str(error)
  match = re.search(r"The actor (?:is dead|died) because ([^\n]*?)(?:\.(?=\s|$)|$)", text, re.M)
  if match:
    return f"sandbox actor died because {match.group(1).strip()}"
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  return f"sandbox actor lost: {type(error).__name__}: {lines[0] if lines else ''}"


class _RayWorker:
  """A pool slot's actor and the answers it owes, oldest first (an actor runs its calls in
  order, so only the oldest is waited on)."""

  def __init__(self, actor_class, factory: Callable[[], base.Sandbox], index: int):
    self.index = index
    self.actor = actor_class.remote(factory)
    self.pending: collections.deque = collections.deque()
    self.node_id: str | None = None
    self._pid: int | None = None

  def wait_ready(self, timeout_s: float) -> None:
    """Waits for the actor's first sandbox; raises RuntimeError (one line) if it cannot start."""
    try:
      self.node_id, self._pid = ray.get(self.actor.ready.remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
      self.stop(graceful=False)
      raise RuntimeError(f"sandbox actor {self.index} did not start within {timeout_s:g} s "
                         "(does a node offer the CPUs and the resource it asks for?)") from None
    except ray.exceptions.RayTaskError as error:
      self.stop(graceful=False)
      cause = error.cause if error.cause is not None else error
      raise RuntimeError(f"sandbox actor {self.index} failed to start: the sandbox factory "
                         f"raised {type(cause).__name__}: {cause}") from None
    except ray.exceptions.RayError as error:
      self.stop(graceful=False)
      raise RuntimeError(f"sandbox actor {self.index} failed to start: "
                         f"{death_reason(error)}") from None

  def send(self, batch: list) -> None:
    for message in batch:
      self.pending.append(self.actor.run.remote(*message))

  def pid(self) -> int | None:
    return self._pid

  def stop(self, graceful: bool) -> None:
    if graceful:
      try:
        ray.get(self.actor.close_all.remote(), timeout=5.0)
      except Exception:  # pylint: disable=broad-except
        pass
    try:
      ray.kill(self.actor, no_restart=True)
    except Exception:  # pylint: disable=broad-except
      pass
    self.pending.clear()


class RaySandboxPool(pool_lib.SandboxPool):
  """A `SandboxPool` whose workers are Ray actors; see the module docstring."""

  def __init__(self, factory: Callable[[], base.Sandbox], num_workers: int = 2,
               timeout_s: float = 30.0, start_method: str | None = None,
               keep_backups: bool = True, startup_timeout_s: float = 120.0,
               replace_worker_on_error: bool = True, address: str = "",
               cpus_per_worker: float = 1.0, resource: str = DEFAULT_RESOURCE):
    del start_method  # Ray starts its own worker processes
    if num_workers < 1:
      raise ValueError(f"a Ray pool needs num_workers >= 1, got {num_workers}")
    if not cpus_per_worker > 0:
      raise ValueError(f"cpus_per_worker must be positive, got {cpus_per_worker}")
    self.address = address
    self.cpus_per_worker = float(cpus_per_worker)
    self.resource = resource
    super().__init__(factory, num_workers=num_workers, timeout_s=timeout_s,
                     keep_backups=keep_backups, startup_timeout_s=startup_timeout_s,
                     replace_worker_on_error=replace_worker_on_error)

  def _init_backend(self, start_method: str | None) -> None:
    del start_method
    connect(self.address, self.num_workers, self.cpus_per_worker, self.resource)
    options = dict(num_cpus=self.cpus_per_worker, max_restarts=0, max_concurrency=1,
                   scheduling_strategy="SPREAD")
    if self.resource:
      options["resources"] = {self.resource: RESOURCE_PER_WORKER}
    self._actor_class = ray.remote(_SandboxActor).options(**options)

  def _new_worker(self, index: int) -> _RayWorker:
    return _RayWorker(self._actor_class, self._factory, index)

  def worker_nodes(self) -> list[str | None]:
    """The Ray node id of each worker's actor, by worker index."""
    return [w.node_id for w in self._workers]

  def node_of(self, branch: Hashable) -> str | None:
    """The Ray node id holding `branch` (None if not live)."""
    worker = self.worker_of(branch)
    return None if worker is None else self._workers[worker].node_id

  def _run_workers(self, calls: list[pool_lib._Call]) -> dict[Hashable, Any]:
    """As the process pool's, with each distinct restored snapshot put in the object store
    once for the whole batch."""
    stored = {}  # id of the bytes -> (the bytes, which keeps the id theirs; the object ref)
    for call in calls:
      if call.op == "restore":
        key = id(call.argument.data)
        if key not in stored:
          stored[key] = (call.argument.data, ray.put(call.argument))
        call.argument = stored[key][1]
    return super()._run_workers(calls)

  def _receive_answers(self, round_: pool_lib._Round) -> None:
    """Waits until an actor answers or the earliest deadline passes; handles what came."""
    wait_s = max(0.0, min(round_.deadlines.values()) - time.monotonic())
    oldest = {self._workers[w].pending[0]: w for w in round_.sent}
    ready, rest = ray.wait(list(oldest), num_returns=1, timeout=wait_s)
    if ready and rest:
      ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
    for ref in ready:
      w = oldest[ref]
      worker = self._workers[w]
      if w not in round_.sent or not worker.pending or worker.pending[0] is not ref:
        continue  # that actor was replaced while handling an earlier answer
      worker.pending.popleft()
      try:
        message = ray.get(ref)
      except ray.exceptions.RayError as error:
        self._on_worker_lost(round_, w, death_reason(error))
        continue
      self._on_reply(round_, w, message)
