"""The experiment configuration: each invalid case gives a message naming its key."""

import copy
import dataclasses
import importlib
import os

import ml_collections
import pytest

from bpo_jax.training import config as config_lib
from bpo_jax.training import estimator_registry
from bpo_jax.training import translate
from bpo_jax.training.settings import from_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _problems(config, **kwargs):
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.validate(config, **kwargs)
  return info.value.problems


def test_default_config_is_valid():
  config_lib.validate(config_lib.default_config())


@pytest.mark.parametrize("estimator", estimator_registry.names())
def test_every_estimator_is_allowed(estimator):
  config = config_lib.default_config()
  config.rollout.estimator = estimator
  config_lib.validate(config)


def test_unknown_key_names_the_key_and_the_known_keys():
  config = config_lib.default_config()
  config.train.unlock()
  config.train.learning_rat = 0.1
  (problem,) = _problems(config)
  assert problem.startswith("train.learning_rat: unknown key; known keys under 'train': ")
  assert "learning_rate" in problem


def test_unknown_top_level_section():
  config = config_lib.default_config()
  config.optimiser = ml_collections.ConfigDict({"lr": 1.0})
  (problem,) = _problems(config)
  assert problem.startswith("optimiser: unknown key; known keys at the top level: ")


def test_missing_key():
  config = config_lib.default_config()
  del config.rollout["k"]
  assert _problems(config) == ["rollout.k: missing"]


@pytest.mark.parametrize("path,value,expected", [
    ("rollout.k", "4", "int"),
    ("rollout.k", 4.0, "int"),
    ("rollout.k", True, "int"),           # a bool is never an int
    ("train.learning_rate", "fast", "float"),
    ("log.tensorboard", 1, "bool"),
    ("rollout.estimator", 3, "str"),
    ("rollout.group_normalize_std", 1, "bool"),
    ("rollout.group_std_ddof", 1.0, "int"),
])
def test_wrong_type(path, value, expected):
  config = ml_collections.ConfigDict(config_lib.default_config().to_dict(), type_safe=False)
  section, key = path.split(".")
  config[section][key] = value
  (problem,) = _problems(config)
  assert problem == (f"{path} = {value!r}: must be of type {expected}, got "
                     f"{type(value).__name__}")


def test_int_is_a_float():
  config = config_lib.default_config()
  config.train.learning_rate = 1
  config_lib.validate(config)


def test_unknown_estimator_lists_the_allowed_ones():
  config = config_lib.default_config()
  config.rollout.estimator = "ppo"
  assert _problems(config) == [
      "rollout.estimator = 'ppo': must be one of 'bpo', 'rloo', 'grpo', 'gigpo'"]


def test_unknown_entropy_measure_lists_the_allowed_ones():
  config = config_lib.default_config()
  config.rollout.entropy_measure = "last_token"
  assert _problems(config) == [
      "rollout.entropy_measure = 'last_token': must be one of 'first_token', 'greedy_action'"]


@pytest.mark.parametrize("k", [1, 0, -3])
def test_k_below_two(k):
  config = config_lib.default_config()
  config.rollout.k = k
  config.rollout.max_leaves = 8
  assert _problems(config) == [
      f"rollout.k = {k}: must be >= 2 (a fork needs at least two siblings)"]


def test_leaf_budget_cannot_hold_one_fork():
  config = config_lib.default_config()
  config.rollout.k = 4
  config.rollout.max_leaves = 3
  assert _problems(config) == [
      "rollout.max_leaves = 3: cannot hold one fork of rollout.k = 4 siblings; set "
      "max_leaves >= k"]


@pytest.mark.parametrize("root_k,expected", [
    (1, "rollout.root_k = 1: a fork needs at least two siblings (0 = rollout.k)"),
    (-3, "rollout.root_k = -3: must be >= 0 (0 = rollout.k)"),
    (5, "rollout.max_leaves = 4: cannot hold the root's fork of rollout.root_k = 5 siblings; "
        "set max_leaves >= root_k")])
def test_root_k(root_k, expected):
  config = config_lib.default_config()
  config.rollout.root_k = root_k
  assert _problems(config) == [expected]
  config.rollout.root_k = 4  # as many as the leaves hold
  config_lib.validate(config)
  assert translate.rollout_config(from_config(config)).siblings_at(0) == 4
  assert translate.rollout_config(from_config(config)).siblings_at(1) == 2
  config.rollout.root_k = 0  # rollout.k at the root too
  assert translate.rollout_config(from_config(config)).root_k == 0


def test_saved_differences_name_what_changed_but_not_a_new_key_at_its_default():
  current = config_lib.to_plain(config_lib.default_config())
  saved = copy.deepcopy(current)
  del saved["rollout"]["root_k"]           # saved before the key existed
  saved["train"]["learning_rate"] = 0.5
  saved["old_section"] = {"gone": 1}
  assert config_lib.saved_differences(saved, current) == {
      "old_section.gone": (1, None),
      "train.learning_rate": (0.5, current["train"]["learning_rate"])}
  assert list(config_lib.saved_differences(saved, current, ignore=("old_section.gone",))) == [
      "train.learning_rate"]
  current["rollout"]["root_k"] = 3         # not its default: the saved run is another one
  assert "rollout.root_k" in config_lib.saved_differences(saved, current)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo"])
def test_a_baseline_group_holds_what_fits_the_env_step_budget(estimator):
  config = config_lib.default_config()
  config.rollout.estimator = estimator
  assert config_lib.group_episodes(config) == 2          # the fixed default
  config.rollout.group_size = 0
  config.rollout.max_env_steps = 14                      # max_turns = 5: two whole episodes
  config_lib.validate(config)
  assert config_lib.group_episodes(config) == 2
  rollout_config = translate.rollout_config(from_config(config))
  assert (rollout_config.topology, rollout_config.episodes_per_group) == ("group", 2)
  config.rollout.max_env_steps = 15
  assert translate.rollout_config(from_config(config)).episodes_per_group == 3
  # The dry run's sampler decodes the 16 tasks' 3 episodes at once (not max_leaves = 4 each).
  from bpo_jax.training import dry_run  # pylint: disable=g-import-not-at-top
  assert dry_run.shapes_from_config(from_config(config))["decode_batch"] == 16 * 3
  config.rollout.max_env_steps = 9
  assert _problems(config) == [
      "rollout.max_env_steps = 9: holds 1 whole episode(s) of env.max_turns = 5 steps; "
      "rollout.group_size = 0 needs at least 2 (set max_env_steps >= 2 x max_turns, or a fixed "
      "group_size)"]
  config.rollout.group_size = 1
  assert _problems(config) == [
      "rollout.group_size = 1: a group needs at least 2 episodes (0 = as many as fit "
      "rollout.max_env_steps)"]
  config.rollout.group_size = -1
  assert _problems(config) == [
      "rollout.group_size = -1: must be >= 0 (0 = as many episodes as fit "
      "rollout.max_env_steps)"]


@pytest.fixture(scope="module")
def rooms_format(tmp_path_factory):
  """The default config's chat format: a BPE tokenizer trained on rooms' text."""
  from bpo_jax import text  # pylint: disable=g-import-not-at-top
  from bpo_jax.sandboxes import rooms  # pylint: disable=g-import-not-at-top
  tasks = rooms.make_tasks("train", num=16, seed=0, difficulty=1)
  return text.build_text("rooms", str(tmp_path_factory.mktemp("rooms_text")), tasks,
                         env_options={"difficulty": 1}, max_observation_tokens=40)[1]


def _text_problems(config, fmt) -> list[str]:
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.check_text_budgets(config, fmt)
  return info.value.problems


def test_path_bound_counts_the_template_tokens(rooms_format):
  config = config_lib.default_config()
  fmt = rooms_format
  bound = config_lib.path_token_bound(config, fmt)
  # The prompt (its overhead + 40 observation tokens), 5 replies of 5 tokens, and 4 observations
  # between them, each with its overhead, the end-of-turn token of a cut reply and 40 tokens.
  assert bound == fmt.prompt_overhead + 40 + 5 * 5 + 4 * (fmt.observation_overhead + 1 + 40)
  assert bound <= config.model.max_length
  config_lib.check_text_budgets(config, fmt)
  uncut = dataclasses.replace(fmt, max_observation_tokens=None)
  assert config_lib.path_token_bound(config, uncut) is None
  config_lib.check_text_budgets(config, uncut)  # no bound, nothing to check


def test_context_cannot_hold_one_path(rooms_format):
  config = config_lib.default_config()
  config.model.max_length = 128
  (problem,) = _text_problems(config, rooms_format)
  assert problem.startswith("model.max_length = 128: cannot hold one path of env.max_turns = 5")
  assert "rollout.max_action_tokens = 5" in problem


def test_env_step_and_token_budgets(rooms_format):
  config = config_lib.default_config()
  config.rollout.k = 4
  config.rollout.max_env_steps = 3
  config.rollout.max_tree_tokens = 10
  problems = _problems(config)
  assert problems[0].startswith("rollout.max_env_steps = 3: cannot hold one step of each of "
                                "rollout.k = 4")
  assert problems[1].startswith("rollout.max_tree_tokens = 10: cannot hold one step of each")
  (problem,) = _text_problems(config, rooms_format)
  assert problem.startswith("rollout.max_tree_tokens = 10: cannot hold one path of "
                            "env.max_turns = 5 steps")


def test_tree_token_budget_must_hold_one_path(rooms_format):
  config = config_lib.default_config()
  bound = config_lib.path_token_bound(config, rooms_format)
  config.rollout.max_tree_tokens = bound - 1
  (problem,) = _text_problems(config, rooms_format)
  assert problem.startswith(f"rollout.max_tree_tokens = {bound - 1}: cannot hold one path of "
                            f"env.max_turns = 5 steps (up to {bound} tokens")
  config.rollout.max_tree_tokens = bound
  config_lib.check_text_budgets(config, rooms_format)


CONFIG_FILES = sorted(
    f for f in os.listdir(os.path.join(REPO, "experiments", "configs"))
    if f.endswith(".py") and f not in ("__init__.py", "base.py")
    and not f.startswith("pod_"))


# Config files whose data a command writes (their docstrings give it), which a fresh checkout
# lacks: the fixture data stands in for validation.
_FIXTURE_GAMES = {"games_dir": os.path.join(REPO, "tests", "fixtures", "textworld_games")}
GENERATED_DATA = {"textworld_qwen2_5.py": _FIXTURE_GAMES, "textworld_cpu.py": _FIXTURE_GAMES}


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_config_file_has_a_tiny_version(name):
  """`--config=FILE:tiny`: ml_collections passes "tiny" to get_config; the result validates and
  differs from the full config only in the run's length (the pod configs' tiny versions keep
  their multi-host settings, which two tasks per iteration cannot feed)."""
  module = importlib.import_module(f"experiments.configs.{name[:-3]}")
  full, tiny = module.get_config(), module.get_config("tiny")
  for config in (full, tiny):
    config.env.options.update(GENERATED_DATA.get(name, {}))
  config_lib.validate(full)
  config_lib.validate(tiny)
  assert tiny.model.num_layers == 1 and tiny.train.iterations == 2
  assert tiny.env.name == full.env.name and dict(tiny.env.options) == dict(full.env.options)
  assert tiny.rollout.estimator == full.rollout.estimator
  assert tiny.env.max_turns == min(full.env.max_turns, 4)
  with pytest.raises(ValueError, match="unknown config argument 'huge'"):
    module.get_config("huge")


def test_loo_trunk_baseline_needs_two_trees_per_task():
  config = config_lib.default_config()
  config.rollout.trunk_baseline = "loo"
  (problem,) = _problems(config)
  assert problem.startswith("rollout.trunk_baseline = 'loo': needs rollout.trees_per_task >= 2")
  config.rollout.trees_per_task = 2
  config_lib.validate(config)


def test_ranges_and_several_problems_at_once():
  config = config_lib.default_config()
  config.train.learning_rate = 0.0
  config.rollout.top_p = 1.5
  config.eval.num_tasks = 1000
  config.model.num_heads = 3
  config.model.kv_page_size = -1
  problems = _problems(config)
  assert "model.kv_page_size = -1: must be >= 0 (0 = the dense KV cache)" in problems
  assert "train.learning_rate = 0.0: must be > 0" in problems
  assert "rollout.top_p = 1.5: must be in (0, 1]" in problems
  assert any(p.startswith("eval.num_tasks = 1000: more than") for p in problems)
  assert "model.num_heads = 3: must be a multiple of model.num_kv_heads = 2" in problems


@pytest.mark.parametrize("path,value,expected", [
    ("rollout.group_std_ddof", 2,
     "rollout.group_std_ddof = 2: must be in [0, 1] (0 = population std, 1 = unbiased)"),
    ("rollout.group_std_ddof", -1,
     "rollout.group_std_ddof = -1: must be in [0, 1] (0 = population std, 1 = unbiased)"),
    ("rollout.group_std_eps", -0.0001, "rollout.group_std_eps = -0.0001: must be >= 0.0"),
    ("rollout.gigpo_step_weight", -1.0, "rollout.gigpo_step_weight = -1.0: must be >= 0.0"),
    ("rollout.gigpo_step_gamma", 1.5, "rollout.gigpo_step_gamma = 1.5: must be in [0.0, 1.0]"),
])
def test_group_normalisation_and_gigpo_keys(path, value, expected):
  config = config_lib.default_config()
  config.rollout.estimator = "gigpo"
  section, key = path.split(".")
  config[section][key] = value
  assert _problems(config) == [expected]


def test_group_normalisation_settings_of_trl_and_the_gigpo_paper_are_valid():
  config = config_lib.default_config()
  config.rollout.estimator = "gigpo"
  config.rollout.group_std_ddof, config.rollout.group_std_eps = 1, 1e-4
  config.rollout.gigpo_step_gamma, config.rollout.group_normalize_std = 0.95, False
  config_lib.validate(config)


def test_environment_name_and_options():
  config = config_lib.default_config()
  config.env.name = "nethack"
  (problem,) = _problems(config)
  assert problem.startswith("env.name = 'nethack': must be one of [")
  config = config_lib.default_config()
  config.env.options.difficulty = 9
  assert _problems(config) == ["env.options.difficulty = 9: must be one of 1, 2, 3, 4, 5"]
  config = config_lib.default_config()
  config.env.options.colour = "red"
  assert _problems(config) == ["env.options.colour: unknown option for rooms; known: difficulty"]


def test_eval_needs_an_existing_checkpoint_directory(tmp_path):
  config = config_lib.default_config()
  workdir = str(tmp_path / "run")
  (problem,) = _problems(config, mode="eval", workdir=workdir)
  assert problem.startswith(f"workdir = {workdir!r}: no checkpoint directory")
  os.makedirs(os.path.join(workdir, "checkpoints"))
  config_lib.validate(config, mode="eval", workdir=workdir)


def test_unknown_mode():
  assert _problems(config_lib.default_config(), mode="serve") == [
      "mode = 'serve': must be one of train, eval, export"]


@pytest.mark.parametrize("arg,expected", [
    ("--config.train.lr=3", "train.lr: unknown key; known keys under 'train': "),
    ("--config.zz=1", "zz: unknown key; known keys at the top level: "),
    ("--config.seed.x=1", "seed.x: unknown key; known keys under 'seed': (none: not a section)"),
    ("--config.rollout.k=four", "rollout.k = 'four': must be of type int"),
    ("--config.train.learning_rate=fast", "train.learning_rate = 'fast': must be of type float"),
    ("--config.log.tensorboard=maybe", "log.tensorboard = 'maybe': must be of type bool"),
    ("--config.train=1", "train: is a section, not a value"),
])
def test_describe_override_error(arg, expected):
  message = config_lib.describe_override_error(["run.py", "--workdir=x", arg],
                                               config_lib.default_config())
  assert message.startswith(expected)


def test_describe_override_error_blames_nothing_for_good_overrides():
  assert config_lib.describe_override_error(
      ["--config.rollout.k=3", "--config.log.tensorboard=false"],
      config_lib.default_config()) is None


ESTIMATOR_CONFIGS = [("quickstart", "bpo")] + [(world, estimator) for world in ("rooms", "textworld")
                                               for estimator in estimator_registry.names()]


@pytest.mark.parametrize("name,estimator", ESTIMATOR_CONFIGS)
def test_experiment_config_files_are_valid(name, estimator):
  import importlib  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if root not in sys.path:
    sys.path.insert(0, root)
  from experiments.configs import base  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(f"experiments.configs.{name}")
  assert module.get_config().rollout.estimator == "bpo"
  # The estimator is a key: compare.py's --estimators sets it through `with_estimator`.
  config = base.with_estimator(module.get_config(), estimator)
  config_lib.validate(config)
  world = "rooms" if name == "quickstart" else name
  # Every method of a comparison has the world's env-step budget; a baseline rolls what fits
  # (base.py). The quickstart is the library defaults as they are.
  budget = (config_lib.default_config().rollout.max_env_steps if name == "quickstart"
            else getattr(base, f"{world.upper()}_ENV_STEPS"))
  assert config.rollout.max_env_steps == budget
  if estimator != "bpo":
    assert config.rollout.group_size == 0
    # Rooms: 24 env steps of 5-turn episodes (4 whole ones); TextWorld: 16 of 8-turn episodes.
    assert config_lib.group_episodes(config) == {"rooms": 4, "textworld": 2}[world]
