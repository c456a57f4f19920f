"""The generator: ALFWorld games of all six task types, written in ALFWorld's game format.

`generate_game` draws a household and a task (`layout.py`) and writes the three files of its
game directory; `generate_game_dirs` keeps only games ALFWorld's hand-coded expert solves
(`expert.py`), storing its commands as the game's walkthrough.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from typing import Sequence

from bpo_jax.sandboxes.alfworld.engine import alfred_logic
from bpo_jax.sandboxes.alfworld.expert import expert_walkthrough
from bpo_jax.sandboxes.alfworld.games import (GAME_FILE, PDDL_FILE, TASK_TYPES, TRAJ_FILE,
                                              task_description)
from bpo_jax.sandboxes.alfworld.layout import ROOM_SCENES, _layout_problem


def generate_game(rng: random.Random, task_type: str, trial: str, num_distractors=(6, 14)) -> dict:
  """Draws one game of `task_type`; returns its three files as {file name: text} plus its path.

  The path is "<task_type>-<Object>-None-<Parent or Toggle>-<scene>/<trial>", ALFWorld's layout.
  The game is not yet checked by the expert (see `generate_game_dirs`).
  """
  if task_type not in TASK_TYPES:
    raise ValueError(f"task_type {task_type!r} is not one of {TASK_TYPES}")
  for _ in range(1000):
    drawn = _layout_problem(rng, task_type, f"plan_{trial}", num_distractors)
    if drawn is not None:
      break
  else:
    raise RuntimeError(f"could not draw a layout for {task_type}")
  problem, params, room = drawn
  scene_num = ROOM_SCENES[room] + rng.randint(1, 30)
  traj = {
      "task_id": trial,
      "task_type": task_type,
      "pddl_params": params,
      "scene": {"floor_plan": f"FloorPlan{scene_num}", "scene_num": scene_num,
                "random_seed": rng.getrandbits(32), "init_action": {}, "object_poses": [],
                "object_toggles": [], "dirty_and_empty": False},
      "turk_annotations": {"anns": []},
      "plan": {"high_pddl": [], "low_actions": []},
      "images": [],
  }
  traj["turk_annotations"]["anns"].append(
      {"task_desc": task_description(traj, rng.randrange(2)), "high_descs": [], "votes": []})
  domain, grammar = alfred_logic()
  grammar = grammar.replace("UNKNOWN GOAL", traj["turk_annotations"]["anns"][0]["task_desc"])
  game = {"pddl_domain": domain, "grammar": grammar, "pddl_problem": problem, "solvable": None,
          "walkthrough": None}
  slot4 = params["parent_target"] or params["toggle_target"] or "None"
  task_dir = f"{task_type}-{params['object_target']}-None-{slot4}-{scene_num}"
  return {"path": f"{task_dir}/{trial}", PDDL_FILE: problem, TRAJ_FILE: json.dumps(traj, indent=2),
          GAME_FILE: game}


def _trial_name(rng: random.Random) -> str:
  # ALFRED trial ids read "trial_T<date>_<time>_<micros>"; ours are drawn, not dated.
  return "trial_T%08d_%06d_%06d" % (rng.randrange(10**8), rng.randrange(10**6),
                                    rng.randrange(10**6))


def _split_seed(split: str, seed: int) -> int:
  return int.from_bytes(hashlib.sha256(f"alfworld/{split}/{seed}".encode()).digest()[:8], "little")


def generate_game_dirs(out_dir: str, split: str, num: int, seed: int,
                       task_types: Sequence[str] = TASK_TYPES, num_distractors=(6, 14),
                       max_expert_steps: int = 150) -> list[str]:
  """Writes `num` expert-solved games to `out_dir/split/...` in ALFWorld's format.

  Task types cycle through `task_types` so that every type appears once `num >= len(task_types)`.
  Each drawn game is played by ALFWorld's hand-coded expert; a game the expert cannot solve is
  discarded and redrawn, and every written game.tw-pddl carries `solvable: true` and the expert's
  `walkthrough`, as ALFWorld's own generated files do. Deterministic in (split, num, seed, ...).

  Returns the written game directories, in generation order.
  """
  if num < 0:
    raise ValueError(f"num must be >= 0, got {num}")
  bad = [t for t in task_types if t not in TASK_TYPES]
  if bad or not task_types:
    raise ValueError(f"task_types must be a non-empty subset of {TASK_TYPES}, "
                     f"got {list(task_types)}")
  rng = random.Random(_split_seed(split, seed))
  written = []
  for i in range(num):
    task_type = task_types[i % len(task_types)]
    for attempt in range(20):
      files = generate_game(rng, task_type, _trial_name(rng), num_distractors)
      game_dir = os.path.join(out_dir, split, files["path"])
      os.makedirs(game_dir, exist_ok=True)
      for name in (PDDL_FILE, TRAJ_FILE):
        with open(os.path.join(game_dir, name), "w", encoding="utf-8") as f:
          f.write(files[name])
      game = files[GAME_FILE]
      with open(os.path.join(game_dir, GAME_FILE), "w", encoding="utf-8") as f:
        json.dump(game, f)
      walkthrough = expert_walkthrough(game_dir, max_steps=max_expert_steps,
                                       seed=rng.getrandbits(32))
      if walkthrough is not None:
        game["solvable"] = True
        game["walkthrough"] = walkthrough
        with open(os.path.join(game_dir, GAME_FILE), "w", encoding="utf-8") as f:
          json.dump(game, f)
        written.append(game_dir)
        break
      shutil.rmtree(game_dir)
      task_dir = os.path.dirname(game_dir)
      if not os.listdir(task_dir):
        os.rmdir(task_dir)
    else:
      raise RuntimeError(f"the expert failed 20 drawn {task_type} games in a row")
  return written
