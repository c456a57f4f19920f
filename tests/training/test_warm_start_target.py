"""The warm start that stops at a validation target (`warm_start.target_success`).

The stop rule on hand-built success sequences; where the validation tasks sit in the task
order; the settings refused in one line (exit status 2 from run.py); and the warm start itself
on the tiny rooms world, with a `validate` that replays a fixed sequence: it stops at the first
check that reaches the target, logs each check, records the step, and its parameters are those
of a fixed warm start of that many steps, bit for bit (the same batches, the same steps).
"""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax.training import config as config_lib
from bpo_jax.training import experiment
from bpo_jax.training import loop
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import warm_start
from bpo_jax.training.settings import from_config
from experiments.configs import rooms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("target, expected", [
    (0.3, 60),    # 0.25 < 0.3 at step 40; 0.5 at step 60
    (0.5, 60),    # reaching the target is enough
    (0.2, 40),
    (0.6, None),  # never reached: the warm start runs all its steps
    (0.01, 40),   # 0.0 at step 20 is below any positive target
])
def test_stop_step_is_the_first_check_at_or_above_the_target(target, expected):
  checks = [(20, 0.0), (40, 0.25), (60, 0.5), (80, 0.2)]
  assert warm_start.stop_step(checks, target) == expected


def test_stop_step_of_no_checks_is_none():
  assert warm_start.stop_step([], 0.5) is None


def test_validation_tasks_are_the_last_of_the_first_epoch_apart_from_the_demonstrated():
  assert warm_start.validation_positions(512, 64) == (448, 64)
  start, count = warm_start.validation_positions(40, 8)
  demonstrated = set(experiment.task_order(40, 3, 0, 32))
  validation = set(experiment.task_order(40, 3, start, count))
  # One epoch is one permutation: 32 + 8 positions of it are 40 distinct tasks.
  assert len(validation) == 8 and not demonstrated & validation
  assert demonstrated | validation == set(range(40))


def _problems(config) -> list[str]:
  try:
    config_lib.validate(config, "train", None, host_memory=False)
  except config_lib.ConfigError as error:
    return error.problems
  return []


@pytest.mark.parametrize("key, value, named", [
    ("target_success", 1.5, "warm_start.target_success = 1.5"),
    ("target_success", -0.1, "warm_start.target_success = -0.1"),
    ("check_every", 0, "warm_start.check_every = 0"),
    ("validation_tasks", 0, "warm_start.validation_tasks = 0"),
    ("target_temperature", -0.5, "warm_start.target_temperature = -0.5"),
])
def test_bad_warm_start_target_settings_are_refused_in_one_line(key, value, named):
  config = rooms.get_config()
  config.warm_start[key] = value
  problems = _problems(config)
  assert len(problems) == 1 and problems[0].startswith(named), problems


def test_validation_tasks_must_fit_beside_the_demonstrated_ones():
  config = rooms.get_config()
  config.warm_start.target_success = 0.3
  config.warm_start.validation_tasks = config.env.num_train_tasks  # + 32 demonstrated
  problems = _problems(config)
  assert len(problems) == 1 and problems[0].startswith(
      f"warm_start.validation_tasks = {config.env.num_train_tasks}:"), problems
  config.warm_start.target_success = 0.0  # no target: the validation tasks are not read
  assert _problems(config) == []


def test_run_py_refuses_a_target_above_one_with_exit_status_2(tmp_path):
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "run.py"),
       "--config=experiments/configs/rooms.py:tiny", f"--workdir={workdir}",
       "--config.warm_start.target_success=2.0"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert "Traceback" not in result.stderr
  assert "warm_start.target_success = 2.0" in result.stderr, result.stderr
  assert not workdir.exists()


def _tiny_config(**warm):
  config = rooms.get_config("tiny")
  config.scale.num_devices = 1
  config.warm_start.update(warm)
  return config


def _tiny_experiment(tmp_path, **warm):
  return experiment.build_experiment(from_config(_tiny_config(**warm)), str(tmp_path / "run"))


def test_the_warm_start_stops_at_the_first_check_reaching_the_target(tmp_path):
  exp, state = _tiny_experiment(tmp_path, steps=20, check_every=2, target_success=0.5)
  sequence = iter([0.1, 0.25, 0.5, 0.9])
  calls = []

  def validate(params):
    calls.append(jax.tree.leaves(params)[0].shape)
    return next(sequence)

  try:
    params = jax.tree.map(jnp.copy, state.params)
    stopped, _, records = warm_start.warm_start(exp, params, validate=validate)
    # The same experiment with a fixed warm start of 6 steps and no target.
    fixed_exp = dataclasses.replace(exp, settings=from_config(_tiny_config(steps=6)))
    fixed, _, fixed_records = warm_start.warm_start(fixed_exp,
                                                    jax.tree.map(jnp.copy, state.params))
  finally:
    exp.close()
  assert len(calls) == 3  # steps 2, 4, 6; the third reaches 0.5
  checked = [(r["step"], r["validation_success"]) for r in records if "validation_success" in r]
  assert checked == [(2, 0.1), (4, 0.25), (6, 0.5)]
  assert records[-1]["step"] == records[-1]["stopped_at"] == 6
  assert not any("stopped_at" in r for r in fixed_records)
  assert fixed_records[-1]["step"] == 6 and fixed_records[-1]["loss"] == records[-1]["loss"]
  for a, b in zip(jax.tree.leaves(stopped), jax.tree.leaves(fixed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_target_never_reached_runs_every_step_and_records_the_last(tmp_path):
  exp, state = _tiny_experiment(tmp_path, steps=5, check_every=2, target_success=1.0)
  try:
    _, _, records = warm_start.warm_start(exp, state.params, validate=lambda params: 0.75)
  finally:
    exp.close()
  assert [r["step"] for r in records if "validation_success" in r] == [2, 4]
  assert records[-1]["step"] == records[-1]["stopped_at"] == 5


def test_the_loops_validation_plays_the_set_aside_training_tasks_only_with_a_target(tmp_path):
  """Without a target nothing is set aside (a split smaller than `validation_tasks` runs as
  it is); with one, `validate` is the greedy success on `validation_tasks` tasks: a multiple
  of 1/4 here, the same for the same parameters."""
  exp, _ = _tiny_experiment(tmp_path / "a")  # 16 training tasks, fewer than the default 64
  try:
    assert loop._validation(exp, placement_lib.Placement()) is None  # pylint: disable=W0212
  finally:
    exp.close()
  exp, state = _tiny_experiment(tmp_path / "b", target_success=0.5, validation_tasks=4)
  try:
    validate = loop._validation(exp, placement_lib.Placement())  # pylint: disable=W0212
    first, second = validate(state.params), validate(state.params)
  finally:
    exp.close()
  assert first == second and first * 4 == int(first * 4) and 0.0 <= first <= 1.0


def test_a_target_without_validate_is_refused_before_any_step(tmp_path):
  exp, state = _tiny_experiment(tmp_path, steps=5, check_every=2, target_success=0.5)
  try:
    with pytest.raises(ValueError, match="warm_start.target_success = 0.5: the warm start needs"):
      warm_start.warm_start(exp, state.params)
  finally:
    exp.close()


def test_the_target_is_measured_at_its_temperature(tmp_path, monkeypatch):
  """`warm_start.target_temperature` 1: the validation episodes of the 8 validation tasks are
  played by an engine sampling at temperature 1 (greedy, 0, without the setting), and give what
  an evaluation at `eval.temperature` 1 gives on the same tasks with the same key."""
  from bpo_jax.training import evaluation
  engines = []
  engine_class = evaluation.rollout_lib.RolloutEngine

  def recording_engine(*args, **kwargs):
    engines.append(args[4].temperature)
    return engine_class(*args, **kwargs)

  monkeypatch.setattr(evaluation.rollout_lib, "RolloutEngine", recording_engine)
  calls = []
  evaluate = evaluation.evaluate_policy
  monkeypatch.setattr(evaluation, "evaluate_policy", lambda *a, **k: calls.append(a) or evaluate(
      *a, **k))
  results = {}
  for temperature in (1.0, 0.0):
    exp, state = _tiny_experiment(tmp_path / str(temperature), target_success=0.5,
                                  target_temperature=temperature, validation_tasks=8)
    try:
      results[temperature] = loop._validation(exp, placement_lib.Placement())(state.params)
      _, _, tasks, key, _ = calls[-1]
      assert len(tasks) == 8
      if temperature:
        eval_settings = dataclasses.replace(exp.settings.eval, temperature=1.0)
        configured = dataclasses.replace(
            exp, settings=dataclasses.replace(exp.settings, eval=eval_settings))
        by_config = evaluate(configured, state.params, tasks, key, 0.95)["success_rate"]
    finally:
      exp.close()
  assert engines == [1.0, 1.0, 0.0]  # the validation, the configured evaluation, greedy
  assert results[1.0] == by_config
