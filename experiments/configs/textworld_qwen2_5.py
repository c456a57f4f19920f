"""TextWorld games from a Qwen2.5 checkpoint, one GPU: BPO against its baselines on longer quests.

For a user with a Hugging Face directory of Qwen2.5(-Instruct) (or Llama 3.x). The games are
TextWorld's custom type, larger than `textworld_cpu.py`'s: five rooms, ten objects, quests
of five actions (doors to unlock, containers to open; the expert solves each in 5 commands),
1000 training and 100 held-out games, written once by `COMMAND` (about 4 s a game):

    python scripts/make_textworld_games.py --output workdirs/textworld_qwen_games \\
      --world_size 5 --nb_objects 10 --quest_length 5 \\
      --train_seeds $(seq 1001 2000) --test_seeds $(seq 3001 3100)
    python experiments/run.py --config=experiments/configs/textworld_qwen2_5.py \\
      --workdir=WORKDIR --config.model.checkpoint=QWEN_DIR
    python experiments/compare.py --config=experiments/configs/textworld_qwen2_5.py --seeds=5 \\
      --config.model.checkpoint=QWEN_DIR     # BPO, GRPO, RLOO and GiGPO at matched compute

15 turns (three times the expert's), observations cut at 384 tokens (an opening room is about
160 words), the comparison's trees in four whole episodes of env steps, rank-16 adapters on a
bfloat16 model and no warm start (`base.pretrained`).
"""

import ml_collections

from experiments.configs import base

GAMES = "workdirs/textworld_qwen_games"
COMMAND = (f"python scripts/make_textworld_games.py --output {GAMES} --world_size 5 "
           "--nb_objects 10 --quest_length 5 --train_seeds $(seq 1001 2000) "
           "--test_seeds $(seq 3001 3100)")


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = base.textworld("bpo", games_dir=GAMES)
  c.env.num_train_tasks = 1000
  c.env.num_eval_tasks = c.eval.num_tasks = 100
  c.env.max_turns = 15
  c.env.max_observation_tokens = 384
  c.rollout.max_action_tokens = 24
  c.model.max_length = 8192
  c.rollout.tasks_per_iteration = 16
  base.pretrained(c)
  return base.variant(c, arg)
