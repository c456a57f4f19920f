"""Keeps the README's Quickstart printout true: runs the README's main command and writes (or,
with `--check`, compares) the printed block beneath it.

    python scripts/quickstart_printout.py            # run the command, rewrite the block
    python scripts/quickstart_printout.py --check    # run it, exit 1 if the block differs
    python scripts/quickstart_printout.py --output=FILE [--check]  # use a finished run's stdout

The command is the README line marked `<!-- main-command -->`, its `python ...` part (the
install before `&&` is left to the reader's environment), run from the repository root with its
`--workdir` replaced by a fresh temporary directory, so that no earlier run is resumed. The
block is the first fenced block after that line; it holds the command's `held-out success`
lines. The CPU and wall time of the run are printed (not written: they depend on the machine).
"""

import argparse
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MARKER = "<!-- main-command -->"


def main_command(readme: str) -> list[str]:
  """The argv of the README's main command: the `python ...` part of the marked line."""
  for line in readme.splitlines():
    if line.startswith(MARKER):
      parts = [p.strip() for p in line[len(MARKER):].split("&&")]
      python = [p for p in parts if p.startswith("python ")]
      if python:
        return shlex.split(python[0])
  raise ValueError(f"README.md has no line starting {MARKER!r} with a `python ...` command")


def with_workdir(argv: list[str], workdir: str) -> list[str]:
  """`argv` with its `--workdir=...` replaced by `workdir` (added when absent)."""
  out = [a for a in argv if not a.startswith("--workdir=")]
  return out + [f"--workdir={workdir}"]


def printout(stdout: str) -> str:
  """The lines of a run's stdout that the README shows: its held-out success lines."""
  lines = [line for line in stdout.splitlines() if line.startswith("held-out success")]
  if not lines:
    raise ValueError("the run printed no `held-out success` line")
  return "\n".join(lines)


def replace_block(readme: str, block: str) -> str:
  """`readme` with the first fenced block after the main command holding `block`."""
  start = readme.index(MARKER)
  match = re.compile(r"```\n(.*?)\n```", re.S).search(readme, start)
  if match is None:
    raise ValueError("README.md has no fenced block after its main command")
  return readme[:match.start(1)] + block + readme[match.end(1):]


def run(argv: list[str]) -> str:
  """Runs `argv` from the repository root in a fresh workdir; returns its stdout."""
  with tempfile.TemporaryDirectory() as workdir:
    start = time.time()
    result = subprocess.run(with_workdir(argv, os.path.join(workdir, "run")), cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, check=False)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"ran in {time.time() - start:.0f} s of wall time, "
          f"{cpu.ru_utime + cpu.ru_stime:.0f} s of CPU time", file=sys.stderr)
  if result.returncode != 0:
    raise RuntimeError(f"the main command exited with status {result.returncode}")
  return result.stdout


def main(args) -> int:
  with open(README, encoding="utf-8") as f:
    readme = f.read()
  try:
    argv = main_command(readme)
  except ValueError as e:
    print(f"quickstart_printout: {e}", file=sys.stderr)
    return 2
  if args.output:
    if not os.path.isfile(args.output):
      print(f"quickstart_printout: no such file: {args.output}", file=sys.stderr)
      return 2
    with open(args.output, encoding="utf-8") as f:
      stdout = f.read()
  else:
    stdout = run(argv)
  updated = replace_block(readme, printout(stdout))
  if args.check:
    if updated != readme:
      print("README.md's Quickstart printout differs from the command's: run "
            "`python scripts/quickstart_printout.py`", file=sys.stderr)
      return 1
    return 0
  if updated != readme:
    with open(README + ".tmp", "w", encoding="utf-8") as f:
      f.write(updated)
    os.replace(README + ".tmp", README)
  print(printout(stdout))
  return 0


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare, write nothing")
  parser.add_argument("--output", help="a finished run's stdout instead of running it")
  sys.exit(main(parser.parse_args()))
