"""The gradient estimator's variance at fixed parameters (training/gradient_variance.py).

Welford's recurrence by hand on three small gradients; then, on the rooms tiny config at its
initial parameters (BPO with random forks and two trees per task, and GRPO), the function's
variance against NumPy over M = 4 gradients taken through the loop's own path
(`iteration.run_iteration` with an optimizer that hands the gradient back as its state), and M
draws of one key give exactly 0. The real measurement uses M >= 16. A draw whose sandboxes
failed is left out, by hand on stand-in draws.

An untrained tiny model never succeeds, so every advantage is 0; the KL term to a reference
other than the parameters (half of them) gives each draw a gradient that depends on its tokens.
"""

import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
# pylint: disable=g-import-not-at-top,wrong-import-position
from bpo_jax import rollout as rollout_lib
from bpo_jax.training import experiment
from bpo_jax.training import gradient_variance as gv
from bpo_jax.training import iteration
from bpo_jax.training import translate
from bpo_jax.training import update
from bpo_jax.training.settings import from_config
from experiments.configs import base
# pylint: enable=g-import-not-at-top,wrong-import-position

DRAWS = 4
EPS32 = float(np.finfo(np.float32).eps)


def test_welford_by_hand():
  # g = ([1, 2], [3]), ([3, 2], [5]), ([2, 5], [1]): mean ([2, 3], [3]); squared distances
  # 1 + 1 + 0 = 2, 1 + 1 + 4 = 6, 0 + 4 + 4 = 8, so S = 16 and the variance 16 / 2 = 8.
  grads = [{"a": np.float32([1, 2]), "b": np.float32([3])},
           {"a": np.float32([3, 2]), "b": np.float32([5])},
           {"a": np.float32([2, 5]), "b": np.float32([1])}]
  mean, total = jax.tree.map(np.zeros_like, grads[0]), 0.0
  for m, g in enumerate(grads, 1):
    mean, term = gv.welford_step(mean, g, jnp.float32(m))
    total += float(term)
  assert total == 16.0
  np.testing.assert_array_equal(mean["a"], [2, 3])
  np.testing.assert_array_equal(mean["b"], [3])


def test_spread_picks_first_middle_last():
  assert gv.spread([0, 2, 4, 6, 8], 3) == [0, 4, 8]
  assert gv.spread([0, 1, 2, 3], 3) == [0, 2, 3]
  assert gv.spread([0, 8], 3) == [0, 8]
  assert gv.spread([0, 4, 8], 1) == [8]


def test_fork_threshold_fixed_from_the_config_running_from_the_checkpoint():
  config = base.rooms("bpo")
  config.rollout.entropy_threshold, config.rollout.entropy_quantile = 0.5, 0.0
  assert gv.fork_threshold(from_config(config), {"threshold": 0.0, "updates": 0}) == 0.5
  config.rollout.entropy_quantile = 0.8
  assert gv.fork_threshold(from_config(config), {"threshold": 1.3, "updates": 7}) == 1.3


def _stand_in_draws(monkeypatch, draws, moments=((1.0, 2.0, 0.5),)):
  """`gv.draw_gradient` replaced by one that hands out `draws` ((gradient, failure) pairs) in
  turn, each spending 6 env steps and 10 tokens, its two trees' fork moments the next row of
  `moments` (cycled) at level 1, and at the deeper levels that row with `within` halved; the
  paths reaching level k weigh 2^-(k - 1)."""
  queue, rows = list(draws), list(moments)
  def draw(*args):
    del args
    grads, failure = queue.pop(0)
    levels = [np.multiply(rows[0] + (1.0,), (1, 1, 0.5 ** min(k, 1), 0.5 ** k))
              for k in range(gv.FORK_LEVELS)]
    spent = {"env_steps": 6, "tokens_processed": 10, "moments": np.array([levels] * 2),
             "task_index": [0, 1]}
    rows.append(rows.pop(0))
    return (None if failure else {"w": jnp.asarray(grads, jnp.float32)}), spent, failure
  monkeypatch.setattr(gv, "draw_gradient", draw)
  settings = types.SimpleNamespace(rollout=types.SimpleNamespace(trees_per_task=1,
                                                                 tasks_per_iteration=2))
  return types.SimpleNamespace(settings=settings)


def test_a_draw_with_a_failed_branch_is_left_out_and_named(monkeypatch):
  # The draws that count: [1, 0], [3, 0], [2, 3]; mean [2, 1]; Σ||g - ḡ||² = 2 + 2 + 4 = 8.
  # Each task's trees over the counted draws: (mean, mean square, within) = (1, 2, .5), (3, 10,
  # .5), (2, 5, .5): Var(G) = 17/3 − 4 + Var(1, 3, 2)/3 = 2 per task, E[within] .5 → 3/4 at
  # level 1; .25 → 7/8 below.
  exp = _stand_in_draws(monkeypatch, [([1, 0], None), ([0, 0], "step: RuntimeError: injected"),
                                      ([3, 0], None), ([2, 3], None)],
                        moments=[(1, 2, .5), (9, 9, 9), (3, 10, .5), (2, 5, .5)])
  result = gv.gradient_variance(exp, None, None, None, 1, [None] * 4, 0.0)
  assert result["variance"] == 8 / 2 and result["mean_sq_norm"] == 5.0
  assert result["fork_shares"] == pytest.approx([0.75, 0.875, 0.875], rel=1e-12)
  assert result["fork_reach"] == [1.0, 0.5, 0.25]
  assert result["draws"] == 3 and result["failed_draws"] == 1 and result["skipped_draws"] == 0
  assert result["failure"] == "step: RuntimeError: injected"
  assert result["env_steps_per_task"] == 3.0 and result["tokens_per_task"] == 5.0


def test_fork_share_by_hand():
  # The docstring's example: Var(G) = 6 − 4 + 2/2 = 3, E[within] = 0.5.
  rows = [np.array([[1.0, 2.0, 0.5]]), np.array([[3.0, 10.0, 0.5]])]
  assert gv.fork_share([[7], [7]], rows) == pytest.approx(5 / 6, rel=1e-12)
  # Two tasks pool their variances: task 8's trees (mean 0, mean square 1, within 1) give
  # Var(G) = 1, so 1 − (0.5 + 1) / (3 + 1).
  rows = [np.array([[1.0, 2.0, 0.5], [0.0, 1.0, 1.0]]),
          np.array([[3.0, 10.0, 0.5], [0.0, 1.0, 1.0]])]
  assert gv.fork_share([[7, 8], [7, 8]], rows) == pytest.approx(1 - 1.5 / 4, rel=1e-12)
  # Draws that kept their tasks in another order (rounds until signal) pool by task alike.
  swapped = [rows[0], rows[1][::-1]]
  assert gv.fork_share([[7, 8], [8, 7]], swapped) == pytest.approx(1 - 1.5 / 4, rel=1e-12)
  # One tree per task cannot give Var(G); equal returns give no share.
  assert gv.fork_share([[7]], [np.array([[1.0, 2.0, 0.5]])]) is None
  assert gv.fork_share([[7], [7]], [np.array([[1.0, 1.0, 0.0]])] * 2) is None


def test_too_few_draws_without_failures_is_an_error_naming_the_failure(monkeypatch):
  exp = _stand_in_draws(monkeypatch, [([1, 0], None), ([0, 0], "reset: OSError: no game"),
                                      ([0, 0], "step: RuntimeError: later")])
  with pytest.raises(ValueError, match=r"^1 draws with a finite gradient out of 3; 2 had a "
                                       r"failed branch, the first reset: OSError: no game"):
    gv.gradient_variance(exp, None, None, None, 1, [None] * 3, 0.0)


def _capture():
  """An optimizer whose state is the last gradient it saw, and whose update is the gradient."""
  return optax.GradientTransformation(lambda params: jax.tree.map(jnp.zeros_like, params),
                                      lambda grads, state, params=None: (grads, grads))


@pytest.fixture(scope="module", params=["bpo", "grpo", "grpo_rounds"])
def tiny(request, tmp_path_factory):
  config = base.tiny(base.rooms(request.param.split("_")[0]), iterations=1)
  if request.param == "grpo_rounds":  # up to three rounds of tasks until the batch has signal
    config.rollout.signal_rounds = 3
  config.train.epochs = 1
  config.train.kl_coef = 0.5
  if request.param == "bpo":  # trees whose shape varies from draw to draw, two per task
    config.rollout.fork_rule = "random"
    config.rollout.fork_probability = 0.5
    config.rollout.max_leaves = 3
    config.rollout.trees_per_task = 2
    config.rollout.trunk_baseline = "loo"
  exp, state = experiment.build_experiment(from_config(config), str(tmp_path_factory.mktemp("run")))
  engine = rollout_lib.RolloutEngine(exp.sampling_graphdef, exp.model_config, exp.fmt, exp.pool,
                                     translate.rollout_config(from_config(config)))
  ref = jax.tree.map(lambda p: 0.5 * p, state.params)
  yield config, exp, engine, state.params, ref
  exp.close()


def _gradient_fn(config, exp):
  return jax.jit(update.make_gradient_fn(
      exp.graphdef, translate.update_config(from_config(config)), use_ref=True))


def _loop_gradients(config, exp, engine, params, ref, roots):
  """Each root key's gradient and record through `run_iteration` (iteration 1)."""
  step = update.make_train_step(exp.graphdef, _capture(),
                                translate.update_config(from_config(config)), ref_params=ref)
  out = []
  for root in roots:
    state = update.TrainState(step=jnp.zeros((), jnp.int32),
                              params=jax.tree.map(jnp.copy, params),
                              opt_state=jax.tree.map(jnp.zeros_like, params))
    state, record, _, _ = iteration.run_iteration(exp, engine, step, state, 1, root, ref=ref)
    flat = np.concatenate([np.asarray(g, np.float64).ravel()
                           for g in jax.tree.leaves(state.opt_state)])
    out.append((flat, record))
  return out


@pytest.mark.slow
def test_variance_equals_numpy_over_the_loops_gradients(tiny):
  config, exp, engine, params, ref = tiny
  roots = [jax.random.key(100 + m) for m in range(DRAWS)]
  reference = _loop_gradients(config, exp, engine, params, ref, roots)
  g = np.stack([flat for flat, _ in reference])
  assert len({flat.tobytes() for flat in g}) == DRAWS  # the draws differ
  if config.rollout.signal_rounds > 1:  # a draw of more than one round is among them
    assert max(r["signal_rounds"] for _, r in reference) > 1
  for flat, record in reference:  # the captured gradient is the one the update logged
    assert np.linalg.norm(flat) == pytest.approx(record["grad_norm"], rel=8 * EPS32)
  mean = g.mean(axis=0)
  expected = float(np.sum((g - mean) ** 2) / (DRAWS - 1))
  gradient = _gradient_fn(config, exp)
  keys = [jax.random.fold_in(root, 1) for root in roots]  # the keys run_iteration samples with
  result = gv.gradient_variance(exp, engine, gradient, params, 1, keys,
                                config.rollout.entropy_threshold, ref, gram=True,
                                keep_draws=True)
  assert expected > 0 and result["draws"] == DRAWS and result["skipped_draws"] == 0
  # The draws' Gram matrix: the loop's gradients' products, each gradient within one float32
  # rounding per element of its own (2 ulps of ‖g_i‖‖g_j‖ per entry).
  norms = np.linalg.norm(g, axis=1)
  assert np.all(np.abs(np.asarray(result["gram"]) - g @ g.T)
                <= 2 * EPS32 * np.outer(norms, norms))
  # The kept draws (keep_draws, for products with another estimator's): the gradients, each
  # entry within a float32 rounding of its draw's norm.
  assert result["draws_matrix"].shape == g.shape
  assert np.all(np.abs(result["draws_matrix"] - g) <= 2 * EPS32 * norms[:, None])
  # float32 rounding of the running mean and of each draw's term (one ulp each) at the scale of
  # Σ ||g_m||² (the measured error here is 0.2 ulp of it).
  scale = float(np.sum(g ** 2))
  assert abs(result["variance"] - expected) <= 2 * DRAWS * EPS32 * scale
  assert result["mean_sq_norm"] == pytest.approx(float(mean @ mean), rel=8 * DRAWS * EPS32)
  tasks_per_iteration = config.rollout.tasks_per_iteration
  assert result["env_steps_per_task"] == (np.mean([r["env_steps"] for _, r in reference])
                                          / tasks_per_iteration)
  assert result["tokens_per_task"] == (np.mean([r["tokens_processed"] for _, r in reference])
                                       / tasks_per_iteration)


def test_one_key_drawn_m_times_has_zero_variance(tiny):
  config, exp, engine, params, ref = tiny
  gradient = _gradient_fn(config, exp)
  key = jax.random.key(5)
  result = gv.gradient_variance(exp, engine, gradient, params, 1, [key] * DRAWS,
                                config.rollout.entropy_threshold, ref)
  assert result["variance"] == 0.0 and result["draws"] == DRAWS
  tasks = iteration.iteration_tasks(exp, 1)
  one, compute, failure = gv.draw_gradient(exp, engine, gradient, params, 1, key,
                                           config.rollout.entropy_threshold, ref)
  assert failure is None and result["failed_draws"] == 0
  # Each tree's fork moments, a column per level: the return's moments do not depend on it.
  moments = compute["moments"]
  assert moments.shape == (len(tasks), gv.FORK_LEVELS, 4)
  np.testing.assert_array_equal(moments[:, 1:, :2],
                                moments[:, :1, :2].repeat(gv.FORK_LEVELS - 1, 1))
  assert result["mean_sq_norm"] == pytest.approx(
      float(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(one))), rel=EPS32)
  assert result["mean_sq_norm"] > 0
