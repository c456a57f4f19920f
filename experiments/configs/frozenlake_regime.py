"""FrozenLake on generated maps from a weak warm start: a second world tried for the regime.

The world: a 5 x 5 lake per task (gymnasium's `generate_random_map`, holes at 20%, a path from S
to G guaranteed), without slipping, so the expert is a shortest path around the holes
(`frozenlake.shortest_path`: 8 moves on almost every map, 10 on a few). Fully observed: every
observation names the four cells around the agent (`neighbours`) and gives the whole map with
the agent's cell marked, one token per cell. A held-out map is never a training map
(`frozenlake.map_split`). 10 turns per episode, the env-step budget of four whole episodes
(`base.compared`'s trees for BPO), observations cut at `OBSERVATION_TOKENS` (the map of a first
observation is whole, its closing list of actions cut), in a context that holds a path of them
(`CONTEXT`).

The regime is `rooms_regime.py`'s: a warm start from expert episodes stopped where success on 64
training tasks, sampled at the rollouts' temperature, reaches its target, then 64 iterations of
8 tasks from the tasks it did not demonstrate, held-out success on 512 tasks every 16 updates,
checkpoints every 32.

Why these, from pilots on other worlds (`--config.env.task_seed=1`;
results/frozenlake_regime_tuning), on training tasks only, GRPO at 2e-4 over 64 updates on 256
held-out tasks unless said:
- The expert's tie-break. With breadth-first search's own order between equally short paths,
  imitation stayed where a fixed path of moves is (validation success 0.125-0.25): which path
  that order picks is not to be read off the map near the agent. Ties broken right, down, left,
  up (`frozenlake.EXPERT_PREFERENCE`) agree with a local rule on 93% of decisions.
- The warm start's learning rate, 1e-3 rather than the rooms' 3e-3. At 3e-3 imitation of 512
  episodes held a fixed path (right four times, then down, into the holes on its way:
  validation 0.234 at nearly every check up to step 190), then rose to 0.38-0.48 by step 250
  with the neighbours (`warm_start_pilot_neighbours_600.jsonl`, stopped there) and without them
  swung between 0.23 and 0.52 through step 800. At 1e-3 with the neighbours it reached
  validation success 0.52, 0.75, 0.63, 0.83 at steps 100-250 (held-out 0.49 and 0.58 at 100
  and 200; `warm_start_pilot_neighbours_lr1e-3.jsonl`): the policy reads its observation.
- The target, 0.25, checked every 5 steps: imitation rises fast, and checked every 10 it
  overshot, stopping at step 90 at validation 0.52 (held-out 0.512), from where GRPO stood at
  0.504, 0.582, 0.586, 0.586 after 16-64 updates (19 tasks gained, none lost;
  `neighbours_wslr1e-3`; at 5e-4 it fell to 0.410 after 16, stopped there). Checked every 5 it
  stopped at step 75 (validation 0.28, held-out 0.285), and GRPO stood at 0.375, 0.371, 0.383,
  0.391: 10.5 points, 28 tasks gained and 1 lost (`check5`), on one seed.
- Before the neighbours and the learning rate, from a warm start stopped at step 80 (held-out
  0.270) GRPO stood at 0.320, 0.320, 0.359, 0.359 and stayed at 0.359 through 128 updates
  (`target_0.25`, `target_0.25_it128`); up to three rounds of tasks until the batch has signal
  (`rollout.signal_rounds`) reached 0.363 (`target_0.25_signal3`), groups of 8 episodes 0.359,
  temperature 1.3 0.320, four PPO epochs an iteration 0.320 then 0.234 after 32 (stopped), and
  at temperature 2 the actions came out garbled. From a warm start stopped at 0.35 (held-out
  0.371 and 0.402) it swung by ±5 points; at 5e-4 it fell to 0.184.
- The target measured on sampled episodes (`warm_start.target_temperature`, the rollouts'
  temperature 1) rather than greedy ones. On the comparison's own seeds with the greedy
  target (results/frozenlake_regime_tuning/greedy_target), seed 0 stopped late (held-out
  0.449) and every method gained about 20 points, but seed 1 stopped at step 25, greedy 0.299
  held-out while its sampled episodes succeeded about 1 time in 50: no method had a signal
  to learn from, and BPO's held-out success fell to 0 after 16 updates before coming back to
  0.299. What the iterations need is the sampled policy's success. Measured so, the warm start
  on the other worlds stopped at step 70 (sampled validation 0.266, greedy held-out 0.184),
  and GRPO stood at 0.242, 0.379, 0.379, 0.379 after 16-64 updates: 19.5 points, 50 tasks
  gained and none lost (`sampled_target`).
The config was chosen on one seed of other worlds. Checked on three more seeds of them
(`seeds_1_3`), GRPO gained 12.1, 17.2 and 17.5 points after 64 updates (from 0.359, 0.379 and
0.305; 32, 90 and 45 tasks gained, 1, 46 and 0 lost); at 4e-4 (`seeds_1_3_lr4e-4`, seeds 1 and
2 from the same warm starts) 10.2 and 12.1, falling to 0.227 after 32 updates on seed 1 before
coming back. On the comparison's own worlds RL learns on fewer of its seeds (docs/RESULTS.md,
"FrozenLake from a weak warm start"). Its runs:

    python experiments/compare.py --config=experiments/configs/frozenlake_regime.py --seeds=10 \\
        --estimators=bpo,grpo,rloo --share_warm_start --jobs=1 --out=results/frozenlake_regime
"""

import ml_collections

from experiments.configs import base
from experiments.configs import rooms_regime

SIZE = 5
TURNS = 10
# Observations name the four cells around the agent (`frozenlake` with `neighbours`).
NEIGHBOURS = True
# A first observation runs to 82 tokens of the world's tokenizer, its map ending by the 73rd;
# later ones to 56 (an invalid action's to 88).
OBSERVATION_TOKENS = 76
CONTEXT = 928
WARM_START_EPISODES = 512
WARM_START_STEPS = 400
TARGET_SUCCESS = 0.25
WARM_START_LEARNING_RATE = 1e-3
WARM_START_CHECK_EVERY = 5


def world(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """FrozenLake's settings (module docstring) on a comparison `config`."""
  config.env.name = "frozenlake"
  config.env.options = ml_collections.ConfigDict(
      {"size": SIZE, "is_slippery": False, "max_steps": TURNS, "neighbours": NEIGHBOURS})
  config.env.max_turns = TURNS
  config.env.max_observation_tokens = OBSERVATION_TOKENS
  config.model.max_length = CONTEXT
  config.rollout.max_env_steps = base.matched_budget(4, TURNS)
  config.rollout.max_tree_tokens = 4 * CONTEXT  # four whole contexts, as in `base.compared`
  return config


def get_config(arg=None) -> ml_collections.ConfigDict:
  config = rooms_regime.regime(world(base.compared(base.rooms("bpo"))))
  config.warm_start.learning_rate = WARM_START_LEARNING_RATE
  config.warm_start.check_every = WARM_START_CHECK_EVERY
  config.warm_start.target_temperature = config.rollout.temperature
  return base.variant(rooms_regime.warm_start(config, WARM_START_EPISODES, WARM_START_STEPS,
                                              TARGET_SUCCESS), arg)
