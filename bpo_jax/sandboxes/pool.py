"""A crash-proof pool of worker processes that hold sandboxes, addressed by branch id.

A *branch* is one live sandbox inside one worker process. The pool runs reset / step / snapshot
/ restore / close on many branches at once: calls to different workers run in parallel, calls
to the same worker run in order. Every call has a timeout.

    pool = SandboxPool.for_environment("rooms", num_workers=2, timeout_s=10.0)
    pool.reset("a", task)                           # -> first observation (str)
    pool.step_many({"a": "go north"})               # -> {"a": Step}
    snap = pool.snapshot("a")                       # -> Snapshot (bytes)
    pool.restore_many({"b": snap, "c": snap})       # forks: new branches, spread over workers
    pool.step_many({"b": "take key", "c": "go west"})
    pool.close("a"); pool.shutdown()

Each result is either the value or a `BranchFailure(branch, op, reason)`. A sandbox that raises,
hangs past `timeout_s` or kills its process (`os._exit`, a segfault) fails its branch, and the
worker is replaced by a fresh process, so the pool keeps its size. (After an exception the old
process still runs, but an exception may leave process-wide state behind, e.g. in an
interpreter's C library; `replace_worker_on_error=False` keeps such workers.) Other branches
that lived in the replaced worker are not lost: with `keep_backups=True` (the default) the pool
keeps each branch's latest snapshot bytes (taken in the worker after every reset, step and
restore) and restores them into the new worker. A failed branch stays failed (later calls on
it return its failure record) until it is reset or restored.

A snapshot taken in one worker restores in any other (snapshots are bytes), so forked siblings
run in parallel on different workers; new branches go to the least-loaded worker.

Workers start with the 'forkserver' method where available, else 'spawn': the parent process
usually runs JAX, where fork() is unsafe. The sandbox factory is pickled to the workers, so it
must be a module-level callable (or a functools.partial of one); `for_environment` builds one
from the environment registry.

Workers say they are ready only after building a first sandbox, so imports are not charged to
any call's timeout (`startup_timeout_s` bounds the start instead).

`num_workers=0` runs the same API in-process (no isolation and no timeouts: a hang hangs the
caller), for the quickstart and fast tests. In-process, in a worker process and in a Ray actor
(`ray_pool.RaySandboxPool`, the same pool with its workers on any node of a Ray cluster) the
calls run through one `SandboxHost`.

`stats()` counts resets, steps, snapshots, restores, closes, failures, replaced workers and
recovered branches.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import multiprocessing
import multiprocessing.connection
import signal
import time
from typing import Any, Callable, Hashable, Iterable, Mapping

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import registry

@dataclasses.dataclass(frozen=True)
class BranchFailure:
  """A call that failed its branch: `op` is the call, `reason` says why."""

  branch: Hashable
  op: str
  reason: str


def _make_from_registry(name: str, config: Mapping[str, Any]) -> base.Sandbox:
  return registry.get_environment(name).make_sandbox(**config)


class SandboxHost:
  """The branches of one worker (a process, a Ray actor, or the caller itself): the one place
  that runs a pool operation on a sandbox.

  `run(op, branch, argument, want_backup)` answers `("ok", result, backup)` or `("error",
  reason, None)`; `backup` is the branch's snapshot bytes after a reset, step or restore when
  asked for. A call that raises drops its branch (its sandbox may be in any state), so a branch
  is never used half-broken. `spare` is a sandbox built ahead (a worker builds one before it
  says it is ready, so imports are not charged to the first call's timeout); it serves the first
  new branch.
  """

  def __init__(self, factory: Callable[[], base.Sandbox], spare: base.Sandbox | None = None,
               catch: type[BaseException] = Exception):
    self.factory = factory
    self.spare = spare
    self.catch = catch  # a worker catches BaseException; the caller's own process, Exception
    self.sandboxes: dict[Hashable, base.Sandbox] = {}

  def run(self, op: str, branch: Hashable, argument: Any, want_backup: bool = False):
    try:
      result = self._apply(op, branch, argument)
      backup = None
      if want_backup and op in ("reset", "step", "restore"):
        backup = self.sandboxes[branch].snapshot().data
      return ("ok", result, backup)
    except self.catch as error:  # pylint: disable=broad-except
      self.drop(branch)
      return ("error", f"{op} raised {type(error).__name__}: {error}", None)

  def _apply(self, op: str, branch: Hashable, argument: Any):
    if op in ("reset", "restore"):
      sandbox = self.sandboxes.get(branch)
      if sandbox is None:
        sandbox, self.spare = (self.spare, None) if self.spare is not None else (
            self.factory(), None)
        self.sandboxes[branch] = sandbox
      return sandbox.reset(argument) if op == "reset" else sandbox.restore(argument)
    if op == "step":
      return self.sandboxes[branch].step(argument)
    if op == "snapshot":
      return base.Snapshot(self.sandboxes[branch].snapshot().data)
    if op == "close":
      sandbox = self.sandboxes.pop(branch, None)
      return sandbox.close() if sandbox is not None else None
    raise ValueError(f"unknown pool operation {op!r}")

  def drop(self, branch: Hashable) -> None:
    """Forgets `branch`, closing its sandbox if it can."""
    sandbox = self.sandboxes.pop(branch, None)
    try:
      if sandbox is not None:
        sandbox.close()
    except self.catch:  # pylint: disable=broad-except
      pass

  def close_all(self) -> None:
    for branch in list(self.sandboxes):
      self.drop(branch)


def _worker_main(conn, factory: Callable[[], base.Sandbox]) -> None:
  """A worker process: runs batches of (op, branch, argument, want_backup) calls until told to
  exit, answering each call as soon as it is done (so the parent can time each call)."""
  try:
    host = SandboxHost(factory, spare=factory(), catch=BaseException)
    conn.send(("ready", None, None))
  except BaseException as error:  # pylint: disable=broad-except
    conn.send(("error", f"the sandbox factory raised {type(error).__name__}: {error}", None))
    return
  while True:
    try:
      batch = conn.recv()
    except (EOFError, OSError, KeyboardInterrupt):
      break
    if batch == "exit":
      break
    for message in batch:
      try:
        conn.send(host.run(*message))
      except BaseException:  # pylint: disable=broad-except
        return


def _exit_reason(process) -> str:
  process.join(timeout=1.0)
  code = process.exitcode
  if code is None:
    return "worker process stopped answering"
  if code < 0:
    try:
      name = signal.Signals(-code).name
    except ValueError:
      name = f"signal {-code}"
    return f"worker process was killed by {name}"
  return f"worker process exited with code {code}"


class _Worker:

  def __init__(self, context, factory, index: int):
    self.index = index
    self.conn, child_conn = context.Pipe(duplex=True)
    self.process = context.Process(target=_worker_main, args=(child_conn, factory), daemon=True,
                                   name=f"sandbox-worker-{index}")
    self.process.start()
    child_conn.close()

  def send(self, batch: list) -> None:
    """Sends a batch of (op, branch, argument, want_backup) calls; raises OSError or ValueError
    if the process cannot take it."""
    self.conn.send(batch)

  def pid(self) -> int:
    return self.process.pid

  def wait_ready(self, timeout_s: float) -> None:
    """Waits for the worker's first message; raises RuntimeError if it fails to start."""
    if not self.conn.poll(timeout_s):
      self.stop(graceful=False)
      raise RuntimeError(f"sandbox worker {self.index} did not start within {timeout_s:g} s")
    try:
      status, message, _ = self.conn.recv()
    except (EOFError, OSError):
      raise RuntimeError(f"sandbox worker {self.index} died while starting: "
                         f"{_exit_reason(self.process)}") from None
    if status != "ready":
      self.stop(graceful=False)
      raise RuntimeError(f"sandbox worker {self.index} failed to start: {message}")

  def stop(self, graceful: bool) -> None:
    if graceful and self.process.is_alive():
      try:
        self.conn.send("exit")
        self.process.join(timeout=2.0)
      except (OSError, ValueError):
        pass
    if self.process.is_alive():
      self.process.kill()
      self.process.join(timeout=5.0)
    self.conn.close()


@dataclasses.dataclass
class _Call:
  branch: Hashable
  op: str
  argument: Any
  internal: bool = False  # a recovery restore, not answered to the caller


@dataclasses.dataclass
class _Round:
  """The bookkeeping of one `SandboxPool._run_workers` call, by worker index."""

  results: dict[Hashable, Any] = dataclasses.field(default_factory=dict)
  queues: dict[int, collections.deque] = dataclasses.field(  # calls not yet sent
      default_factory=lambda: collections.defaultdict(collections.deque))
  sent: dict[int, collections.deque] = dataclasses.field(  # sent, not yet answered, in order
      default_factory=dict)
  deadlines: dict[int, float] = dataclasses.field(  # when the oldest sent call times out
      default_factory=dict)


class SandboxPool:
  """Branches of sandboxes in worker processes; see the module docstring."""

  def __init__(self, factory: Callable[[], base.Sandbox], num_workers: int = 2,
               timeout_s: float = 30.0, start_method: str | None = None,
               keep_backups: bool = True, startup_timeout_s: float = 120.0,
               replace_worker_on_error: bool = True):
    if num_workers < 0:
      raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if not timeout_s > 0:
      raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if not callable(factory):
      raise TypeError(f"factory must be callable, got {type(factory).__name__}")
    self._factory = factory
    self.num_workers = num_workers
    self.timeout_s = float(timeout_s)
    self.keep_backups = keep_backups
    self.startup_timeout_s = float(startup_timeout_s)
    self.replace_worker_on_error = replace_worker_on_error
    self._counts = collections.Counter()
    self._location: dict[Hashable, int] = {}     # branch -> worker index
    self._backups: dict[Hashable, bytes] = {}
    self.failures: dict[Hashable, BranchFailure] = {}
    self._local = SandboxHost(factory)  # the branches of the in-process mode
    self._workers: list = []
    if num_workers:
      self._init_backend(start_method)
      self._start_workers()

  def _init_backend(self, start_method: str | None) -> None:
    """What starting a worker needs: the multiprocessing context."""
    if start_method is None:
      methods = multiprocessing.get_all_start_methods()
      start_method = "forkserver" if "forkserver" in methods else "spawn"
    if start_method == "fork":
      raise ValueError("start_method 'fork' is unsafe in a process running JAX; "
                       "use 'forkserver' or 'spawn'")
    self._context = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
      # Workers fork from a server that has imported this package once (which imports jax,
      # seconds on a busy machine), so starting or replacing a worker costs milliseconds.
      # This only takes effect if the server is not running yet.
      self._context.set_forkserver_preload([__name__])

  def _start_workers(self) -> None:
    """Starts every worker at once, then waits for each to be ready."""
    self._workers = [self._new_worker(i) for i in range(self.num_workers)]
    try:
      for worker in self._workers:
        worker.wait_ready(self.startup_timeout_s)
    except Exception:
      self.shutdown()
      raise

  def _new_worker(self, index: int):
    """A started (not yet ready) worker in slot `index`."""
    return _Worker(self._context, self._factory, index)

  @classmethod
  def for_environment(cls, name: str, num_workers: int = 2, timeout_s: float = 30.0,
                      start_method: str | None = None, keep_backups: bool = True,
                      replace_worker_on_error: bool = True,
                      backend_options: Mapping[str, Any] | None = None,
                      **config) -> "SandboxPool":
    """A pool whose workers build sandboxes with `registry.get_environment(name)`; `config`
    goes to the sandbox, `backend_options` to the pool's class (e.g. a Ray pool's address)."""
    registry.get_environment(name)  # fail early, in the caller, on an unknown name
    factory = functools.partial(_make_from_registry, name, dict(config))
    return cls(factory, num_workers=num_workers, timeout_s=timeout_s,
               start_method=start_method, keep_backups=keep_backups,
               replace_worker_on_error=replace_worker_on_error, **dict(backend_options or {}))

  # --------------------------------------------------------------------------- introspection

  def stats(self) -> dict[str, int]:
    """Counters: resets, steps, snapshots, restores, closes, failures, replaced_workers,
    recovered_branches."""
    keys = ("resets", "steps", "snapshots", "restores", "closes", "failures",
            "replaced_workers", "recovered_branches")
    return {k: self._counts[k] for k in keys}

  def branches(self) -> list[Hashable]:
    """Live branches."""
    return list(self._local.sandboxes) if not self._workers else list(self._location)

  def worker_of(self, branch: Hashable) -> int | None:
    """The index of the worker holding `branch` (None in-process or if not live)."""
    return self._location.get(branch)

  def worker_pids(self) -> list[int]:
    return [w.pid() for w in self._workers]

  # --------------------------------------------------------------------------- public calls

  def reset(self, branch: Hashable, task: Any) -> str | BranchFailure:
    return self.reset_many({branch: task})[branch]

  def step(self, branch: Hashable, action: Any) -> base.Step | BranchFailure:
    return self.step_many({branch: action})[branch]

  def snapshot(self, branch: Hashable) -> base.Snapshot | BranchFailure:
    return self.snapshot_many([branch])[branch]

  def restore(self, branch: Hashable, snapshot: base.Snapshot) -> None | BranchFailure:
    return self.restore_many({branch: snapshot})[branch]

  def close(self, branch: Hashable) -> None | BranchFailure:
    return self.close_many([branch])[branch]

  def reset_many(self, tasks: Mapping[Hashable, Any]) -> dict[Hashable, str | BranchFailure]:
    """Resets (creating where new) each branch to its task; returns first observations."""
    return self._dispatch([_Call(b, "reset", t) for b, t in tasks.items()], create=True)

  def step_many(self, actions: Mapping[Hashable, Any]
                ) -> dict[Hashable, base.Step | BranchFailure]:
    """Takes one action in each branch; branches in different workers step in parallel."""
    return self._dispatch([_Call(b, "step", a) for b, a in actions.items()])

  def snapshot_many(self, branches: Iterable[Hashable]
                    ) -> dict[Hashable, base.Snapshot | BranchFailure]:
    return self._dispatch([_Call(b, "snapshot", None) for b in branches])

  def restore_many(self, snapshots: Mapping[Hashable, base.Snapshot]
                   ) -> dict[Hashable, None | BranchFailure]:
    """Restores each snapshot into its branch, creating new branches on the least-loaded
    workers (so forks of one snapshot spread over the workers)."""
    for branch, snapshot in snapshots.items():
      if not isinstance(snapshot, base.Snapshot):
        raise TypeError(f"restore of branch {branch!r} needs a Snapshot, "
                        f"got {type(snapshot).__name__}")
    calls = [_Call(b, "restore", base.Snapshot(s.data)) for b, s in snapshots.items()]
    return self._dispatch(calls, create=True)

  def fork(self, source: Hashable, new_branches: Iterable[Hashable]
           ) -> dict[Hashable, None | BranchFailure]:
    """Snapshots `source` and restores it into each new branch."""
    snapshot = self.snapshot(source)
    new_branches = list(new_branches)
    if isinstance(snapshot, BranchFailure):
      return {b: snapshot for b in new_branches}
    return self.restore_many({b: snapshot for b in new_branches})

  def close_many(self, branches: Iterable[Hashable]) -> dict[Hashable, None | BranchFailure]:
    branches = list(branches)
    results = self._dispatch([_Call(b, "close", None) for b in branches])
    for b in branches:
      self._location.pop(b, None)
      self._backups.pop(b, None)
      self._local.drop(b)
      self.failures.pop(b, None)
    return results

  def shutdown(self) -> None:
    """Stops every worker and forgets every branch."""
    self._local.close_all()
    for worker in self._workers:
      worker.stop(graceful=True)
    self._workers = []
    self._location.clear()
    self._backups.clear()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.shutdown()

  def __del__(self):
    try:
      self.shutdown()
    except Exception:  # pylint: disable=broad-except
      pass

  # --------------------------------------------------------------------------- machinery

  def _check_calls(self, calls: list[_Call], create: bool):
    seen = set()
    for call in calls:
      if call.branch in seen:
        raise ValueError(f"branch {call.branch!r} appears twice in one call")
      seen.add(call.branch)
      live = call.branch in (self._location if self._workers else self._local.sandboxes)
      if not create and not live and call.branch not in self.failures and call.op != "close":
        raise KeyError(f"unknown branch {call.branch!r}: reset or restore it first")

  def _fail(self, call: _Call, reason: str) -> BranchFailure:
    failure = BranchFailure(call.branch, call.op, reason)
    self.failures[call.branch] = failure
    self._location.pop(call.branch, None)
    self._backups.pop(call.branch, None)
    self._local.drop(call.branch)
    self._counts["failures"] += 1
    return failure

  def _count(self, op: str):
    self._counts[{"reset": "resets", "step": "steps", "snapshot": "snapshots",
                  "restore": "restores", "close": "closes"}[op]] += 1

  def _dispatch(self, calls: list[_Call], create: bool = False) -> dict[Hashable, Any]:
    self._check_calls(calls, create)
    results: dict[Hashable, Any] = {}
    runnable = []
    for call in calls:
      if create:
        self.failures.pop(call.branch, None)
      elif call.branch in self.failures and call.op != "close":
        results[call.branch] = self.failures[call.branch]
        continue
      runnable.append(call)
    if not self._workers:
      if self.num_workers:
        raise RuntimeError("the pool has been shut down")
      results.update(self._run_local(runnable))
    else:
      results.update(self._run_workers(runnable))
    return {call.branch: results[call.branch] for call in calls}

  def _run_local(self, calls: list[_Call]) -> dict[Hashable, Any]:
    results = {}
    for call in calls:
      status, value, _ = self._local.run(call.op, call.branch, call.argument)
      if status == "ok":
        self._count(call.op)
        results[call.branch] = value
      else:
        results[call.branch] = self._fail(call, value)
    return results

  def _least_loaded_worker(self) -> int:
    load = collections.Counter(self._location.values())
    return min(range(len(self._workers)), key=lambda w: (load[w], w))

  def _run_workers(self, calls: list[_Call]) -> dict[Hashable, Any]:
    """Sends each worker its calls as one batch and collects the answers one by one.

    One message per worker per batch (not per call) keeps the cost of a round low on a busy
    machine, where every message waits to be scheduled. Each call gets `timeout_s` from the
    moment the worker could start it (the previous answer, or the send).
    """
    round_ = _Round()
    for call in calls:
      worker = self._location.get(call.branch)
      if worker is None:
        if call.op == "close":
          continue
        worker = self._least_loaded_worker()
        self._location[call.branch] = worker  # placement counts for the next call's load
      round_.queues[worker].append(call)
    round_.results.update({c.branch: None for c in calls if c.op == "close"})
    for w in list(round_.queues):
      self._send_queued(round_, w)
    while round_.sent:
      self._receive_answers(round_)
      self._expire_calls(round_)
    return round_.results

  def _send_queued(self, round_: _Round, w: int) -> None:
    """Sends worker `w` its queued calls as one message (answering those of failed branches)."""
    batch = []
    while round_.queues[w]:
      call = round_.queues[w].popleft()
      if not call.internal and call.branch in self.failures:
        round_.results[call.branch] = self.failures[call.branch]
        continue
      batch.append(call)
    if not batch:
      return
    waiting = round_.sent.setdefault(w, collections.deque())
    if not waiting:
      round_.deadlines[w] = time.monotonic() + self.timeout_s
    waiting.extend(batch)
    messages = [(c.op, c.branch, c.argument,
                 self.keep_backups and c.op in ("reset", "step", "restore")) for c in batch]
    try:
      self._workers[w].send(messages)
    except (OSError, ValueError) as error:
      self._on_worker_lost(round_, w, f"could not send to worker: {error}")

  def _receive_answers(self, round_: _Round) -> None:
    """Waits until an answer comes or the earliest deadline passes; handles what came."""
    wait_s = max(0.0, min(round_.deadlines.values()) - time.monotonic())
    conns = {self._workers[w].conn: w for w in round_.sent}
    ready = multiprocessing.connection.wait(list(conns), timeout=wait_s)
    for conn in ready:
      w = conns[conn]
      if w not in round_.sent or self._workers[w].conn is not conn:
        continue  # that worker was replaced while handling an earlier answer
      try:
        message = conn.recv()
      except (EOFError, OSError):
        self._on_worker_lost(round_, w, _exit_reason(self._workers[w].process))
        continue
      self._on_reply(round_, w, message)

  def _expire_calls(self, round_: _Round) -> None:
    """Fails the oldest unanswered call of every worker past its deadline."""
    now = time.monotonic()
    for w in [w for w, deadline in round_.deadlines.items() if deadline <= now]:
      if w in round_.sent and round_.deadlines.get(w, now + 1) <= now:
        self._on_worker_lost(round_, w,
                             f"{round_.sent[w][0].op} timed out after {self.timeout_s:g} s")

  def _on_worker_lost(self, round_: _Round, w: int, reason: str) -> None:
    """Fails worker `w`'s oldest unanswered call with `reason` and replaces the worker."""
    call = round_.sent[w].popleft()
    failure = self._fail(call, reason)
    if not call.internal:
      round_.results[call.branch] = failure
    self._restart(round_, w)

  def _restart(self, round_: _Round, w: int) -> None:
    # The calls sent after the failed one go to the replacement, after the recoveries. If the
    # old worker already ran some of them, running them again from the backups gives the
    # same answers: the backups are the states those calls started from.
    waiting = round_.sent.pop(w, collections.deque())
    round_.deadlines.pop(w, None)
    round_.queues[w].extendleft(reversed(waiting))
    started = time.monotonic()
    self._replace_worker(w, round_.queues[w], round_.results)
    # The other workers' calls are not charged for the time spent starting the replacement
    # (milliseconds for a forked process, seconds for a Ray actor).
    for other in round_.deadlines:
      round_.deadlines[other] += time.monotonic() - started
    self._send_queued(round_, w)

  def _on_reply(self, round_: _Round, w: int, message) -> None:
    """Records worker `w`'s answer to its oldest unanswered call."""
    waiting = round_.sent[w]
    call = waiting.popleft()
    if waiting:
      round_.deadlines[w] = time.monotonic() + self.timeout_s
    else:
      del round_.sent[w], round_.deadlines[w]
    status, value, backup = message
    if call.branch in self.failures and call.op not in ("reset", "restore"):
      # Its recovery failed earlier in this batch; keep that reason.
      if not call.internal:
        round_.results[call.branch] = self.failures[call.branch]
      return
    if status == "ok":
      if not call.internal:
        self._count(call.op)
      if backup is not None:
        self._backups[call.branch] = backup
      if call.internal:
        self._counts["recovered_branches"] += 1
      else:
        round_.results[call.branch] = value
    else:
      failure = self._fail(call, value)
      if not call.internal:
        round_.results[call.branch] = failure
      if self.replace_worker_on_error:
        self._restart(round_, w)

  def _replace_worker(self, w: int, queue: collections.deque, results: dict) -> None:
    """Swaps worker `w` for a fresh process and queues the recovery of its other branches."""
    self._workers[w].stop(graceful=False)
    self._workers[w] = self._new_worker(w)
    self._workers[w].wait_ready(self.startup_timeout_s)
    self._counts["replaced_workers"] += 1
    recoveries = []
    for branch, location in list(self._location.items()):
      if location != w or branch in self.failures:
        continue
      backup = self._backups.get(branch)
      if backup is None:
        # Either never created yet (its call is still queued) or lost with the process.
        if any(c.branch == branch and c.op in ("reset", "restore") for c in queue):
          continue
        failure = self._fail(_Call(branch, "recover", None),
                             "lost with its worker process (no backup snapshot)")
        if branch in results or any(c.branch == branch for c in queue):
          results[branch] = failure
        continue
      recoveries.append(_Call(branch, "restore", base.Snapshot(backup), internal=True))
    queue.extendleft(reversed(recoveries))
