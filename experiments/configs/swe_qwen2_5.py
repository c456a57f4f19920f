"""SWE-bench instances from local clones, a Qwen2.5 checkpoint, one GPU: BPO trees on real repos.

For a user with the data on disk: SWE-bench rows (e.g. SWE-bench Verified as JSON lines, in
swebench 5's form with each row's `eval_script` and `log_parser`, or with a specs file giving
`test_cmd`, `log_parser` and `install` per repository and version; see
bpo_jax/sandboxes/swe/instances.py), a clone of each repository at REPOS/<owner>__<name>, a
directory where each (repository, environment_setup_commit) gets its Python environment, built
once (the install steps may use the network; the tests never do), and a Hugging Face directory
of Qwen2.5(-Coder)(-Instruct). Nothing is downloaded at run time.

    python experiments/run.py --config=experiments/configs/swe_qwen2_5.py --workdir=WORKDIR \\
      --config.env.options.instances=verified.jsonl --config.env.options.repos_dir=REPOS \\
      --config.env.options.envs_dir=ENVS --config.model.checkpoint=QWEN_DIR
      [--config.env.options.specs=specs.json] [--config.env.options.eval_instances=held_out.jsonl]

The train split is the rows of `instances`, the eval split those of `eval_instances` (default:
the same rows). Low-rank adapters on a bfloat16 model keep a 7B checkpoint on one GPU; the hidden
tests are applied only when `submit` grades, as SWE-bench asks.
"""

import ml_collections

from experiments.configs import base
from experiments.configs import swe


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = swe.get_config()
  c.env.options = ml_collections.ConfigDict({
      "instances": "", "eval_instances": "", "repos_dir": "", "envs_dir": "", "specs": "",
      "max_steps": 30, "show_tests": False, "confinement": "namespaces",
      # Real test suites take minutes, not the shipped tasks' seconds.
      "grading_limits": {"wall_seconds": 900.0, "cpu_seconds": 1800}})
  c.env.num_train_tasks = 64
  c.env.num_eval_tasks = 16
  c.env.max_turns = 30
  c.env.num_workers = 8
  c.env.timeout_s = 1200.0
  c.env.max_observation_tokens = 1024
  c.rollout.max_action_tokens = 1024
  c.rollout.tasks_per_iteration = 4
  c.rollout.max_tree_tokens = 131072
  c.model.max_length = 32768
  c.model.checkpoint = ""
  c.model.dtype = "bfloat16"
  c.model.lora_rank = 16
  c.warm_start.num_trajectories = 0  # a pretrained checkpoint needs no warm start
  c.train.learning_rate = 1e-5
  c.eval.num_tasks = 16
  return base.variant(c, arg)
