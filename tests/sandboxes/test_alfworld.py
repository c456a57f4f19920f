"""ALFWorld on its own text engine: generated games of all six types are solved by the engine's
expert, a directory in ALFWorld's game format loads, and forks from a snapshot replay
byte-identically, in this process and in a worker process."""

import hashlib
import json
import os
import pickle
import random
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("alfworld", reason="the alfworld extra is not installed")

from bpo_jax.sandboxes import alfworld  # noqa: E402
from bpo_jax.sandboxes import base  # noqa: E402
from bpo_jax.sandboxes import pool as pool_lib  # noqa: E402

DATA_ROOT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "alfworld",
                         "json_2.1.1")
FIXTURE_ID = ("valid_seen/pick_clean_then_place_in_recep-Egg-None-CounterTop-408/"
              "trial_T38850243_110472_331023")


@pytest.fixture(scope="module")
def generated():
  # One game of each type, with few distractors to keep the engine's grounding quick.
  return alfworld.make_tasks("train", 6, seed=1, num_distractors=(2, 5))


@pytest.fixture(scope="module")
def sandbox():
  sb = alfworld.make_sandbox(max_steps=200)
  yield sb
  sb.close()


def _play(sb, task, commands):
  sb.reset(task)
  return [sb.step(c) for c in commands]


@pytest.mark.slow
def test_all_six_types_are_generated_and_the_expert_solves_each(generated, sandbox):
  assert sorted(t.task_type for t in generated) == sorted(alfworld.TASK_TYPES)
  for task in generated:
    game = task.game_data
    params = task.pddl_params
    assert game["solvable"] is True and game["walkthrough"] == task.walkthrough
    assert "(:domain alfred)" in game["pddl_problem"]
    # ALFWorld's directory layout: <split>/<type>-<Object>-None-<Parent or Toggle>-<scene>/<trial>.
    split, task_dir, trial = task.task_id.split("/")
    kind, obj, mrecep, parent, scene = task_dir.split("-")
    assert (split, kind, obj, mrecep) == ("train", task.task_type, params["object_target"], "None")
    assert parent == (params["toggle_target"] or params["parent_target"])
    assert trial.startswith("trial_T")
    first = sandbox.reset(task)
    assert first.startswith("-= Welcome to TextWorld, ALFRED! =-")
    traj = json.loads(task.traj_data)
    assert any(f"Your task is to: {alfworld.task_description(traj, i)}." in first for i in (0, 1))
    assert params["object_target"].lower() in first.split("Your task is to:")[1]
    steps = [sandbox.step(c) for c in task.walkthrough]
    # The goal holds only after the expert's last command: reward 1 exactly once, at the end.
    assert [s.reward for s in steps] == [0.0] * (len(steps) - 1) + [1.0]
    assert [s.done for s in steps] == [False] * (len(steps) - 1) + [True]
    assert steps[-1].info["success"] is True and not steps[-1].truncated
    assert all("Nothing happens" not in s.observation for s in steps)


_DIGEST_OF_GAMES = """
import hashlib, json, random, sys
from bpo_jax.sandboxes import alfworld
games = [alfworld.generate_game(random.Random(11), t, "trial_T0") for t in alfworld.TASK_TYPES]
print(hashlib.sha256(json.dumps(games, sort_keys=True).encode()).hexdigest())
"""


@pytest.mark.slow
def test_generation_is_deterministic_across_processes_and_seeds_differ():
  for task_type in alfworld.TASK_TYPES:
    a = alfworld.generate_game(random.Random(11), task_type, "trial_T0")
    c = alfworld.generate_game(random.Random(12), task_type, "trial_T0")
    assert a == alfworld.generate_game(random.Random(11), task_type, "trial_T0")
    assert a[alfworld.PDDL_FILE] != c[alfworld.PDDL_FILE]
  # Same games in interpreters with other string-hash seeds (set order must not leak in).
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  hash_seed = "1" if os.environ.get("PYTHONHASHSEED") == "0" else "0"
  env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=root)
  there = subprocess.run([sys.executable, "-c", _DIGEST_OF_GAMES], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
  here = [alfworld.generate_game(random.Random(11), t, "trial_T0") for t in alfworld.TASK_TYPES]
  assert hashlib.sha256(json.dumps(here, sort_keys=True).encode()).hexdigest() == there
  with pytest.raises(ValueError, match="task_type 'make_coffee'"):
    alfworld.generate_game(random.Random(0), "make_coffee", "trial_T0")
  with pytest.raises(ValueError, match="task_types"):
    alfworld.make_tasks("train", 1, 0, task_types=["make_coffee"])


def test_generated_games_are_kept_in_the_cache_dir_and_reloaded(tmp_path, monkeypatch):
  config = dict(cache_dir=str(tmp_path), task_types=["pick_cool_then_place_in_recep"],
                num_distractors=(1, 2), max_steps=9)
  first = alfworld.make_tasks("test", 1, 3, **config)
  (folder,) = os.listdir(tmp_path)
  assert os.path.isfile(tmp_path / folder / "manifest.json")

  def no_generation(*args, **kwargs):
    raise AssertionError("generated again instead of loading the cache")

  monkeypatch.setattr(alfworld.tasks, "generate_game_dirs", no_generation)
  again = alfworld.make_tasks("test", 1, 3, **config)
  assert again == first and again[0].task_id.startswith("test/pick_cool_then_place_in_recep-")


def test_a_directory_in_alfworld_game_format_loads(tmp_path):
  task = alfworld.load_game_dir(os.path.join(DATA_ROOT, FIXTURE_ID))
  assert task.task_id == FIXTURE_ID and task.task_type == "pick_clean_then_place_in_recep"
  # The loader ALFWorld's own data goes through: find solvable games under <root>/<split>.
  assert alfworld.make_tasks("valid_seen", 0, 0, data_path=DATA_ROOT) == [task]
  sb = alfworld.make_sandbox()
  steps = _play(sb, task, task.walkthrough)
  assert steps[-1].info["success"] and steps[-1].reward == 1.0
  assert steps[-3].observation == "You clean the egg 1 using the sinkbasin 2."
  # A game file written before its task text was filled in (alfworld-generate's input).
  raw = tmp_path / "valid_seen" / "pick_x" / "trial_T1"
  shutil.copytree(os.path.join(DATA_ROOT, FIXTURE_ID), raw)
  game = json.loads((raw / alfworld.GAME_FILE).read_text())
  goal = "Your task is to: clean some egg and put it in countertop."
  assert goal in game["grammar"]
  game["grammar"] = game["grammar"].replace(goal, "Your task is to: UNKNOWN GOAL.")
  (raw / alfworld.GAME_FILE).write_text(json.dumps(game))
  filled = alfworld.load_game_dir(str(raw))
  assert filled.task_id == "valid_seen/pick_x/trial_T1"
  # Filled from traj_data with the first template, as ALFWorld's templates read.
  assert "Your task is to: put a clean egg in countertop." in sb.reset(filled)
  # Errors name what is wrong.
  (raw / alfworld.GAME_FILE).unlink()
  with pytest.raises(FileNotFoundError, match="no game.tw-pddl"):
    alfworld.load_game_dir(str(raw))
  with pytest.raises(FileNotFoundError, match="no ALFWorld data directory"):
    alfworld.make_tasks("valid_unseen", 1, 0, data_path=DATA_ROOT)
  sb.close()


def _forks(generated):
  """A mid-game state of the clean task and three different actions to fork there."""
  task = next(t for t in generated if t.task_type == "pick_clean_then_place_in_recep")
  prefix = task.walkthrough[:len(task.walkthrough) // 2]
  tail = ["look", "inventory", task.walkthrough[len(prefix)]]
  return task, prefix, tail


def test_three_forks_from_one_snapshot_replay_byte_identically(generated, sandbox):
  task, prefix, tail = _forks(generated)
  _play(sandbox, task, prefix)
  # Turns that move nothing are part of the state too (they count towards max_steps).
  assert sandbox.step("fly to the moon").observation == "Nothing happens."
  assert "invalid_action" in sandbox.step("").info
  admissible, plan = sandbox.admissible_actions(), sandbox.expert_actions()
  snap = sandbox.snapshot()
  forks = [[a] + tail for a in (admissible[0], admissible[len(admissible) // 2], admissible[-1])]
  assert len({f[0] for f in forks}) == 3
  first = [base.replay(sandbox, snap, f) for f in forks]
  assert len({s[0].observation for s in first}) == 3  # the forks really differ
  fresh = alfworld.make_sandbox(max_steps=200)
  portable = pickle.loads(pickle.dumps(snap))
  assert portable.handle is None and portable == snap
  fresh.restore(portable)
  assert (fresh.admissible_actions(), fresh.expert_actions()) == (admissible, plan)
  assert fresh.snapshot() == snap  # same bytes: same game, commands, turns and observation
  for fork, steps in zip(forks, first):
    # Again in this sandbox (engine-state restore, no replay) ...
    assert base.first_divergence(steps, base.replay(sandbox, snap, fork)) is None
    # ... and from the bytes alone in another sandbox (the portable path: replay).
    assert base.first_divergence(steps, base.replay(fresh, portable, fork)) is None
  fresh.close()
  sandbox.restore(snap)
  assert sandbox.admissible_actions() == admissible
  # The same path played from reset gives the same steps as the fork from the snapshot.
  again = _play(sandbox, task, prefix + forks[1])[len(prefix):]
  assert base.first_divergence(first[1], again) is None


@pytest.mark.slow
def test_forks_restore_byte_identically_in_another_process(generated, sandbox):
  task, prefix, tail = _forks(generated)
  other = next(t for t in generated if t.task_type == "look_at_obj_in_light")
  _play(sandbox, task, prefix)
  snap = sandbox.snapshot()
  admissible = sandbox.admissible_actions()
  forks = {f"b{i}": [a] + tail for i, a in enumerate(admissible[:3])}
  expected = {b: base.replay(sandbox, snap, f) for b, f in forks.items()}
  with pool_lib.SandboxPool.for_environment("alfworld", num_workers=1, timeout_s=60.0,
                                            max_steps=200) as pool:
    # The worker's sandbox first plays another game, so the restore must bring the game along.
    assert not isinstance(pool.reset("warm", other), pool_lib.BranchFailure)
    results = pool.restore_many({b: snap for b in forks})
    assert all(r is None for r in results.values()), results
    got = {b: [] for b in forks}
    for i in range(len(tail) + 1):
      for b, s in pool.step_many({b: f[i] for b, f in forks.items()}).items():
        assert not isinstance(s, pool_lib.BranchFailure), s
        got[b].append(s)
  for b in forks:
    assert base.first_divergence(expected[b], got[b]) is None, b


def test_bad_actions_get_an_observation_and_cost_a_turn(generated):
  task = generated[0]
  sb = alfworld.make_sandbox(max_steps=7)
  sb.reset(task)
  admissible = sb.admissible_actions()
  for bad, reason in [("", "empty"), ("x" * 5000, "5000 characters"), (b"\xff\xfe", "UTF-8"),
                      ("look\x00", "control character"), (None, "must be text")]:
    step = sb.step(bad)
    assert step.observation.startswith("Invalid action:") and reason in step.info["invalid_action"]
    assert (step.reward, step.done, step.info["success"]) == (0.0, False, False)
    assert sb.admissible_actions() == admissible  # the game did not move
  # A well-formed command the game does not admit: ALFWorld's "Nothing happens."
  step = sb.step("fly to the moon")
  assert step.observation == "Nothing happens." and step.info["steps"] == 6
  sb.reset(task)
  # Commands are matched case- and space-insensitively, as ALFWorld's are lower case.
  assert sb.step("  LOOK ").observation == sb.step("look").observation != "Nothing happens."
  # max_steps = 7 reached: done and truncated, not a success; later steps say the episode is over.
  sb.reset(task)
  steps = [sb.step("look") for _ in range(7)]
  assert [s.done for s in steps] == [False] * 6 + [True] and steps[-1].truncated
  assert steps[-1].info["success"] is False and steps[-1].reward == 0.0
  after = sb.step("look")
  assert after.done and after.reward == 0.0 and "over" in after.observation
  with pytest.raises(ValueError, match="magic"):
    sb.restore(base.Snapshot(b"not a snapshot"))
  with pytest.raises(TypeError, match="AlfworldTask"):
    sb.reset("a task id")
  with pytest.raises(ValueError, match="max_steps"):
    alfworld.make_sandbox(max_steps=0)
  snap = sb.snapshot()
  sb.close()
  sb.close()
  for call in (lambda: sb.step("look"), lambda: sb.reset(task), lambda: sb.restore(snap)):
    with pytest.raises(RuntimeError, match="closed"):
      call()


@pytest.mark.slow
def test_the_engine_caches_change_nothing():
  """The sandbox against ALFWorld's stock engine (TextWorld's PddlEnv with ALFWorld's
  demangler, no caches) on the same commands: same observations, admissible commands, wins."""
  task = alfworld.load_game_dir(os.path.join(DATA_ROOT, FIXTURE_ID))
  commands = ["look", "inventory", "go to cabinet 1", "open cabinet 1", "examine cabinet 1",
              "help", "take egg 1 from garbagecan 1"] + task.walkthrough
  sb = alfworld.make_sandbox(max_steps=100)
  ours = [(sb.reset(task), sb.admissible_actions(), False)]
  for c in commands:
    step = sb.step(c)
    ours.append((step.observation, sb.admissible_actions(), step.info["success"]))
  sb.close()
  aw = alfworld._alfworld()
  with alfworld._engine_caches_disabled():
    env = aw["alfred_tw_env"].AlfredDemangler(
        aw["PddlEnv"](aw["textworld"].EnvInfos(admissible_commands=True, won=True)))
    env.load(os.path.join(DATA_ROOT, FIXTURE_ID, alfworld.GAME_FILE))
    state = env.reset()
    stock = [(state.feedback, state["admissible_commands"], False)]
    for c in commands:
      state, _, _ = env.step(c)
      stock.append((state.feedback, state["admissible_commands"], bool(state["won"])))
    env.close()
  assert ours == stock
  assert ours[-1][2] and "Nothing happens." in [o for o, _, _ in ours]


@pytest.mark.slow
def test_expert_actions_win_from_the_start_and_from_a_restored_state(generated):
  sb = alfworld.make_sandbox(max_steps=50, num_distractors=(1, 2))  # task options are ignored
  for task in generated:
    sb.reset(task)
    plan = sb.expert_actions()
    assert plan and len(plan) <= len(task.walkthrough)
    steps = [sb.step(a) for a in plan]
    assert steps[-1].info["success"] and [s.done for s in steps].count(True) == 1
    assert sb.expert_actions() == []
  task = next(t for t in generated if t.task_type == "pick_two_obj_and_place")
  sb.reset(task)
  for command in task.walkthrough[:3]:
    sb.step(command)
  snap = sb.snapshot()
  sb.step(sb.admissible_actions()[0])
  sb.restore(snap)
  plan = sb.expert_actions()
  assert base.replay(sb, snap, plan)[-1].info["success"]
  with pytest.raises(TypeError, match="unknown ALFWorld options \\['colour'\\]"):
    alfworld.make_sandbox(colour="red")
  with pytest.raises(TypeError, match="unknown ALFWorld options"):
    alfworld.make_tasks("train", 1, 0, colour="red")
  sb.close()


def test_games_the_expert_fails_are_redrawn_and_leave_no_files(tmp_path, monkeypatch):
  calls = []
  real_expert = alfworld.expert_walkthrough

  def fails_first(game_dir, **kwargs):
    calls.append(game_dir)
    return None if len(calls) == 1 else real_expert(game_dir, **kwargs)

  monkeypatch.setattr(alfworld.generator, "expert_walkthrough", fails_first)
  (kept,) = alfworld.generate_game_dirs(str(tmp_path), "train", 1, 5,
                                        task_types=["pick_heat_then_place_in_recep"],
                                        num_distractors=(1, 2))
  assert len(calls) == 2 and calls[1] == kept != calls[0]
  assert not os.path.exists(calls[0])  # the rejected draw is gone, its task folder too
  assert sorted(os.listdir(tmp_path / "train")) == [os.path.basename(os.path.dirname(kept))]
  monkeypatch.setattr(alfworld.generator, "expert_walkthrough", lambda game_dir, **kwargs: None)
  with pytest.raises(RuntimeError, match="the expert failed 20 drawn pick_two_obj_and_place"):
    alfworld.generate_game_dirs(str(tmp_path / "never"), "train", 1, 0,
                                task_types=["pick_two_obj_and_place"])


def _mapped_downward_copies() -> int:
  """Distinct copies of Fast Downward's library mapped into this process (Linux)."""
  with open("/proc/self/maps", encoding="utf-8") as f:
    return len({line.split(None, 5)[-1].removesuffix(" (deleted)")
                for line in f.read().splitlines() if "libdownward" in line})


@pytest.mark.slow
def test_a_closed_sandbox_hands_its_engine_on_and_its_snapshots_stay_portable(generated):
  task, prefix, tail = _forks(generated)
  other = next(t for t in generated if t is not task)
  first = alfworld.make_sandbox(max_steps=200)
  _play(first, task, prefix)
  snap = first.snapshot()
  expected = base.replay(first, snap, tail)
  solved = _play(first, other, other.walkthrough)
  assert solved[-1].info["success"]
  first.close()
  copies = _mapped_downward_copies()
  for _ in range(3):  # each new sandbox takes the closed one's engine: no new library copy
    again = alfworld.make_sandbox(max_steps=200)
    assert again._pddl_env is first._pddl_env  # pylint: disable=protected-access
    # The closed sandbox's handle names the same engine but an earlier load: the portable path.
    assert base.first_divergence(expected, base.replay(again, snap, tail)) is None
    assert base.first_divergence(solved, _play(again, other, other.walkthrough)) is None
    again.close()
  assert _mapped_downward_copies() == copies > 0


@pytest.mark.slow
def test_a_process_that_closed_sandboxes_exits_cleanly():
  # Unloading Fast Downward's library on close made the interpreter die with SIGSEGV at exit.
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  script = (
      "from bpo_jax.sandboxes import alfworld\n"
      f"task = alfworld.load_game_dir({os.path.join(DATA_ROOT, FIXTURE_ID)!r})\n"
      "sb = alfworld.make_sandbox()\n"
      "sb.reset(task); sb.step('look'); sb.close(); sb.close()\n"
      "print('closed')\n")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=repo, timeout=300, env={**os.environ, "PYTHONPATH": repo})
  assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
  assert result.stdout.strip() == "closed"


def _listed(observation):
  head, _, listed = observation.rpartition("\n\nAdmissible commands: ")
  assert head and listed, observation
  return head, listed.split(", ")


@pytest.mark.slow
def test_admissible_commands_are_listed_and_are_what_the_engine_accepts(generated):
  real = alfworld.load_game_dir(os.path.join(DATA_ROOT, FIXTURE_ID))
  clean = next(t for t in generated if t.task_type == "pick_clean_then_place_in_recep")
  listing = alfworld.make_sandbox(max_steps=200, admissible_commands=True)
  plain = alfworld.make_sandbox(max_steps=200)
  checked = refused = 0
  for task in (real, clean):
    states = []  # (snapshot, listed commands) at each state along the expert's episode
    head, listed = _listed(listing.reset(task))
    assert head == plain.reset(task)  # the listing is appended to the observation as it was
    for command in task.walkthrough:
      assert listed == listing.admissible_actions()
      states.append((listing.snapshot(), listed))
      step, plain_step = listing.step(command), plain.step(command)
      if step.done:
        assert step.observation == plain_step.observation  # no listing after the end
        break
      head, listed = _listed(step.observation)
      assert head == plain_step.observation
    assert step.info["success"]
    every = sorted({c for _, commands in states for c in commands})
    for snapshot, commands in (states[0], states[len(states) // 2]):  # seconds, not minutes
      for command in commands:
        listing.restore(snapshot)
        assert not listing.step(command).observation.startswith("Nothing happens"), command
        checked += 1
      for command in sorted(set(every) - set(commands))[:8]:
        listing.restore(snapshot)
        assert listing.step(command).observation.startswith("Nothing happens."), command
        refused += 1
  assert checked > 30 and refused > 20, (checked, refused)
  listing.close()
  plain.close()


def test_data_splits_are_selected_by_option(tmp_path):
  real = alfworld.load_game_dir(os.path.join(DATA_ROOT, FIXTURE_ID))
  for split in ("train", "valid_seen", "valid_unseen"):
    shutil.copytree(os.path.join(DATA_ROOT, FIXTURE_ID), tmp_path / split / FIXTURE_ID.split(
        "/", 1)[1])
  root = str(tmp_path)

  def ids(which, **options):
    return [t.task_id.split("/")[0] for t in alfworld.make_tasks(which, 0, 0, data_path=root,
                                                                  **options)]

  assert ids("train") == ["train"] and ids("valid_seen") == ["valid_seen"]
  assert ids("test") == ["valid_unseen"]  # ALFWorld's held-out split by default
  assert ids("test", split="valid_seen") == ["valid_seen"]
  assert ids("test", split="valid_unseen") == ["valid_unseen"]
  assert ids("train", split="valid_seen") == ["train"]  # the option names the held-out split
  # The same options dict serves the sandbox, which ignores the task options.
  sb = alfworld.make_sandbox(data_path=root, split="valid_seen", admissible_commands=True)
  assert "Admissible commands: " in sb.reset(real)
  sb.close()
  with pytest.raises(FileNotFoundError, match=r"^no ALFWorld data directory for split "
                     r"'valid_unseen' in data_path '.*'; it has valid_seen$"):
    alfworld.make_tasks("test", 1, 0, data_path=DATA_ROOT)
  for bad, message in [
      ({"split": "valid_seen"}, r"^ALFWorld option split = 'valid_seen' needs data_path"),
      ({"split": "train", "data_path": root}, r"^ALFWorld option split = 'train': must be one "
       r"of valid_seen, valid_unseen"),
      ({"admissible_commands": "yes"}, r"^ALFWorld option admissible_commands = 'yes': must be"),
  ]:
    with pytest.raises(ValueError, match=message):
      alfworld.make_tasks("test", 1, 0, **bad)
    with pytest.raises(ValueError, match=message):
      alfworld.make_sandbox(**bad)
    assert "\n" not in alfworld.option_problem(bad)
  # A run's config with these options passes the config checks.
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = config_lib.default_config()
  config.env.name = "alfworld"
  config.env.options = ml_collections.ConfigDict(
      {"data_path": root, "split": "valid_seen", "admissible_commands": True})
  problems = []
  config_lib._check_env_options(config, problems)  # pylint: disable=protected-access
  assert problems == []
