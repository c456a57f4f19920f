"""iteration.check_skipped_updates: a run stops once its updates stay non-finite.

The streak is counted over the training records at the end of the history (evaluations in
between do not break it, an update that went through does), so a resumed run, whose history
comes from its checkpoint, continues the count where it stopped.
"""

import pytest

from bpo_jax.training import iteration


def _train(i, skipped, loss=0.5):
  return {"phase": "train", "iteration": i, "skipped": float(skipped), "loss": loss,
          "grad_norm": loss}


def _eval(i):
  return {"phase": "eval", "iteration": i, "success_rate": 0.0}


def test_the_streak_is_the_skipped_updates_since_the_last_one_that_went_through():
  nan = float("nan")
  history = [_eval(0), _train(1, 1, nan), _train(2, 0), _train(3, 1, nan), _eval(3),
             _train(4, 1, nan)]
  assert [r["iteration"] for r in iteration.skipped_streak(history)] == [3, 4]
  assert iteration.skipped_streak(history + [_train(5, 0)]) == []
  assert iteration.skipped_streak([_eval(0)]) == []


def test_the_limit_th_skipped_update_in_a_row_stops_the_run():
  history = [_train(1, 0), _train(2, 1, float("nan")), _train(3, 1, float("inf"))]
  iteration.check_skipped_updates(history, 3)  # two in a row: the run goes on
  history.append(_eval(3))
  iteration.check_skipped_updates(history, 3)
  history.append(_train(4, 1, float("nan")))
  with pytest.raises(iteration.NonFiniteUpdates) as error:
    iteration.check_skipped_updates(history, 3)
  assert str(error.value) == (
      "iterations 2-4: the loss or gradient was not finite in 3 updates in a row, each skipped "
      "(last loss nan, grad_norm nan); the run stops (train.max_skipped_updates = 3): lower "
      "train.learning_rate, or check the weights it started from")
  iteration.check_skipped_updates(history, 0)  # 0: never stop
  iteration.check_skipped_updates(history, 4)
  # The line names the whole streak, however low the limit.
  with pytest.raises(iteration.NonFiniteUpdates,
                     match=r"iterations 2-4: .* in 3 updates .*\(train\.max_skipped_updates = 1\)"):
    iteration.check_skipped_updates(history, 1)
