"""One Python environment per (repository, environment_setup_commit), built once and reused.

SWE-bench runs each instance's tests in an environment built for its repository's version: the
environment is made at the instance's `environment_setup_commit` by the spec's install steps,
and every instance that shares that commit shares it. Here an environment is a virtualenv under
`envs_dir/<owner>__<name>-<commit[:12]>`:

  1. under a lock (`<key>.lock`, flock), so two workers never build it twice;
  2. `python -m venv` with this interpreter (`--system-site-packages` unless the spec says
     `system_site_packages: false`; no pip of its own unless `with_pip: true`);
  3. the spec's `install` steps (shell commands) run with the environment first on PATH
     (`VIRTUAL_ENV` set), in a scratch checkout of `environment_setup_commit` taken from the
     local clone; the checkout is removed afterwards, so nothing of a later commit (a fix, the
     hidden tests) stays where commands can read it;
  4. `.bpo_env.json` written last: its presence is what "built" means; a half-built directory
     (a crashed build) is removed and rebuilt.

The build may use the network (pip); the tests never do: they run confined (no network), with
the environment's `bin` first on PATH, the environment reachable read-only, and the task
directory on PYTHONPATH (installs that need the source, `pip install -e .`, pointed at the
removed checkout; the task directory's files are the ones tested). Repositories whose tests
need compiled extensions built inside the source tree are not supported this way.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Mapping

from bpo_jax.sandboxes.swe import workspace as workspace_lib

MARKER = ".bpo_env.json"
BUILD_TIMEOUT_S = 3600.0


class EnvBuildError(RuntimeError):
  """An environment's install steps failed; the message names the step and its output."""


@dataclasses.dataclass(frozen=True)
class PythonEnv:
  """A built environment: its directory and whether this call built it."""

  path: str
  built_now: bool = False

  @property
  def bin_dir(self) -> str:
    return os.path.join(self.path, "bin")

  def command_env(self, pythonpath: str) -> dict[str, str]:
    """The variables a command needs to use this environment (see confinement.command_env)."""
    return {"PATH": os.pathsep.join([self.bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]),
            "VIRTUAL_ENV": self.path, "PYTHONPATH": pythonpath}


def env_key(repo: str, setup_commit: str) -> str:
  """The environment's directory name: `owner__name-<first 12 hex digits of the commit>`."""
  return f"{repo.replace('/', '__')}-{setup_commit[:12]}"


def env_record(instance: Mapping[str, Any]) -> dict[str, Any]:
  """What identifies an instance's environment: repository, setup commit and install spec."""
  return {"repo": instance["repo"], "environment_setup_commit":
          instance["environment_setup_commit"], "install": list(instance.get("install", [])),
          "system_site_packages": bool(instance.get("system_site_packages", True)),
          "with_pip": bool(instance.get("with_pip", False))}


def _run_step(step: str, cwd: str, env_dir: str, what: str) -> None:
  env = dict(os.environ, VIRTUAL_ENV=env_dir,
             PATH=os.pathsep.join([os.path.join(env_dir, "bin"), os.environ.get("PATH", "")]))
  env.pop("PYTHONHOME", None)
  try:
    proc = subprocess.run(["/bin/sh", "-c", step], cwd=cwd, env=env, capture_output=True,
                          timeout=BUILD_TIMEOUT_S)
  except subprocess.TimeoutExpired as e:
    raise EnvBuildError(f"{what}: install step {step!r} timed out") from e
  if proc.returncode != 0:
    out = (proc.stdout + proc.stderr).decode(errors="replace").strip()[-2000:]
    raise EnvBuildError(f"{what}: install step {step!r} failed ({proc.returncode}): {out}")


def _build(path: str, record: Mapping[str, Any], clone: str) -> None:
  what = f"the environment of {record['repo']} at {record['environment_setup_commit']}"
  args = [sys.executable, "-m", "venv"]
  if record["system_site_packages"]:
    args.append("--system-site-packages")
  if not record["with_pip"]:
    args.append("--without-pip")
  proc = subprocess.run(args + [path], capture_output=True)
  if proc.returncode != 0:
    raise EnvBuildError(f"{what}: venv failed: {proc.stderr.decode(errors='replace').strip()}")
  if record["install"]:
    with tempfile.TemporaryDirectory(prefix="bpo_env_src_") as src:
      try:
        workspace_lib.extract_commit(clone, record["environment_setup_commit"], src)
      except workspace_lib.GitError as e:
        raise EnvBuildError(f"{what}: {e}") from e
      for step in record["install"]:
        _run_step(step, src, path, what)
  with open(os.path.join(path, MARKER + ".tmp"), "w", encoding="utf-8") as f:
    json.dump(record, f, sort_keys=True)
  os.replace(os.path.join(path, MARKER + ".tmp"), os.path.join(path, MARKER))
  # Confined commands run as an unprivileged uid: the environment must be readable by it.
  for dirpath, dirnames, filenames in os.walk(path):
    for name in dirnames + filenames:
      full = os.path.join(dirpath, name)
      if not os.path.islink(full):
        os.chmod(full, os.stat(full).st_mode | (0o555 if os.path.isdir(full) else 0o444))
  os.chmod(path, 0o755)


def _read_marker(path: str) -> dict[str, Any] | None:
  try:
    with open(os.path.join(path, MARKER), encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    return None


def ensure_env(envs_dir: str, instance: Mapping[str, Any], clone: str) -> PythonEnv:
  """The environment of `instance` (a normalized instance with its spec's `install` steps),
  built into `envs_dir` from the clone `clone` unless a build is already there.

  Raises:
    EnvBuildError: the build failed (the half-built directory is removed).
    ValueError: `envs_dir` holds this key built with another install spec.
  """
  record = env_record(instance)
  os.makedirs(envs_dir, exist_ok=True)
  path = os.path.join(os.path.abspath(envs_dir), env_key(record["repo"],
                                                         record["environment_setup_commit"]))
  with open(path + ".lock", "a+") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      found = _read_marker(path)
      if found is not None:
        if found != json.loads(json.dumps(record, sort_keys=True)):
          raise ValueError(f"the environment at {path} was built with another install spec "
                           f"({found['install']}, not {record['install']}); remove it to rebuild")
        return PythonEnv(path, built_now=False)
      shutil.rmtree(path, ignore_errors=True)
      try:
        _build(path, record, clone)
      except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
      return PythonEnv(path, built_now=True)
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
