"""Generates TextWorld game sets by type and seed, reproducibly.

Writes `<output>/<split>/<type>-s<seed>.z8` (with the `.json` TextWorld needs beside it; the
Inform 7 source `.ni` is deleted). Each game is made by `tw-make` in a child process with
`PYTHONHASHSEED` fixed, because TextWorld's generator iterates over sets and dicts of strings
whose order otherwise changes from run to run.

    python scripts/make_textworld_games.py --output tests/fixtures/textworld_games \
        --type custom --train_seeds 1 2 --test_seeds 3

Types: custom (small: --world_size rooms, --nb_objects, --quest_length), and TextWorld's
challenges tw-simple, tw-coin_collector, tw-treasure_hunter, tw-cooking (with their defaults).
Train and test seeds must not overlap.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

CHALLENGE_ARGS = {
    "tw-simple": ["--rewards", "dense", "--goal", "detailed"],
    "tw-coin_collector": ["--level", "1"],
    "tw-treasure_hunter": ["--level", "1"],
    "tw-cooking": ["--recipe", "1", "--take", "1"],
}


def tw_make_command(game_type: str, seed: int, output: str, args) -> list[str]:
  tw_make = shutil.which("tw-make")
  if tw_make is None:
    raise SystemExit("tw-make not found: pip install 'bpo_jax[textworld]'")
  command = [tw_make, game_type]
  if game_type == "custom":
    command += ["--world-size", str(args.world_size), "--nb-objects", str(args.nb_objects),
                "--quest-length", str(args.quest_length)]
  elif game_type in CHALLENGE_ARGS:
    command += CHALLENGE_ARGS[game_type]
  else:
    raise SystemExit(f"unknown game type {game_type!r}; known: custom, {', '.join(CHALLENGE_ARGS)}")
  return command + ["--seed", str(seed), "--output", output, "-f", "--silent"]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--output", required=True)
  parser.add_argument("--type", default="custom")
  parser.add_argument("--train_seeds", type=int, nargs="*", default=[1, 2])
  parser.add_argument("--test_seeds", type=int, nargs="*", default=[3])
  parser.add_argument("--world_size", type=int, default=2)
  parser.add_argument("--nb_objects", type=int, default=4)
  parser.add_argument("--quest_length", type=int, default=3)
  parser.add_argument("--hash_seed", default="0", help="PYTHONHASHSEED for the generator")
  args = parser.parse_args(argv)
  overlap = set(args.train_seeds) & set(args.test_seeds)
  if overlap:
    raise SystemExit(f"train and test seeds overlap: {sorted(overlap)}")
  env = dict(os.environ, PYTHONHASHSEED=args.hash_seed)
  for split, seeds in (("train", args.train_seeds), ("test", args.test_seeds)):
    folder = os.path.join(args.output, split)
    os.makedirs(folder, exist_ok=True)
    for seed in seeds:
      output = os.path.join(folder, f"{args.type}-s{seed}.z8")
      subprocess.run(tw_make_command(args.type, seed, output, args), env=env, check=True)
      source = os.path.splitext(output)[0] + ".ni"
      if os.path.exists(source):
        os.remove(source)
      print(output, file=sys.stderr)


if __name__ == "__main__":
  main()
