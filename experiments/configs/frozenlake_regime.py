"""FrozenLake on generated maps from a weak warm start: a second world tried for the regime.

The world: a 5 x 5 lake per task (gymnasium's `generate_random_map`, holes at 20%, a path from S
to G guaranteed), without slipping, so the expert is a shortest path around the holes
(`frozenlake.shortest_path`: 8 moves on almost every map, 10 on a few). Fully observed: every
observation is the whole map with the agent's cell marked, one token per cell. A held-out map is
never a training map (`frozenlake.map_split`). 10 turns per episode, the env-step budget of four
whole episodes (`base.compared`'s trees for BPO), observations cut at `OBSERVATION_TOKENS` (the
map of a first observation is whole, its closing list of actions cut), in a context that holds a
path of them (`CONTEXT`).

The regime is `rooms_regime.py`'s: a warm start from expert episodes stopped where greedy success
on 64 training tasks reaches its target, then 64 iterations of 8 tasks from the tasks it did not
demonstrate, held-out success on 512 tasks every 16 updates, checkpoints every 32.

Why these, from pilots on other worlds (`--config.env.task_seed=1`;
results/frozenlake_regime_tuning), on training tasks only:
- The expert's tie-break. With breadth-first search's own order between equally short paths,
  32 and 512 episodes left imitation where a fixed path of moves is (validation success
  0.125-0.25 through 270 steps): which path that order picks is not to be read off the map
  near the agent. Ties broken right, down, left, up (`frozenlake.EXPERT_PREFERENCE`) agree with
  a local rule on 93% of decisions.
- 512 episodes: validation success rises past a fixed path's 0.23 from about step 200, to
  0.4-0.55 by 400 (held-out 0.24, 0.34, 0.31 at steps 200, 300, 400 on 128 tasks). Imitation
  does not go on rising: from step 400 to 800 validation success swings between 0.23 and 0.52,
  held-out 0.23-0.35 (warm_start_pilot_512_800.jsonl), short of the 0.66 a local rule (right if
  free, else down) reaches.
- The target, 0.25: the earlier stop leaves RL more to gain. With 0.35 (held-out 0.371 and
  0.402 on 256 tasks) GRPO at 2e-4 stood at 0.371, 0.410, 0.375, 0.434 after 16-64 updates;
  from the other start 0.305, 0.387, 0.379, 0.344, and 0.348 after 128; with 16 tasks an
  iteration 0.363, 0.355, 0.375, 0.430; at 5e-4 it fell to 0.184. With 0.25 (stopped at step
  80, held-out 0.270) GRPO at 2e-4 stood at 0.320, 0.320, 0.359, 0.359 after 16-64 updates and
  stayed at 0.359 through 128 (`target_0.25`, `target_0.25_it128`); drawing up to three rounds
  of tasks until the batch has signal (`rollout.signal_rounds`) gave 0.320, 0.352, 0.359, 0.363
  (`target_0.25_signal3`); groups of 8 episodes (an env-step budget of 89, `target_0.25_episodes8`)
  0.270, 0.320, 0.359, 0.359; sampling at temperature 1.3 0.270, 0.320, 0.297, 0.320
  (`target_0.25_temp1.3`). At temperature 2 (`target_0.25_temp2`, stopped after 8 iterations)
  almost no episode succeeded: its actions came out garbled.
Not a regime where RL learns yet, at this model's size and budget: every pilot from the 0.25
warm start gained 5-9 points on one seed (13-24 tasks gained, none lost), none past 0.363, the
best standing still from update 48 to 128, with the policy's entropy at 0.1-0.3 nats per token:
short of the 10 points a comparison needs, so no comparison runs on this world.

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
  return base.variant(rooms_regime.warm_start(config, WARM_START_EPISODES, WARM_START_STEPS,
                                              TARGET_SUCCESS), arg)
