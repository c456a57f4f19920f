"""Several processes: how tasks and held-out tasks split over them, and how their rollout batches
join (the two-process training run itself is in test_mesh_loop.py).
"""

import pytest

from bpo_jax import rollout
from bpo_jax.training import config as config_lib
from bpo_jax.training import distributed


def test_too_few_tasks_for_the_processes_are_named():
  config = config_lib.default_config()
  config.scale.distributed.num_processes = 4
  config.scale.distributed.coordinator_address = "localhost:1234"
  config.rollout.tasks_per_iteration = 3
  config.eval.num_tasks = 2
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate(config)
  message = str(error.value)
  assert ("rollout.tasks_per_iteration x rollout.trees_per_task = 3: fewer trees than "
          "scale.distributed.num_processes = 4") in message
  assert "eval.num_tasks = 2: fewer held-out tasks than scale.distributed.num_processes" in (
      message)


def test_process_share_splits_contiguously_and_evenly():
  shares = [distributed.process_share(10, i, 4) for i in range(4)]
  assert shares == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
  assert [distributed.process_share(3, i, 3) for i in range(3)] == [range(0, 1), range(1, 2),
                                                                    range(2, 3)]
  assert distributed.process_share(5, 1, 2) == range(3, 5)
  assert distributed.process_share(2, 2, 3) == range(2, 2)  # more processes than items
  assert distributed.process_share(7) == range(0, 7)  # this one process
  with pytest.raises(ValueError, match=r"process_index must be in \[0, 1\], got 2"):
    distributed.process_share(4, 2, 2)
  with pytest.raises(ValueError, match="num_items must be >= 0, got -1"):
    distributed.process_share(-1, 0, 2)
  # One process: allgather_objects gives back the object itself, in a list.
  value = {"a": [1, 2]}
  assert distributed.allgather_objects(value)[0] is value


def test_rollout_batches_concatenate_in_order():
  def batch(tasks, forks, seconds, turns):
    return rollout.RolloutBatch(
        rollouts=list(tasks), compute=rollout.Compute(forks=forks, env_steps=2 * forks),
        phase_seconds={"decode": seconds, "env": 1.0}, device_row_tokens=10 * forks,
        turns=turns, threshold=0.5)

  whole = rollout.RolloutBatch.concatenate([batch("ab", 1, 2.0, 3), batch("c", 2, 1.0, 5)])
  assert whole.rollouts == ["a", "b", "c"]
  assert whole.compute == rollout.Compute(forks=3, env_steps=6)
  assert whole.phase_seconds == {"decode": 2.0, "env": 1.0}
  assert (whole.device_row_tokens, whole.turns, whole.threshold) == (30, 5, 0.5)
  one = batch("a", 1, 1.0, 1)
  assert rollout.RolloutBatch.concatenate([one]) is one
  other = batch("b", 1, 1.0, 1)
  other.threshold = 0.7
  with pytest.raises(ValueError, match=r"different fork thresholds: \[0.5, 0.7\]"):
    rollout.RolloutBatch.concatenate([one, other])
  with pytest.raises(ValueError, match="at least one batch"):
    rollout.RolloutBatch.concatenate([])
