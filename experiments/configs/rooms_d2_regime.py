"""Rooms at difficulty 2 from a weak warm start: the second world of the regime where RL learns.

The world of `rooms_d2.py` (three rooms, a one-way door into a dead end, a distractor; shortest
solutions of 3-6 steps in 7 turns; the env-step budget of four whole episodes) with the warm
start, training tasks, 512 held-out tasks and schedule of `rooms_regime.py`: 32 expert episodes,
stopped at the first check where greedy success on 64 training tasks no iteration reaches
attains `rooms_regime.TARGET_SUCCESS`, then 64 iterations of 8 tasks at 2e-4.

Not yet a regime where RL learns. On other worlds (`--config.env.task_seed=1`;
results/rooms_d2_regime_tuning) the warm start never reached the target: 32 episodes left
validation success at or below 0.0625 through 300 steps (held-out 0.0625 on 256 tasks), and
GRPO's 64 updates at 2e-4 from there ended at 0.055; 128 episodes reached 0.125 at best
(held-out 0.094 after 300 steps). This world needs a larger model or a longer warm start before
its comparison runs.

    python experiments/warm_start_pilot.py --config=experiments/configs/rooms_d2_regime.py \\
        --seeds=2 --steps=300 --from_step=60 --heldout_every=60 \\
        --out=results/rooms_d2_regime/warm_start_pilot.jsonl
    python experiments/compare.py --config=experiments/configs/rooms_d2_regime.py --seeds=10 \\
        --estimators=bpo,grpo,rloo --share_warm_start --jobs=1 --out=results/rooms_d2_regime
"""

import ml_collections

from experiments.configs import base
from experiments.configs import rooms_d2
from experiments.configs import rooms_regime


def get_config(arg=None) -> ml_collections.ConfigDict:
  config = rooms_regime.regime(rooms_d2.world(base.compared(base.rooms("bpo"))))
  return base.variant(config, arg)
