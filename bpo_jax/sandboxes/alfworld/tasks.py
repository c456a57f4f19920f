"""Task sources: ALFWorld's data, or generated games (kept in a cache directory if asked), and
the options that `make_tasks` and `make_sandbox` share."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from typing import Any, Mapping

from bpo_jax.sandboxes.alfworld.games import (TASK_TYPES, TRAJ_FILE, AlfworldTask, _read_json,
                                              find_game_dirs, load_game_dir)
from bpo_jax.sandboxes.alfworld.generator import generate_game_dirs

# Keyword options of make_sandbox and of make_tasks (each accepts, and ignores, the other's).
SANDBOX_OPTIONS = ("max_steps", "max_action_chars", "admissible_commands")
TASK_OPTIONS = ("data_path", "split", "cache_dir", "task_types", "num_distractors",
                "max_expert_steps")
# Bumped whenever the generator's output for the same arguments changes (invalidates caches).
GENERATOR_VERSION = 1
# ALFWorld's data has no "test" split: its held-out games are valid_unseen (unseen rooms) unless
# the option `split` names valid_seen (seen rooms, new trials).
DATA_SPLIT_ALIASES = {"test": "valid_unseen"}
# The splits of ALFWorld's data, and those the option `split` may give the held-out "test".
DATA_SPLITS = ("train", "valid_seen", "valid_unseen")
HELD_OUT_SPLITS = ("valid_seen", "valid_unseen")


def make_tasks(split: str, /, num: int, seed: int, **config) -> list[AlfworldTask]:
  """ALFWorld tasks for `split` (positional only: the option `split` is another thing).

  With `data_path` (an ALFWorld data root such as $ALFWORLD_DATA/json_2.1.1), loads the first
  `num` solvable games of `split` (train, valid_seen, valid_unseen or test) after a seeded
  shuffle (num <= 0: all of them); "test", the run's held-out split, reads the data split that
  the option `split` names (valid_seen or valid_unseen; default valid_unseen, ALFWorld's unseen
  rooms). Without data_path, generates `num` expert-checked games (see `generate_game_dirs`)
  through the same loader; different splits draw from independent seeds, and their task ids
  differ by the split prefix.

  Options: data_path, split (with data_path only), task_types (default: all six),
  num_distractors, max_expert_steps, and cache_dir: keep generated games there (one folder per
  distinct set of arguments) and load them instead of generating again. The sandbox's options
  (max_steps, max_action_chars, admissible_commands) are accepted and ignored.

  Raises:
    FileNotFoundError: a split the data does not have. ValueError: the option `split` without
    data_path, or not a held-out split (each one line).
  """
  _, task_config = _split_options(config)
  data_path = task_config.pop("data_path", None)
  held_out = task_config.pop("split", None)
  cache_dir = task_config.pop("cache_dir", None)
  task_types = tuple(task_config.pop("task_types", TASK_TYPES))
  generator_config = task_config
  if data_path is not None:
    if split == "test" and (held_out or not os.path.isdir(os.path.join(data_path, split))):
      split = held_out or DATA_SPLIT_ALIASES[split]
    if not os.path.isdir(os.path.join(data_path, split)):
      present = [d for d in DATA_SPLITS if os.path.isdir(os.path.join(data_path, d))]
      raise FileNotFoundError(
          f"no ALFWorld data directory for split {split!r} in data_path {data_path!r}; it has "
          f"{', '.join(present) or 'none of ' + ', '.join(DATA_SPLITS)}")
    dirs = [d for d in find_game_dirs(data_path, split)
            if _read_json(d, TRAJ_FILE)["task_type"] in task_types]
    random.Random(seed).shuffle(dirs)
    if num > 0:
      dirs = dirs[:num]
    return [load_game_dir(d, root=data_path) for d in dirs]
  if cache_dir is None:
    with tempfile.TemporaryDirectory() as tmp:
      dirs = generate_game_dirs(tmp, split, num, seed, task_types=task_types, **generator_config)
      return [load_game_dir(d, root=tmp) for d in dirs]
  # Generation is deterministic in its arguments, so a finished run can be kept and reloaded.
  key = json.dumps({"version": GENERATOR_VERSION, "split": split, "num": num, "seed": seed,
                    "task_types": list(task_types),
                    **{k: list(v) if isinstance(v, (list, tuple)) else v
                       for k, v in sorted(generator_config.items())}}, sort_keys=True)
  root = os.path.join(cache_dir, hashlib.sha256(key.encode()).hexdigest()[:16])
  manifest = os.path.join(root, "manifest.json")
  if not os.path.isfile(manifest):
    if os.path.isdir(root):
      shutil.rmtree(root)  # an unfinished earlier run
    dirs = generate_game_dirs(root, split, num, seed, task_types=task_types, **generator_config)
    with open(manifest + ".tmp", "w", encoding="utf-8") as f:
      json.dump({"key": json.loads(key), "games": [os.path.relpath(d, root) for d in dirs]}, f)
    os.replace(manifest + ".tmp", manifest)
  with open(manifest, encoding="utf-8") as f:
    games = json.load(f)["games"]
  return [load_game_dir(os.path.join(root, g), root=root) for g in games]


def option_problem(config: Mapping[str, Any]) -> str | None:
  """One line saying what is wrong with the options `split` and `admissible_commands`, or
  None when they are usable."""
  split = config.get("split")
  if split is not None:
    if split not in HELD_OUT_SPLITS:
      return (f"ALFWorld option split = {split!r}: must be one of {', '.join(HELD_OUT_SPLITS)} "
              "(the data split the held-out tasks come from)")
    if config.get("data_path") is None:
      return (f"ALFWorld option split = {split!r} needs data_path (ALFWorld's data); generated "
              "games have the splits train and test only")
  admissible = config.get("admissible_commands", False)
  if not isinstance(admissible, bool):
    return f"ALFWorld option admissible_commands = {admissible!r}: must be True or False"
  return None


def _split_options(config: Mapping[str, Any]) -> tuple[dict, dict]:
  """Splits one options dict into the sandbox's and the task source's keyword arguments.

  An experiment passes the same options to make_sandbox and make_tasks; each takes its own.
  """
  unknown = sorted(set(config) - set(SANDBOX_OPTIONS) - set(TASK_OPTIONS))
  if unknown:
    raise TypeError(f"unknown ALFWorld options {unknown}; "
                    f"sandbox options: {list(SANDBOX_OPTIONS)}, "
                    f"task options: {list(TASK_OPTIONS)}")
  problem = option_problem(config)
  if problem:
    raise ValueError(problem)
  return ({k: v for k, v in config.items() if k in SANDBOX_OPTIONS},
          {k: v for k, v in config.items() if k in TASK_OPTIONS})
