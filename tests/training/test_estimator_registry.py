"""The estimator table: a new estimator registered in one place validates and trains.

"rloo_copy" is RLOO's advantage function under another name, registered with one call. One
tiny iteration with it (rollout of its groups, advantages, packing, update) must give exactly
the record of the same iteration with "rloo", timing aside: the name alone chose the rollout
topology, the advantage function and everything after.
"""

import os
import sys

import jax
import jax.numpy as jnp
import pytest

from bpo_jax import estimators
from bpo_jax import rollout as rollout_lib
from bpo_jax.training import config as config_lib
from bpo_jax.training import estimator_registry
from bpo_jax.training import experiment
from bpo_jax.training import iteration
from bpo_jax.training import metrics
from bpo_jax.training import translate
from bpo_jax.training import update
from bpo_jax.training.settings import from_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from experiments.configs import base  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture
def rloo_copy():
  entry = estimator_registry.register(estimator_registry.Estimator(
      "rloo_copy", estimator_registry.with_path_weights(estimators.rloo_advantages),
      topology="group"))
  yield entry
  del estimator_registry.ESTIMATORS[entry.name]


def _one_iteration(estimator: str, workdir: str) -> tuple[dict, rollout_lib.RolloutBatch]:
  config = base.tiny(base.rooms(estimator), iterations=1)
  config_lib.validate(config)
  exp, state = experiment.build_experiment(from_config(config), workdir)
  try:
    tx = translate.rl_optimizer(from_config(config))
    state = update.TrainState(step=state.step, params=state.params,
                              opt_state=tx.init(state.params))
    train_step = update.make_train_step(exp.graphdef, tx,
                                        translate.update_config(from_config(config)))
    engine = rollout_lib.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt, exp.pool,
                                       translate.rollout_config(from_config(config)))
    _, record, batch, _ = iteration.run_iteration(exp, engine, train_step, state, 1,
                                                  jax.random.key(config.seed))
  finally:
    exp.close()
  return metrics.deterministic_part(metrics.clean_record(record)), batch


@pytest.mark.slow
def test_a_registered_estimator_validates_and_trains_like_its_original(rloo_copy, tmp_path):
  assert estimator_registry.names()[-1] == "rloo_copy"
  config = base.tiny(base.rooms("rloo_copy"))
  # The configs' helper read its topology: a baseline group of what fits the env-step budget.
  assert config.rollout.group_size == 0 and config_lib.group_episodes(config) == 2
  assert translate.rollout_config(from_config(config)).topology == "group"
  copy, batch = _one_iteration("rloo_copy", str(tmp_path / "copy"))
  original, _ = _one_iteration("rloo", str(tmp_path / "original"))
  assert copy == original
  # Two tasks, one group of k = 2 episodes each: two root children per tree.
  for r in batch.rollouts:
    assert int(jnp.sum((r.tree.parent == -1) & r.tree.valid)) == 2
  assert copy["leaves"] == 4


def test_unknown_and_duplicate_names(rloo_copy):
  config = config_lib.default_config()
  config.rollout.estimator = "ppo"
  with pytest.raises(config_lib.ConfigError, match="rollout.estimator = 'ppo': must be one of "
                                                   "'bpo', 'rloo', 'grpo', 'gigpo', 'rloo_copy'"):
    config_lib.validate(config)
  with pytest.raises(ValueError, match="already registered"):
    estimator_registry.register(rloo_copy)
  with pytest.raises(ValueError, match="topology must be one of"):
    estimator_registry.Estimator("star", rloo_copy.advantages, topology="star")
  with pytest.raises(ValueError, match="unknown estimator 'ppo'; registered: bpo, rloo"):
    estimator_registry.get("ppo")


def test_the_schema_names_what_the_rollout_accepts():
  # The schema keeps its own copies (it loads without the rollout); they must agree with it.
  assert set(config_lib.TRAINING_FORK_RULES) < set(rollout_lib.FORK_RULES)
  assert config_lib.ENTROPY_MEASURES == rollout_lib.ENTROPY_MEASURES
  assert estimator_registry.TOPOLOGIES == rollout_lib.TOPOLOGIES
  for entry in estimator_registry.ESTIMATORS.values():
    assert entry.state_ids in rollout_lib.STATE_IDS


def test_group_conventions_reach_the_advantage_functions():
  # The config's rollout keys become the estimators' keyword arguments, for GRPO and GiGPO
  # alone; through the jitted table they give the functions' own numbers, bit for bit.
  from bpo_jax.tree import from_parents, stack_trees  # pylint: disable=g-import-not-at-top
  config = config_lib.default_config()
  assert estimator_registry.config_options(from_config(config).rollout) == ()
  config.rollout.estimator = "grpo"
  config.rollout.group_std_ddof, config.rollout.group_std_eps = 1, 1e-4
  assert estimator_registry.config_options(from_config(config).rollout) == (
      ("normalize_std", True), ("ddof", 1), ("eps", 1e-4))
  config.rollout.estimator = "gigpo"
  config.rollout.gigpo_step_weight, config.rollout.gigpo_step_gamma = 0.5, 0.95
  options = estimator_registry.config_options(from_config(config).rollout)
  assert dict(options) == dict(normalize_std=True, ddof=1, eps=1e-4, step_weight=0.5,
                               step_gamma=0.95)
  tree = from_parents([-1, 0, -1, 2, -1, 4], [0.0, 1.0, 1.0, 3.0, 2.0, 2.0],
                      state_id=[7, 5, 7, 5, 7, 9])
  advantages, _ = estimator_registry.advantages_and_weights(
      stack_trees([tree]), estimator="gigpo", gamma=1.0, options=options)
  expected = jax.jit(lambda t: estimators.gigpo_advantages(t, gamma=1.0, **dict(options)))(tree)
  assert jnp.array_equal(advantages[0], expected)
  assert not jnp.array_equal(expected, jax.jit(estimators.gigpo_advantages)(tree))
