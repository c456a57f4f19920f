"""The command line the experiment scripts share: `--config=FILE[:ARG]` and its overrides.

run.py, compare.py and grad_variance.py take a config file (`get_config(ARG)`), estimator_demo.py
its own settings, and all of them `--config.a.b=v` overrides through ml_collections' config flag. absl would
answer a bad file or override with a traceback; `parse_config_flags` answers every bad input
with one line, `error: ...`, and exit status 2, before any compute (`parse_flags_over` for a
script's own settings).
"""

import datetime
import importlib.util
import os
import subprocess
import sys

from absl import flags

from bpo_jax.training import config as config_lib

EXIT_INVALID = 2
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message: str):
  """Bad input: one line on stderr, exit status 2."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(EXIT_INVALID)


def refuse_arguments(argv):
  """The scripts take flags only: anything left after parsing is a mistake."""
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")


def config_arg(argv) -> str | None:
  """The FILE[:ARG] of `--config=FILE[:ARG]` (or `--config FILE[:ARG]`) in `argv`, None if absent."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def load_config_file(spec: str):
  """(the configuration `--config=FILE[:ARG]` names, without overrides, None) or (None, why it
  cannot be loaded, in one line)."""
  path, _, arg = spec.partition(":")
  try:
    module_spec = importlib.util.spec_from_file_location("_experiment_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return (module.get_config(arg) if arg else module.get_config()), None
  except Exception as error:  # pylint: disable=broad-except
    return None, f"{type(error).__name__}: {' '.join(str(error).split())}"


def parse_config_flags(argv, config_flag, example: str) -> list[str]:
  """absl's flag parsing of `argv` with `config_flag` (a `DEFINE_config_file`), where a missing
  or unreadable config file, an override of an unknown key or of the wrong type, and any other
  bad flag end the program with one line (`fail`); `example` is the config file the message
  for a missing `--config` suggests."""
  spec = config_arg(argv)
  if spec is None:
    fail(f"--config is required, e.g. --config={example}")
  path = spec.split(":", 1)[0]
  if not os.path.isfile(path):
    fail(f"--config={path}: no such file")
  try:
    rest = flags.FLAGS(argv)
    config_flag.value.keys()  # a config file that failed to load raises here
    return rest
  except Exception as error:  # pylint: disable=broad-except
    config, load_error = load_config_file(spec)
    if config is None:
      fail(f"--config={spec}: the file does not give a configuration ({load_error})")
    _fail_flags(argv, config, error)


def check_overrides(argv, config):
  """Ends the program with one line if an override in `argv` names a key `config` lacks or
  gives a value of the wrong type: for a `DEFINE_config_dict` flag, which applies the overrides
  as it is defined."""
  message = config_lib.describe_override_error(argv, config)
  if message:
    fail(message)


def parse_flags_over(argv, config) -> list[str]:
  """absl's flag parsing of `argv` for a script whose `--config` is `config` itself (a
  `DEFINE_config_dict`), where a bad override or any other bad flag is one line (`fail`)."""
  try:
    return flags.FLAGS(argv)
  except Exception as error:  # pylint: disable=broad-except
    _fail_flags(argv, config, error)


def _fail_flags(argv, config, error: Exception):
  # Not a config override: absl's own message, without its traceback.
  fail(config_lib.describe_override_error(argv, config) or " ".join(str(error).split()))


def provenance(script: str, argv) -> dict:
  """What a result file records of how it was made: the code commit (and whether the package's
  or the experiments' files differed from it, untracked ones included), the command
  (`python experiments/<script> ARGV`), the time."""
  def git(*cmd):
    return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True).stdout.strip()
  return dict(commit=git("rev-parse", "HEAD"),
              code_changes=bool(git("status", "--porcelain", "--", "bpo_jax", "experiments")),
              command=f"python experiments/{script} " + " ".join(argv),
              created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
