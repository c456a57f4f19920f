"""The persistent compilation cache: compiled programs kept on disk between processes.

A run compiles a few heavy programs (the sampler's decode loop and continued prefill, the
update) and many small ones. Every new process (another estimator, another seed, a resume)
would compile them all again; with JAX's persistent cache it reads them back instead.

Where the cache lives, the first that applies:

1. the configuration's `scale.compile_cache_dir`: a directory, or "none" for no cache;
2. JAX's own `JAX_COMPILATION_CACHE_DIR` variable (JAX reads it at import);
3. the user cache directory: `$XDG_CACHE_HOME/bpo_jax/jax`, by default `~/.cache/bpo_jax/jax`.

Every program is cached, however quickly it compiled (JAX's default skips programs that
compiled in under a second, which at a tiny shape is most of them). `enable` must run before
the first compile of the process: JAX decides whether to use the cache once, at its first
compile.
"""

from __future__ import annotations

import os

from absl import logging
import jax

# The value of `scale.compile_cache_dir` that turns the cache off.
OFF = "none"


def default_directory() -> str:
  """The user cache directory for compiled programs: `$XDG_CACHE_HOME/bpo_jax/jax`, or
  `~/.cache/bpo_jax/jax` without XDG_CACHE_HOME."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bpo_jax", "jax")


def resolve_directory(setting: str) -> str | None:
  """The cache directory for a `scale.compile_cache_dir` setting ("" = JAX's variable, else
  the user cache directory; "none" = no cache, None)."""
  if setting == OFF:
    return None
  if setting:
    return os.path.abspath(os.path.expanduser(setting))
  return os.environ.get("JAX_COMPILATION_CACHE_DIR") or default_directory()


def enable(setting: str = "") -> str | None:
  """Turns the persistent cache on at the directory of `setting` (`resolve_directory`), made
  if missing; returns it (None: the cache is off). Call it before the process's first compile.

  Also logs (absl, INFO) every program that took at least `LOG_SECONDS` to compile or to read
  back, with its seconds, once per process."""
  _log_slow_compiles()
  directory = resolve_directory(setting)
  if directory is None:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", directory)
  # Cache every program: at small shapes most compile in well under JAX's 1 s default.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return directory


# Compiles (or cache reads) at least this long are logged with their seconds.
LOG_SECONDS = 0.5
_logging_compiles = []


def _log_slow_compiles() -> None:
  """Registers (once) a listener that logs each slow backend compile request."""
  if _logging_compiles:
    return

  def log(event: str, duration: float, **kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT and duration >= LOG_SECONDS:
      logging.info("compiled %s in %.1f s", kwargs.get("fun_name", "?"), duration)

  jax.monitoring.register_event_duration_secs_listener(log)
  _logging_compiles.append(log)


# JAX's monitoring events: the duration of every backend compile request (a persistent-cache
# hit included) and the requests the persistent cache answered.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class CompileCounter:
  """Counts this process's XLA backend compiles from JAX's monitoring events.

  `requests` are the backend compile requests (`BACKEND_COMPILE_EVENT`, one per program JAX
  did not have in memory), `cache_hits` those the persistent cache answered, and `compiles =
  requests - cache_hits` the programs XLA actually compiled. `seconds[name]` sums the request
  durations per program name (a cache hit's is its read), and `log` lists every request in
  order as (name, seconds). Listeners cannot be removed from
  JAX, so a counter counts from its creation to the end of the process; `snapshot()` and
  differences of it count an interval.
  """

  def __init__(self):
    self.requests = 0
    self.cache_hits = 0
    self.seconds: dict[str, float] = {}
    self.log: list[tuple[str, float]] = []
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    jax.monitoring.register_event_listener(self._on_event)

  def _on_duration(self, event: str, duration: float, **kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
      self.requests += 1
      name = str(kwargs.get("fun_name", "?"))
      self.seconds[name] = self.seconds.get(name, 0.0) + float(duration)
      self.log.append((name, float(duration)))

  def _on_event(self, event: str, **kwargs) -> None:
    del kwargs
    if event == CACHE_HIT_EVENT:
      self.cache_hits += 1

  @property
  def compiles(self) -> int:
    return self.requests - self.cache_hits

  def snapshot(self) -> dict:
    """The counts so far: {"requests", "cache_hits", "compiles"}."""
    return {"requests": self.requests, "cache_hits": self.cache_hits,
            "compiles": self.compiles}
