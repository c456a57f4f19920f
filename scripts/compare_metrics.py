"""Whether two runs logged the same metrics, record by record, wall-clock times aside.

A change meant to keep behaviour (a refactoring, a rename) is checked by running the same
configurations before and after it and comparing their metrics.jsonl files:

    python scripts/compare_metrics.py BEFORE AFTER

BEFORE and AFTER are two metrics.jsonl files, two workdirs, or two directories of workdirs
(every `wd_<name>/metrics.jsonl` of BEFORE is compared with AFTER's of the same name). Records
are compared in order; in each, every key both records hold must have the same value, except
the wall-clock ones (`time/...`). A key only one side holds (a metric added in between) is
listed, and is a difference with `--strict_keys`. Prints one line per difference and exits 1
when there is one, 0 otherwise.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

TIME_PREFIX = "time/"
METRICS = "metrics.jsonl"


def read_records(path: str) -> list[dict]:
  """The records of a metrics.jsonl file, in order."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def _timed(key: str) -> bool:
  return key.startswith(TIME_PREFIX)


def compare_records(before: list[dict], after: list[dict]) -> tuple[list[str], set[str]]:
  """(differences, keys one side alone holds) of two runs' records.

  A difference names the record (its index, phase and iteration) and the key with both values;
  timed keys are left out. Example: [{"loss": 1.0, "time/update": 3.0}] against
  [{"loss": 1.0, "time/update": 5.0, "decode_steps": 4}] → ([], {"decode_steps"}).
  """
  differences, one_sided = [], set()
  if len(before) != len(after):
    differences.append(f"{len(before)} records before, {len(after)} after")
  for index, (a, b) in enumerate(zip(before, after)):
    where = f"record {index} ({a.get('phase')}, iteration {a.get('iteration')})"
    one_sided |= {k for k in set(a) ^ set(b) if not _timed(k)}
    for key in sorted(set(a) & set(b)):
      if not _timed(key) and a[key] != b[key]:
        differences.append(f"{where}: {key} {a[key]!r} before, {b[key]!r} after")
  return differences, one_sided


def metric_files(before: str, after: str) -> list[tuple[str, str, str]]:
  """(name, before file, after file) pairs for the two paths (module docstring)."""
  if os.path.isfile(before):
    return [(os.path.basename(before), before, after)]
  if os.path.isfile(os.path.join(before, METRICS)):
    return [(os.path.basename(os.path.normpath(before)), os.path.join(before, METRICS),
             os.path.join(after, METRICS))]
  pairs = []
  for path in sorted(glob.glob(os.path.join(before, "*", METRICS))):
    name = os.path.basename(os.path.dirname(path))
    pairs.append((name, path, os.path.join(after, name, METRICS)))
  return pairs


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("before")
  parser.add_argument("after")
  parser.add_argument("--strict_keys", action="store_true",
                      help="a key only one side holds is a difference")
  args = parser.parse_args(argv)
  pairs = metric_files(args.before, args.after)
  if not pairs:
    print(f"error: no {METRICS} under {args.before!r}", file=sys.stderr)
    return 2
  failed = False
  for name, before, after in pairs:
    if not os.path.exists(after):
      print(f"{name}: no {after}")
      failed = True
      continue
    differences, one_sided = compare_records(read_records(before), read_records(after))
    if args.strict_keys:
      differences += [f"key {k} in one run only" for k in sorted(one_sided)]
    failed |= bool(differences)
    keys = f"; keys in one run only: {', '.join(sorted(one_sided))}" if one_sided else ""
    print(f"{name}: {len(read_records(before))} records, "
          f"{'equal' if not differences else f'{len(differences)} differences'}{keys}")
    for line in differences:
      print(f"  {line}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
