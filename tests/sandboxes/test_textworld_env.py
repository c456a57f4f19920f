"""TextWorld through Jericho: the fixture games are won by their policy, snapshots are small
and restore anywhere."""

import os

import pytest

from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import textworld_env

GAMES_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                         "textworld_games")


def _all_tasks():
  return (textworld_env.make_tasks("train", 2, 0, games_dir=GAMES_DIR)
          + textworld_env.make_tasks("test", 1, 0, games_dir=GAMES_DIR))


def test_every_fixture_game_is_won_by_its_winning_policy():
  sandbox = textworld_env.make_sandbox()
  for task in _all_tasks():
    first = sandbox.reset(task)
    game = textworld_env._game_data(os.path.abspath(task.game_file)).game
    assert first.startswith(game.objective)
    plan = sandbox.expert_actions()
    assert plan and plan[0] in sandbox.admissible_actions()
    steps = [sandbox.step(a) for a in plan]
    assert [s.done for s in steps] == [False] * (len(plan) - 1) + [True]
    assert sum(s.reward for s in steps) == game.max_score == 1
    assert steps[-1].info["success"] is True and not steps[-1].truncated
    # Ends with the score line (no status line or restart question); the game counts the
    # tw-trace-actions command sent at reset as a turn.
    assert steps[-1].observation.endswith(f"in {len(plan) + 1} turns.")
    assert "*** The End ***" in steps[-1].observation
    assert sandbox.step("look").observation == "The game is over."
  sandbox.close()


def test_snapshot_is_small_and_restores_into_a_sandbox_playing_another_game():
  train, _, test = _all_tasks()
  sandbox, other = textworld_env.make_sandbox(), textworld_env.make_sandbox()
  sandbox.reset(train)
  sandbox.step(sandbox.expert_actions()[0])
  snap = sandbox.snapshot()
  assert len(snap) < 64 * 1024
  other.reset(test)
  plan = sandbox.expert_actions()
  assert base.check_replay(sandbox, snap, plan, other=other) is None
  assert base.replay(other, snap, plan)[-1].info["success"]


def test_actions_the_interpreter_would_misread_are_refused():
  # A second line would be the next turn's command (its output served a turn late), and a
  # backslash starts an interpreter escape: `\\help` waits for input forever, `x \\q` would
  # reach the game as `x`.
  sandbox = textworld_env.make_sandbox()
  sandbox.reset(_all_tasks()[0])
  look = sandbox.step("look").observation
  backslash = "an action cannot hold a backslash (the interpreter's escape character)"
  for bad, reason in [("look\ninventory", "an action is one line"),
                      ("\\help", backslash), ("\\q", backslash), ("x \\q", backslash),
                      ("look \\ninventory", backslash)]:
    step = sandbox.step(bad)
    assert step.info["invalid_action"] == reason and not step.done, bad
  assert sandbox.step("look").observation == look  # nothing was left pending
  assert sandbox.step("x").observation == "What do you want to examine?"
  sandbox.close()


def test_step_limit_truncates():
  sandbox = textworld_env.make_sandbox(max_steps=2)
  sandbox.reset(_all_tasks()[0])
  steps = [sandbox.step("look"), sandbox.step("inventory")]
  assert [(s.done, s.truncated) for s in steps] == [(False, False), (True, True)]
  assert steps[-1].info["success"] is False


def test_tasks_name_their_games_and_errors_say_what_is_missing():
  train = textworld_env.make_tasks("train", 3, 0, games_dir=GAMES_DIR)
  assert sorted(t.task_id for t in train[:2]) == ["textworld-train-custom-s1",
                                                  "textworld-train-custom-s2"]
  assert train[2].task_id == train[0].task_id + "#1"
  test_ids = {t.task_id for t in textworld_env.make_tasks("test", 1, 0, games_dir=GAMES_DIR)}
  assert test_ids == {"textworld-test-custom-s3"}
  with pytest.raises(ValueError, match="games_dir"):
    textworld_env.make_tasks("train", 1, 0)
  with pytest.raises(FileNotFoundError, match="not a folder"):
    textworld_env.make_tasks("train", 1, 0, games_dir=os.path.join(GAMES_DIR, "missing"))
  with pytest.raises(FileNotFoundError, match=".json"):
    textworld_env.make_sandbox().reset(
        textworld_env.TextWorldTask("x", os.path.join(GAMES_DIR, "nowhere.z8")))
