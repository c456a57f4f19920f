"""Each world's config builds its from-scratch run in its `:tiny` version: the BPE tokenizer is
trained on the world's text and saved where `AutoTokenizer` loads it, the budgets fit its chat
format, and the warm start's expert episodes, played through that tokenizer, fit the context
(the actions come back out of it unchanged).

WebShop, ALFWorld (generated games) and SWE (the shipped tasks; in worker processes, confined
where the host allows namespaces). Their training runs, two iterations each from a Qwen2 and a
Llama 3.2 checkpoint, are test_checkpoint_worlds.py's; the from-scratch loop itself trains in
the quickstart's tests (test_loop_resume.py, test_multiprocess_loop.py).
"""

import importlib
import os

import pytest
import transformers

from bpo_jax import text
from bpo_jax.sandboxes.swe import confinement
from bpo_jax.training import experiment
from bpo_jax.training import warm_start
from bpo_jax.training.settings import from_config

SWE_OPTIONS = {} if confinement.namespaces_available() else {"confinement": "rlimits-only"}


def _tiny(name, tmp_path):
  config = importlib.import_module(f"experiments.configs.{name}").get_config("tiny")
  if name == "alfworld":
    config.env.options.cache_dir = str(tmp_path / "games")
    config.env.num_train_tasks, config.env.num_eval_tasks = 4, 2
    config.eval.num_tasks = 2
    config.warm_start.num_trajectories = 4
  if name == "swe":
    config.env.options.update(SWE_OPTIONS)
  config.scale.num_devices = 1
  return config


@pytest.mark.slow
@pytest.mark.parametrize("name", ["webshop", "alfworld", "swe"])
def test_tiny_world_config_builds_its_text_and_its_experts_fit(name, tmp_path):
  config = _tiny(name, tmp_path)
  workdir = str(tmp_path / "run")
  exp, _ = experiment.build_experiment(from_config(config), workdir)
  try:
    directory = os.path.join(workdir, text.TOKENIZER_DIR)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    assert tokenizer.chat_template
    assert len(tokenizer) == exp.fmt.vocab_size
    bound = exp.fmt.path_token_bound(config.env.max_turns, config.rollout.max_action_tokens)
    assert bound <= min(config.model.max_length, config.rollout.max_tree_tokens)
    count = min(config.warm_start.num_trajectories, 2)
    episodes = warm_start.expert_episodes(exp, exp.train_tasks[:count])
    assert len(episodes) == count
    for episode in episodes:
      # `:tiny` cuts the turns (to 4), so an expert episode may stop before its reward.
      assert episode.tokens.num_nodes == len(episode.actions) == config.env.max_turns or (
          episode.done and episode.success)
      assert episode.tokens.num_unique_tokens() <= bound  # a chain: its path
      # The actions come back out of the tokenizer as they went in.
      assert all(tokenizer.decode(tokenizer.encode(a, add_special_tokens=False)) == a
                 for a in episode.actions)
  finally:
    exp.close()


@pytest.mark.parametrize("name, missing", [
    ("webshop_qwen2_5", "'data_size' needs data_dir"),
    ("alfworld_qwen2_5", "no ALFWorld data directory for split 'train' in data_path ''"),
])
def test_real_data_configs_validate_and_name_the_missing_data(name, missing):
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f"experiments.configs.{name}").get_config()
  config_lib.validate(config)
  assert config.model.lora_rank > 0 and config.warm_start.num_trajectories == 0
  with pytest.raises((ValueError, FileNotFoundError), match=missing):
    experiment.make_tasks(from_config(config), "train", 2)


def _check_cpu_comparison(get_config, budget: int, baseline: str, **env_options):
  """A world's `<world>_cpu.py` comparison config: valid (with `env_options` in place of its own, say a
  fixture folder for data a fresh checkout lacks), the quickstart's model, an env-step budget of
  exactly 4 whole episodes (`baseline`'s group), BPO's comparison trees, iterations past the warm
  start's tasks; returns the config."""
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top
  from experiments.configs import base  # pylint: disable=g-import-not-at-top
  config = get_config()
  config.env.options.update(env_options)
  config_lib.validate(config)
  default = config_lib.default_config().model
  assert (config.model.hidden_size, config.model.num_layers) == (default.hidden_size, 3)
  assert config.rollout.max_env_steps == 4 * config.env.max_turns == budget
  r = config.rollout
  # A fork charges each live branch the rest of its context: the tree's tokens hold 4 of them.
  assert r.max_tree_tokens >= 4 * config.model.max_length
  assert (r.siblings_fork, r.entropy_threshold, r.max_leaves) == (True, 0.0, 8)
  grouped = base.with_estimator(get_config(), baseline)
  assert translate.rollout_config(from_config(grouped)).episodes_per_group == 4
  # The iterations start on the tasks the warm start did not demonstrate (its first N).
  assert r.task_offset == config.warm_start.num_trajectories > 0
  return config


@pytest.mark.slow
def test_alfworld_cpu_matches_compute_and_its_budgets_hold_the_expert(tmp_path):
  """`alfworld_cpu.py`: the quickstart's model, a baseline group of 4 whole episodes in BPO's
  env-step budget, BPO's comparison settings; on its generated games (a handful, in a fresh
  cache) the expert wins within the turn limit, its episodes fit the context and the tree, and
  the first observation is not cut (its last sentence is the task)."""
  from experiments.configs import alfworld_cpu  # pylint: disable=g-import-not-at-top
  config = _check_cpu_comparison(alfworld_cpu.get_config, 32, "grpo")
  r = config.rollout
  assert config.eval.num_tasks == config.env.num_eval_tasks == 40
  config.env.options.cache_dir = str(tmp_path / "games")
  config.env.num_train_tasks, config.env.num_eval_tasks, config.eval.num_tasks = 6, 2, 2
  config.scale.num_devices = 1
  exp, _ = experiment.build_experiment(from_config(config), str(tmp_path / "run"))
  try:
    bound = exp.fmt.path_token_bound(config.env.max_turns, config.rollout.max_action_tokens)
    assert bound <= config.model.max_length <= config.rollout.max_tree_tokens
    episodes = warm_start.expert_episodes(exp, exp.train_tasks)
    assert len(episodes) == 6
    for episode in episodes:
      assert episode.done and episode.success and 3 <= len(episode.actions) <= 8
      assert episode.tokens.num_unique_tokens() <= bound
      assert max(len(exp.fmt.action_tokens(a)) for a in episode.actions) <= r.max_action_tokens
      first = episode.first_observation.strip()
      assert exp.fmt.observation_text(first, first=True) == first
      assert first.split("\n")[-1].startswith("Your task is to: ")
  finally:
    exp.close()


def test_rooms_d2_holds_every_expert_and_four_whole_episodes():
  """`rooms_d2.py`: difficulty 2 with turns for every expert solution of both splits (3-6
  steps, one spare turn for the longest), a budget of exactly 4 whole episodes (a baseline's
  group), BPO's comparison settings."""
  from bpo_jax.sandboxes import rooms  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top
  from experiments.configs import base, rooms_d2  # pylint: disable=g-import-not-at-top
  config = rooms_d2.get_config()
  config_lib.validate(config)
  assert config.env.options.difficulty == 2 and config.env.max_turns == 7
  assert config.rollout.max_env_steps == 4 * 7 == 28
  r = config.rollout
  assert (r.siblings_fork, r.entropy_threshold, r.max_leaves) == (True, 0.0, 8)
  rloo = base.with_estimator(rooms_d2.get_config(), "rloo")
  assert translate.rollout_config(from_config(rloo)).episodes_per_group == 4
  for split, num in (("train", config.env.num_train_tasks), ("test", config.env.num_eval_tasks)):
    lengths = {len(rooms.expert_actions(t))
               for t in rooms.make_tasks(split, num=num, seed=config.env.task_seed, difficulty=2)}
    assert min(lengths) >= 3 and max(lengths) <= config.env.max_turns - 1, (split, lengths)
  with pytest.raises(ValueError, match="unknown config argument 'd3': tiny, or none"):
    rooms_d2.get_config("d3")


def test_textworld_cpu_holds_every_expert_and_four_whole_episodes(tmp_path):
  """`textworld_cpu.py`: the quickstart's model, a budget of exactly 4 whole episodes (a
  baseline's group), BPO's comparison settings; on the
  fixture games the expert wins within the turn limit, its episodes fit the context and the
  tree, and the observation cut keeps the quest (the opening paragraph)."""
  from experiments.configs import textworld_cpu  # pylint: disable=g-import-not-at-top
  fixtures = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                          "textworld_games")
  assert textworld_cpu.get_config().env.options.games_dir == textworld_cpu.GAMES
  assert f"--output {textworld_cpu.GAMES} " in textworld_cpu.COMMAND
  config = _check_cpu_comparison(textworld_cpu.get_config, 20, "gigpo", games_dir=fixtures)
  config.env.num_train_tasks, config.env.num_eval_tasks, config.eval.num_tasks = 2, 1, 1
  config.warm_start.num_trajectories = 2
  config.scale.num_devices = 1
  exp, _ = experiment.build_experiment(from_config(config), str(tmp_path / "run"))
  try:
    bound = exp.fmt.path_token_bound(config.env.max_turns, config.rollout.max_action_tokens)
    assert bound <= config.model.max_length <= config.rollout.max_tree_tokens
    episodes = warm_start.expert_episodes(exp, exp.train_tasks)
    assert len(episodes) == 2
    for episode in episodes:
      assert episode.done and episode.success and len(episode.actions) == 3
      assert episode.tokens.num_unique_tokens() <= bound
      quest = episode.first_observation.strip().split("\n")[0]
      assert exp.fmt.observation_text(episode.first_observation, first=True).startswith(quest)
  finally:
    exp.close()
  with pytest.raises(ValueError, match="unknown config argument 'gpu': tiny, or none"):
    textworld_cpu.get_config("gpu")


def test_webshop_cpu_matches_compute_and_starts_on_undemonstrated_goals(tmp_path):
  """`webshop_cpu.py`: the quickstart's model, a baseline group of 4 whole episodes in BPO's
  env-step budget, BPO's comparison settings, iterations that start on the first goal the warm
  start does not demonstrate; on a handful of its shop's goals the expert buys within the turn
  limit and its episodes fit the context and the tree."""
  from experiments.configs import webshop_cpu  # pylint: disable=g-import-not-at-top
  config = _check_cpu_comparison(webshop_cpu.get_config, 24, "rloo")
  r = config.rollout
  assert r.task_offset == config.warm_start.num_trajectories == 256
  assert config.env.num_train_tasks - r.task_offset == 64
  config.env.num_train_tasks, config.env.num_eval_tasks, config.eval.num_tasks = 6, 2, 2
  config.warm_start.num_trajectories = r.task_offset = 4
  config.scale.num_devices = 1
  exp, _ = experiment.build_experiment(from_config(config), str(tmp_path / "run"))
  try:
    bound = exp.fmt.path_token_bound(config.env.max_turns, r.max_action_tokens)
    assert bound <= config.model.max_length <= r.max_tree_tokens
    episodes = warm_start.expert_episodes(exp, exp.train_tasks)
    assert len(episodes) == 6
    for episode in episodes:
      assert episode.done and episode.success and len(episode.actions) <= config.env.max_turns
      assert episode.tokens.num_unique_tokens() <= bound
      assert max(len(exp.fmt.action_tokens(a)) for a in episode.actions) <= r.max_action_tokens
  finally:
    exp.close()


@pytest.mark.parametrize("name, episodes", [
    ("rooms_qwen2_5", 4), ("textworld_qwen2_5", 4), ("webshop_qwen2_5", 4),
    ("alfworld_qwen2_5", 8)])
def test_pretrained_configs_are_comparisons_at_matched_compute(name, episodes):
  """The `<world>_qwen2_5.py` files: a checkpoint from the command line with rank-16 adapters in
  bfloat16, no warm start, BPO's comparison trees, and an env-step budget of exactly `episodes`
  whole episodes, which each baseline's group then holds."""
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import translate  # pylint: disable=g-import-not-at-top
  from experiments.configs import base  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(f"experiments.configs.{name}")
  config = module.get_config()
  if name == "textworld_qwen2_5":
    with pytest.raises(config_lib.ConfigError, match=(
        f"env.options.games_dir = '{module.GAMES}': no such directory .*"
        "make_textworld_games.py")):
      config_lib.validate(config)
    assert f"--output {module.GAMES} " in module.COMMAND
    config.env.options.games_dir = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                                "fixtures", "textworld_games")
  config_lib.validate(config)
  m = config.model
  assert (m.checkpoint, m.dtype, m.lora_rank) == ("", "bfloat16", 16)
  assert config.warm_start.num_trajectories == 0
  r = config.rollout
  assert (r.estimator, r.siblings_fork, r.entropy_threshold, r.max_leaves) == ("bpo", True, 0.0, 8)
  assert r.max_env_steps == episodes * config.env.max_turns
  assert r.max_tree_tokens == episodes * config.model.max_length
  for baseline in ("grpo", "rloo", "gigpo"):
    grouped = base.with_estimator(module.get_config(), baseline)
    assert translate.rollout_config(from_config(grouped)).episodes_per_group == episodes
  if name == "rooms_qwen2_5":
    from experiments.configs import rooms_d2  # pylint: disable=g-import-not-at-top
    d2 = rooms_d2.get_config()
    assert dict(config.env.options) == dict(d2.env.options)
    assert (config.env.max_turns, r.max_env_steps) == (d2.env.max_turns, d2.rollout.max_env_steps)
