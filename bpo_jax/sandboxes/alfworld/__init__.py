"""ALFWorld on ALFWorld's own text engine, with a generator of ALFWorld games.

ALFWorld (Shridhar et al., 2021) plays ALFRED household tasks as text. Each game is a directory

    <split>/<task_type>-<Object>-<MovableRecep>-<Parent>-<scene>/<trial>/
        initial_state.pddl   the household layout and the goal, in the ALFRED PDDL domain
        traj_data.json       the task: task_type and pddl_params (object/parent/toggle targets)
        game.tw-pddl         JSON: pddl_domain, grammar (task text filled in), pddl_problem,
                             solvable, walkthrough

and is played by TextWorld's PDDL engine (`textworld.envs.PddlEnv`, a Fast Downward state
machine plus a context-sensitive grammar for the text), with ALFWorld's demangler turning ids such
as `Mug_bar__plus_00_dot_12_...` into names such as `mug 1`. The `alfworld` wheel ships the domain
(`alfred.pddl`) and grammar (`alfred.twl2`); the game files themselves are a separate download, so
this package also *generates* games of all six task types over generated household layouts,
written in the same format, and checks each with ALFWorld's hand-coded expert. Real and generated
game directories load through the same function, `load_game_dir`.

    tasks = make_tasks("train", num=4, seed=0)          # generated, expert-checked
    sb = make_sandbox(max_steps=50)
    obs = sb.reset(tasks[0])                            # "-= Welcome to TextWorld, ALFRED! =- ..."
    sb.admissible_actions()                             # ["go to cabinet 1", ..., "look"]
    step = sb.step("go to countertop 1")
    snap = sb.snapshot(); sb.restore(snap)

Modules, one job each:
  games      the task types, a game directory's files, `AlfworldTask` and `load_game_dir`
  layout     generated households and tasks as ALFRED PDDL problems (initial_state.pddl)
  expert     ALFWorld's hand-coded expert played on the engine (solvability, walkthroughs)
  generator  generated games in ALFWorld's format, kept only if the expert solves them
  tasks      `make_tasks`: ALFWorld's data or generated games, and the options both entry
             points share
  sandbox    `AlfworldSandbox` on the engine, its snapshots, and `make_sandbox`
  engine     the lazy imports of alfworld and textworld, and the engine's process-wide caches
  actions    the action syntax a language model is told, and the parser of its replies
"""

from bpo_jax.sandboxes.alfworld.engine import alfred_logic
# Private, re-exported for the tests and the benchmark (the engine with and without its caches).
from bpo_jax.sandboxes.alfworld.engine import _alfworld, _engine_caches_disabled
from bpo_jax.sandboxes.alfworld.expert import expert_walkthrough
from bpo_jax.sandboxes.alfworld.games import (GAME_FILE, PDDL_FILE, TASK_TYPES, TRAJ_FILE,
                                              AlfworldTask, find_game_dirs, load_game_dir,
                                              task_description)
from bpo_jax.sandboxes.alfworld.generator import generate_game, generate_game_dirs
from bpo_jax.sandboxes.alfworld.layout import LAMP_RECEPTACLES, ROOM_RECEPTACLES, ROOM_SCENES
from bpo_jax.sandboxes.alfworld.sandbox import AlfworldSandbox, make_sandbox
from bpo_jax.sandboxes.alfworld.tasks import (DATA_SPLIT_ALIASES, DATA_SPLITS, GENERATOR_VERSION,
                                              HELD_OUT_SPLITS, SANDBOX_OPTIONS, TASK_OPTIONS,
                                              make_tasks, option_problem)

__all__ = ["DATA_SPLITS", "DATA_SPLIT_ALIASES", "GAME_FILE", "GENERATOR_VERSION",
           "HELD_OUT_SPLITS", "LAMP_RECEPTACLES", "PDDL_FILE", "ROOM_RECEPTACLES", "ROOM_SCENES",
           "SANDBOX_OPTIONS", "TASK_OPTIONS", "TASK_TYPES", "TRAJ_FILE", "AlfworldSandbox",
           "AlfworldTask", "alfred_logic", "expert_walkthrough", "find_game_dirs",
           "generate_game", "generate_game_dirs", "load_game_dir", "make_sandbox", "make_tasks",
           "option_problem", "task_description"]
