"""The experiment configuration: its keys, their types and allowed values, checked in one place.

`default_config()` is the schema: every key a configuration may hold, with a value of the type
it must have. Config files (`experiments/configs/*.py`) start from it and change values;
`validate(config, mode, workdir)` then checks, before any compute,

* that every key is known (a misspelt key is an error, not a silently ignored setting),
* that every value has its key's type (an int where a float is expected is fine; a bool is never
  an int),
* that every float is finite (`float_keys()` lists them; NaN and Inf compare false with every
  bound, so a range alone would let them through),
* allowed values and ranges (estimator names, K >= 2, positive sizes, a `rollout.gamma` the
  estimators accept, ...),
* that the budgets can hold one tree (a fork of K siblings),
* sizes the model and this host's memory can hold (`bounds.py`: the KV cache, the tasks, the
  trees, the weights),
* that the workdir can be written (training and evaluation write there): a directory, or a
  path whose nearest existing ancestor is one, where a file can be created,
* for evaluation, that the checkpoint directory exists.

The budgets that need the tokenizer's token counts (a path of `max_turns` steps in the context
and in the tree) are checked once the run has built its chat format: `check_text_budgets`.

Every problem found is reported in one `ConfigError`, each naming its key and what is allowed
(one problem is one line):

  >>> config = default_config()
  >>> config.rollout.k = 1
  >>> validate(config)
  ConfigError: invalid configuration: rollout.k = 1: must be >= 2 (a fork needs at least two
  siblings)

Sections:
  env        which environment, its task splits and options
  model      an HF checkpoint to start from or the from-scratch decoder's shape, LoRA, and the
             context (KV cache) length
  warm_start supervised warm start on expert trajectories
  rollout    estimator, branching factor, fork rule and per-tree budgets
  train      the optimiser and the policy-gradient update
  checkpoint how often to save and how many to keep
  eval       held-out evaluation
  log        console, JSONL and TensorBoard output
  scale      mesh, parameter precision, remat, multi-host settings and the pod dry run's target
"""

from __future__ import annotations

import importlib.util
import math
import os
import tempfile
import threading
from typing import Any, Sequence

import ml_collections

from bpo_jax.training import bounds
from bpo_jax.training import chips as chips_lib
from bpo_jax.training import estimator_registry

# The online rules of `rollout.FORK_RULES`, the ones a training run may use ("never" is the
# evaluation's single episode; "top_k_after" is biased, for comparisons only).
TRAINING_FORK_RULES = ("entropy", "random")
ENTROPY_MEASURES = ("first_token", "greedy_action")
TRUNK_BASELINES = ("zero", "loo", "batch")
NORMALIZATIONS = ("tree", "token")
ARCHITECTURES = ("qwen2", "llama")
DTYPES = ("float32", "bfloat16")
MODES = ("train", "eval", "export")
REMAT_POLICIES = ("none", "full", "dots")
# `ModelConfig` presets a config may name in `scale.model_preset` (models/config.py).
MODEL_PRESETS = ("tiny", "tiny_llama", "qwen2_5_0_5b", "qwen2_5_1_5b", "qwen2_5_3b", "qwen2_5_7b",
                 "llama3_2_1b", "llama3_1_8b")


class ConfigError(ValueError):
  """An invalid configuration; the message names every offending key."""

  def __init__(self, problems: Sequence[str]):
    self.problems = list(problems)
    if len(self.problems) == 1:
      super().__init__(f"invalid configuration: {self.problems[0]}")
    else:
      super().__init__("invalid configuration:\n  " + "\n  ".join(self.problems))


def default_config() -> ml_collections.ConfigDict:
  """The schema and default values of an experiment (the quickstart's world, a tiny model)."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.env = ml_collections.ConfigDict()
  c.env.name = "rooms"
  c.env.num_train_tasks = 256      # the training split's size; tasks are drawn from it in order
  c.env.num_eval_tasks = 64        # the held-out split's size
  c.env.task_seed = 0              # which worlds the splits hold
  c.env.max_turns = 5              # steps per episode before truncation
  c.env.num_workers = 0            # sandbox worker processes; 0 runs sandboxes in-process
  c.env.timeout_s = 30.0           # per sandbox call (worker processes only)
  # Where the sandbox workers run (sandboxes/pool.py, sandboxes/ray_pool.py).
  c.env.pool = ml_collections.ConfigDict({
      "backend": "processes",      # "processes" on this host, or "ray": Ray actors on any node
      "ray_address": "",           # "" starts a local Ray; "auto" or "host:port" joins a cluster
      "cpus_per_worker": 1.0,      # CPUs each Ray actor asks for
      "ray_resource": "sandbox_node",  # a node must offer it to hold sandboxes; "" = any node
  })
  c.env.max_observation_tokens = 40  # observations cut to this many tokens; 0 = no limit
  # Environment-specific keyword arguments for make_sandbox / make_tasks (e.g. rooms'
  # `difficulty`, TextWorld's `games_dir`); checked per environment in `_check_env_options`.
  c.env.options = ml_collections.ConfigDict({"difficulty": 1})

  c.model = ml_collections.ConfigDict()
  c.model.architecture = "qwen2"
  c.model.hidden_size = 128
  c.model.intermediate_size = 384
  c.model.num_layers = 3
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 32
  # context = KV cache slots per row; a path of env.max_turns steps takes up to 310 tokens in the
  # quickstart's chat format (`ChatFormat.path_token_bound`)
  c.model.max_length = 320
  # 0 = the dense KV cache (max_length slots per row); n > 0 = a paged cache of n-slot pages
  # whose forks share pages (models/paged.py); one device only (no scale.mesh)
  c.model.kv_page_size = 0
  c.model.dtype = "float32"
  # A Hugging Face model directory; "" = from scratch (a BPE tokenizer trained on the
  # environment's text). When set, the tokenizer, chat template and stop tokens are the
  # checkpoint's, and its config.json decides the model's shape (the shape keys above are then
  # ignored) and its weights start the run.
  c.model.checkpoint = ""
  # > 0: low-rank adapters on the attention and MLP projections; only they train (models/lora.py)
  c.model.lora_rank = 0
  c.model.lora_alpha = 16.0

  c.warm_start = ml_collections.ConfigDict()
  # Expert episodes on training tasks; 0 = no warm start. 32 episodes and 200 steps were chosen
  # on training-task success with the chat format (docs/RESULTS.md): 16 episodes over 100 steps
  # memorised their tasks (greedy success 0.25 on other training tasks after 40 iterations),
  # 64 over 100 steps underfitted (0.0), 32 over 200 steps reached 1.0 after 60 iterations.
  c.warm_start.num_trajectories = 32
  c.warm_start.steps = 200
  c.warm_start.batch_size = 16
  c.warm_start.learning_rate = 3e-3
  # > 0: stop at the first check whose success on validation_tasks training tasks (the last
  # of the seeded order) reaches it, checked every check_every steps, at most `steps`; 0: run
  # all `steps`. Its episodes are sampled at target_temperature (0: greedy; the rollouts'
  # rollout.temperature measures the policy the iterations will sample from).
  c.warm_start.target_success = 0.0
  c.warm_start.target_temperature = 0.0
  c.warm_start.check_every = 10
  c.warm_start.validation_tasks = 64

  c.rollout = ml_collections.ConfigDict()
  c.rollout.estimator = "bpo"
  c.rollout.tasks_per_iteration = 16
  # Iteration i draws positions [offset + (i-1)·T, offset + i·T) of the seeded task order; the
  # warm start demonstrates positions [0, warm_start.num_trajectories), so an offset of that many
  # starts the iterations on the training tasks it did not demonstrate.
  c.rollout.task_offset = 0
  c.rollout.trees_per_task = 1     # >= 2 for the leave-one-out trunk baseline
  # Rounds of T fresh tasks an iteration may draw so that its batch carries signal: 1 keeps the
  # first round whatever its returns; R > 1 draws until T tasks have leaves whose returns differ
  # (or R rounds are drawn), the same rule for every estimator, and keeps those (then, if short,
  # the first without), every round's env steps and tokens counted (`iteration.grow_rounds`).
  c.rollout.signal_rounds = 1
  c.rollout.k = 2                  # siblings per fork (BPO)
  c.rollout.root_k = 0             # siblings at the tree's root fork (0 = rollout.k)
  # Episodes per task of a baseline (topology "group"): > 0 that many (>= 2); 0 as many whole
  # episodes as fit in rollout.max_env_steps at the worst case, max_env_steps // env.max_turns
  # (compute matched to BPO's env-step budget by construction, docs/DESIGN.md §3).
  c.rollout.group_size = 2
  c.rollout.fork_rule = "entropy"
  # the entropy at a state: "first_token" (of the action's first token) or "greedy_action" (the
  # token entropies summed along the greedy action; one extra greedy decode per turn)
  c.rollout.entropy_measure = "first_token"
  c.rollout.entropy_threshold = 0.5  # fork where the state's entropy exceeds this (nats)
  # > 0: after each iteration the threshold moves to this quantile of the iteration's state
  # entropies (an average over iterations, `branching.update_quantile_threshold`); the
  # threshold an iteration uses depends only on earlier iterations, so forks stay unbiased.
  c.rollout.entropy_quantile = 0.8
  c.rollout.fork_probability = 0.3   # the random rule's chance of forking at a step
  # whether branches started at a fork may fork too (else only the backbone forks); either is
  # an online rule (docs/DESIGN.md §3)
  c.rollout.siblings_fork = False
  c.rollout.max_leaves = 4         # per tree
  # per tree, prompt + actions + observations; the worst-case accounting charges each live branch
  # the rest of the context (model.max_length), so 512 held only one fork of two branches
  c.rollout.max_tree_tokens = 1024
  c.rollout.max_env_steps = 64     # per tree
  c.rollout.max_action_tokens = 5
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  # "batch": the leave-one-out mean root value of the iteration's other trees (zero left the
  # trunk's advantage equal to its 0/1 return)
  c.rollout.trunk_baseline = "batch"
  c.rollout.gamma = 1.0
  # GRPO's and GiGPO's group normalisation (docs/DESIGN.md §3): divide the centred returns by
  # the group's std with `group_std_ddof` degrees of freedom removed, plus `group_std_eps`.
  # 0 and 1e-6 read the GRPO paper (the population std); TRL takes 1 and 1e-4, verl 1 and 1e-6.
  c.rollout.group_normalize_std = True
  c.rollout.group_std_ddof = 0
  c.rollout.group_std_eps = 1e-6
  # GiGPO: A = A^episode + gigpo_step_weight · A^step, the step-level returns discounted by
  # gigpo_step_gamma (the GiGPO paper: weight 1, discount 0.95; 1 keeps undiscounted returns)
  c.rollout.gigpo_step_weight = 1.0
  c.rollout.gigpo_step_gamma = 1.0

  c.train = ml_collections.ConfigDict()
  c.train.iterations = 60
  c.train.learning_rate = 2e-4
  c.train.weight_decay = 0.0
  c.train.max_grad_norm = 1.0
  c.train.epochs = 1                # PPO epochs: optimizer steps on each iteration's batch
  c.train.micro_batches = 2        # gradient accumulation; also the gradient-variance sample
  c.train.clip_epsilon = 0.2
  c.train.kl_coef = 0.0
  c.train.normalization = "tree"
  # Iterations in a row whose update is skipped (a NaN or Inf loss or gradient) before the run
  # stops with an error: a run that keeps skipping learns nothing. 0 = never stop.
  c.train.max_skipped_updates = 3

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 5           # iterations
  c.checkpoint.keep = 2

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 20                # iterations; 0 = only before and after training
  c.eval.num_tasks = 64            # held-out tasks per evaluation (<= env.num_eval_tasks)
  c.eval.temperature = 0.0         # 0 = greedy
  c.eval.confidence = 0.95

  c.log = ml_collections.ConfigDict()
  c.log.tensorboard = True
  c.log.progress_bar = True

  # Scale-out: `bpo_jax.sharding`, `training/precision.py`, `training/dry_run.py` and
  # `training/distributed.py` read these.
  c.scale = ml_collections.ConfigDict()
  # Mesh axis sizes (one may be -1: the devices left over); dcn_data > 1 spans slices.
  c.scale.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1, "dcn_data": 1})
  c.scale.param_dtype = "float32"  # stored parameters; "bfloat16" halves their memory
  c.scale.master_weights = True    # low-precision parameters: float32 master copy in the optimizer
  c.scale.remat = "none"           # recompute each layer's activations in the backward pass
  c.scale.scan_layers = False      # one lax.scan over the layers: compile time independent of depth
  c.scale.model_preset = ""        # a ModelConfig preset for the dry run, e.g. "qwen2_5_7b"
  c.scale.chip = ""                # the dry run's target chip (training/chips.py CHIPS)
  c.scale.num_devices = 0          # devices of the mesh; 0 = all (the dry run fakes this many)
  c.scale.decode_batch = 0         # rows decoded at once; 0 = tasks x trees x max_leaves
  # Compiled programs kept between processes (training/compile_cache.py): a directory; ""
  # = $JAX_COMPILATION_CACHE_DIR, else ~/.cache/bpo_jax/jax; "none" = no cache.
  c.scale.compile_cache_dir = ""
  # The run's programs (sampler, update) compiled for every shape it can meet before the first
  # rollout (training/startup.py): "auto" = on accelerators, "on", "off" (compiled on first use).
  c.scale.startup_compile = "auto"
  c.scale.distributed = ml_collections.ConfigDict({
      "coordinator_address": "",   # "host:port" of process 0; "" with one process
      "num_processes": 1,
      "process_id": 0,
  })
  return c


# ----------------------------------------------------------------------------- checks

# Allowed values of the keys with a fixed set of choices (and `rollout.estimator`: the names in
# `estimator_registry`).
_CHOICES = {
    "env.pool.backend": ("processes", "ray"),
    "rollout.fork_rule": TRAINING_FORK_RULES,
    "rollout.entropy_measure": ENTROPY_MEASURES,
    "rollout.trunk_baseline": TRUNK_BASELINES,
    "train.normalization": NORMALIZATIONS,
    "model.architecture": ARCHITECTURES,
    "model.dtype": DTYPES,
    "scale.startup_compile": ("auto", "on", "off"),
}

# (key, lower bound, upper bound or None, why); bounds inclusive.
_RANGES = (
    ("env.num_train_tasks", 1, None, ""),
    ("env.num_eval_tasks", 1, None, ""),
    ("env.max_turns", 1, None, ""),
    ("env.num_workers", 0, None, "0 runs sandboxes in-process"),
    ("env.max_observation_tokens", 0, None, "0 = no limit"),
    ("model.hidden_size", 1, None, ""),
    ("model.intermediate_size", 1, None, ""),
    ("model.num_layers", 1, None, ""),
    ("model.num_heads", 1, None, ""),
    ("model.num_kv_heads", 1, None, ""),
    ("model.head_dim", 2, None, ""),
    ("model.max_length", 8, None, ""),
    ("model.kv_page_size", 0, None, "0 = the dense KV cache"),
    ("model.lora_rank", 0, None, "0 = no adapters"),
    ("warm_start.num_trajectories", 0, None, "0 = no warm start"),
    ("warm_start.steps", 0, None, ""),
    ("warm_start.batch_size", 1, None, ""),
    ("warm_start.check_every", 1, None, ""),
    ("warm_start.validation_tasks", 1, None, ""),
    ("rollout.tasks_per_iteration", 1, None, ""),
    ("rollout.task_offset", 0, None, ""),
    ("rollout.trees_per_task", 1, None, ""),
    ("rollout.signal_rounds", 1, None, "1 = keep the first round's tasks"),
    ("rollout.k", 2, None, "a fork needs at least two siblings"),
    ("rollout.root_k", 0, None, "0 = rollout.k"),
    ("rollout.group_size", 0, None, "0 = as many episodes as fit rollout.max_env_steps"),
    ("rollout.entropy_threshold", 0.0, None, ""),
    ("rollout.fork_probability", 0.0, 1.0, ""),
    ("rollout.entropy_quantile", 0.0, 1.0, "0 = a fixed threshold"),
    ("rollout.max_leaves", 1, None, ""),
    ("rollout.max_tree_tokens", 1, None, ""),
    ("rollout.max_env_steps", 1, None, ""),
    ("rollout.max_action_tokens", 1, None, ""),
    ("rollout.temperature", 0.0, None, "0 = greedy"),
    ("rollout.group_std_ddof", 0, 1, "0 = population std, 1 = unbiased"),
    ("rollout.group_std_eps", 0.0, None, ""),
    ("rollout.gigpo_step_weight", 0.0, None, ""),
    ("rollout.gigpo_step_gamma", 0.0, 1.0, ""),
    ("train.iterations", 0, None, ""),
    ("train.weight_decay", 0.0, None, ""),
    ("train.micro_batches", 1, None, ""),
    ("train.epochs", 1, None, ""),
    ("train.max_skipped_updates", 0, None, "0 = never stop"),
    ("train.clip_epsilon", 0.0, None, ""),
    ("train.kl_coef", 0.0, None, ""),
    ("checkpoint.every", 1, None, ""),
    ("checkpoint.keep", 1, None, ""),
    ("eval.every", 0, None, "0 = only before and after training"),
    ("eval.num_tasks", 1, None, ""),
    ("eval.temperature", 0.0, None, "0 = greedy"),
)

# Float keys with an open bound: (key, test, the allowed values in words, why).
_INTERVALS = (
    ("env.timeout_s", lambda x: 0 < x <= threading.TIMEOUT_MAX,
     f"in (0, {threading.TIMEOUT_MAX:g}]", "the longest wait Python's timeouts take"),
    ("env.pool.cpus_per_worker", lambda x: x > 0, "> 0", ""),
    ("warm_start.learning_rate", lambda x: x > 0, "> 0", ""),
    ("warm_start.target_success", lambda x: 0 <= x <= 1, "in [0, 1]", "0 = all warm_start.steps"),
    ("warm_start.target_temperature", lambda x: x >= 0, ">= 0", "0 = greedy"),
    ("train.learning_rate", lambda x: x > 0, "> 0", ""),
    ("train.max_grad_norm", lambda x: x > 0, "> 0", ""),
    ("rollout.top_p", lambda x: 0 < x <= 1, "in (0, 1]", ""),
    ("rollout.gamma", lambda x: 0 < x <= 1, "in (0, 1]",
     "a step without siblings inherits its parent's baseline divided by gamma"),
    ("eval.confidence", lambda x: 0 < x < 1, "in (0, 1)", ""),
)


def _type_name(value: Any) -> str:
  return type(value).__name__


def _type_ok(expected: Any, value: Any) -> bool:
  if isinstance(expected, bool):
    return isinstance(value, bool)
  if isinstance(expected, int):
    return isinstance(value, int) and not isinstance(value, bool)
  if isinstance(expected, float):
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if isinstance(expected, str):
    return isinstance(value, str)
  return isinstance(value, type(expected))


def _walk(schema, config, prefix: str, problems: list[str], free_sections: Sequence[str]):
  """Unknown keys and wrong types of `config` against `schema`."""
  for key in sorted(config.keys()):
    path = f"{prefix}{key}"
    if key not in schema:
      known = ", ".join(sorted(schema.keys()))
      where = f"under '{prefix[:-1]}'" if prefix else "at the top level"
      problems.append(f"{path}: unknown key; known keys {where}: {known}")
      continue
    expected, value = schema[key], config[key]
    if isinstance(expected, ml_collections.ConfigDict):
      if not isinstance(value, (ml_collections.ConfigDict, dict)):
        problems.append(f"{path}: must be a section (ConfigDict), got {_type_name(value)}")
      elif path not in free_sections:
        _walk(expected, value, path + ".", problems, free_sections)
    elif not _type_ok(expected, value):
      problems.append(f"{path} = {value!r}: must be of type {_type_name(expected)}, got "
                      f"{_type_name(value)}")
  for key in sorted(schema.keys()):
    if key not in config:
      problems.append(f"{prefix}{key}: missing")


def _get(config, path: str):
  node = config
  for part in path.split("."):
    node = node[part]
  return node


def _check_env_options(config, problems: list[str]):
  """Per-environment options (`env.options`) and the environment's name."""
  # Imported here so that reading this module does not import environments.
  from bpo_jax.sandboxes import registry  # pylint: disable=g-import-not-at-top
  name = config.env.name
  if name not in registry.ENVIRONMENTS:
    problems.append(f"env.name = {name!r}: must be one of {registry.environment_names()}")
    return
  options = dict(config.env.options)
  if name == "rooms":
    allowed = {"difficulty"}
    difficulty = options.get("difficulty", 1)
    if isinstance(difficulty, bool) or difficulty not in (1, 2, 3, 4, 5):
      problems.append(f"env.options.difficulty = {difficulty!r}: must be one of 1, 2, 3, 4, 5")
  elif name == "textworld":
    allowed = {"games_dir", "vm_seed"}
    games_dir = options.get("games_dir")
    if not isinstance(games_dir, str) or not games_dir:
      problems.append("env.options.games_dir: required for textworld (a directory with "
                      "train/ and test/ game files, see scripts/make_textworld_games.py)")
    elif not os.path.isdir(games_dir):
      problems.append(f"env.options.games_dir = {games_dir!r}: no such directory (write the "
                      "games with scripts/make_textworld_games.py; the config file's docstring "
                      "gives the command)")
  else:
    allowed = None  # other environments take their options as they are
  if allowed is not None:
    for key in sorted(set(options) - allowed):
      problems.append(f"env.options.{key}: unknown option for {name}; known: "
                      f"{', '.join(sorted(allowed))}")


def path_token_bound(config, fmt) -> int | None:
  """An upper bound on a path's tokens in chat format `fmt` (`ChatFormat.path_token_bound`:
  the prompt and `env.max_turns` replies of `rollout.max_action_tokens` with the observations
  between them, counted in the template's own tokens). None when observations are not cut
  (`env.max_observation_tokens = 0`): then no bound is known before the rollout runs."""
  return fmt.path_token_bound(config.env.max_turns, config.rollout.max_action_tokens)


def check_text_budgets(config, fmt) -> None:
  """Raises ConfigError (one line per problem, naming the keys) unless one path of
  `env.max_turns` steps fits `model.max_length` and `rollout.max_tree_tokens`."""
  path_tokens = path_token_bound(config, fmt)
  if path_tokens is None:
    return
  r, problems = config.rollout, []
  holds = (f"one path of env.max_turns = {config.env.max_turns} steps (up to {path_tokens} "
           f"tokens with rollout.max_action_tokens = {r.max_action_tokens} and "
           f"env.max_observation_tokens = {config.env.max_observation_tokens})")
  if path_tokens > config.model.max_length:
    problems.append(f"model.max_length = {config.model.max_length}: cannot hold {holds}; raise "
                    "max_length or lower max_turns")
  if r.max_tree_tokens < path_tokens:
    problems.append(f"rollout.max_tree_tokens = {r.max_tree_tokens}: cannot hold {holds}")
  if problems:
    raise ConfigError(problems)


def group_episodes(config) -> int:
  """A baseline's episodes per task: `rollout.group_size`, or with 0 as many whole episodes as
  fit in `rollout.max_env_steps` at the worst case (`env.max_turns` steps each), fixed before
  any episode starts (`rollout.RolloutConfig.episodes_per_group` says why that keeps the group
  baselines unbiased).

  Example: max_env_steps = 10, max_turns = 5, group_size = 0 → 2.
  """
  r = config.rollout
  return r.group_size if r.group_size > 0 else r.max_env_steps // config.env.max_turns


def _check_group_size(config, problems: list[str]):
  """A baseline's group must hold two episodes."""
  r = config.rollout
  if r.group_size == 1:
    problems.append("rollout.group_size = 1: a group needs at least 2 episodes (0 = as many as "
                    "fit rollout.max_env_steps)")
  elif r.group_size == 0 and group_episodes(config) < 2:
    problems.append(f"rollout.max_env_steps = {r.max_env_steps}: holds "
                    f"{group_episodes(config)} whole episode(s) of env.max_turns = "
                    f"{config.env.max_turns} steps; rollout.group_size = 0 needs at least 2 "
                    "(set max_env_steps >= 2 x max_turns, or a fixed group_size)")


def _check_budgets(config, problems: list[str]):
  """Budgets that cannot hold one tree."""
  r = config.rollout
  estimator = estimator_registry.get(r.estimator)
  if estimator.topology == "group":
    _check_group_size(config, problems)
  elif r.max_leaves < r.k:
    problems.append(f"rollout.max_leaves = {r.max_leaves}: cannot hold one fork of rollout.k = "
                    f"{r.k} siblings; set max_leaves >= k")
  if r.root_k == 1:
    problems.append("rollout.root_k = 1: a fork needs at least two siblings (0 = rollout.k)")
  elif estimator.topology == "tree" and r.max_leaves < r.root_k:
    problems.append(f"rollout.max_leaves = {r.max_leaves}: cannot hold the root's fork of "
                    f"rollout.root_k = {r.root_k} siblings; set max_leaves >= root_k")
  if estimator.topology == "tree" and r.max_env_steps < r.k:
    problems.append(f"rollout.max_env_steps = {r.max_env_steps}: cannot hold one step of each of "
                    f"rollout.k = {r.k} branches; set max_env_steps >= k")
  min_tree_tokens = r.k * (config.rollout.max_action_tokens + 1) + 8
  if r.max_tree_tokens < min_tree_tokens:
    problems.append(f"rollout.max_tree_tokens = {r.max_tree_tokens}: cannot hold one step of "
                    f"each of rollout.k = {r.k} branches (needs >= {min_tree_tokens})")
  if (r.trunk_baseline == "batch" and estimator.trunk_baseline
      and r.tasks_per_iteration * r.trees_per_task < 2):
    problems.append("rollout.trunk_baseline = 'batch': needs at least 2 trees per iteration "
                    "(rollout.tasks_per_iteration x rollout.trees_per_task)")
  if r.trunk_baseline == "loo" and r.trees_per_task < 2:
    problems.append("rollout.trunk_baseline = 'loo': needs rollout.trees_per_task >= 2 (the "
                    "leave-one-out mean over the other trees of the same task)")


def _check_scale(config, problems: list[str]):
  """Mesh sizes, precision, remat, the dry run's target and the multi-host settings."""
  s = config.scale
  sizes = {name: s.mesh[name] for name in ("data", "fsdp", "tensor")}
  for name, size in sizes.items():
    if size == 0 or size < -1:
      problems.append(f"scale.mesh.{name} = {size}: must be positive or -1 (the devices left "
                      "over)")
  if sum(size == -1 for size in sizes.values()) > 1:
    problems.append(f"scale.mesh: at most one axis may be -1, got {sizes}")
  if s.mesh.dcn_data < 1:
    problems.append(f"scale.mesh.dcn_data = {s.mesh.dcn_data}: must be >= 1")
  if s.num_devices < 0:
    problems.append(f"scale.num_devices = {s.num_devices}: must be >= 0 (0 = all devices)")
  elif s.num_devices and all(size > 0 for size in sizes.values()):
    product = sizes["data"] * sizes["fsdp"] * sizes["tensor"] * s.mesh.dcn_data
    if product != s.num_devices:
      problems.append(f"scale.mesh: data x fsdp x tensor x dcn_data = {product}, but "
                      f"scale.num_devices = {s.num_devices}")
  if s.param_dtype not in DTYPES:
    problems.append(f"scale.param_dtype = {s.param_dtype!r}: must be one of "
                    f"{', '.join(map(repr, DTYPES))}")
  if s.remat not in REMAT_POLICIES:
    problems.append(f"scale.remat = {s.remat!r}: must be one of "
                    f"{', '.join(map(repr, REMAT_POLICIES))}")
  if s.model_preset and s.model_preset not in MODEL_PRESETS:
    problems.append(f"scale.model_preset = {s.model_preset!r}: must be '' or one of "
                    f"{', '.join(MODEL_PRESETS)}")
  if s.chip and s.chip.lower() not in chips_lib.CHIPS:
    problems.append(f"scale.chip = {s.chip!r}: must be '' or one of "
                    f"{', '.join(sorted(chips_lib.CHIPS))}")
  if s.decode_batch < 0:
    problems.append(f"scale.decode_batch = {s.decode_batch}: must be >= 0 (0 = tasks x trees x "
                    "max_leaves)")
  d = s.distributed
  if d.num_processes < 1:
    problems.append(f"scale.distributed.num_processes = {d.num_processes}: must be >= 1")
  elif not 0 <= d.process_id < d.num_processes:
    problems.append(f"scale.distributed.process_id = {d.process_id}: must be in "
                    f"[0, {d.num_processes - 1}]")
  if d.num_processes > 1:
    host, _, port = d.coordinator_address.rpartition(":")
    if not host or not port.isdigit():
      problems.append(f"scale.distributed.coordinator_address = {d.coordinator_address!r}: "
                      "must be 'host:port' of process 0 when num_processes > 1")
    # Each process grows the trees of its share of the tasks: every process needs one.
    trees = config.rollout.tasks_per_iteration * config.rollout.trees_per_task
    if trees < d.num_processes:
      problems.append(f"rollout.tasks_per_iteration x rollout.trees_per_task = {trees}: fewer "
                      f"trees than scale.distributed.num_processes = {d.num_processes} "
                      "(each process grows at least one)")
    if config.eval.num_tasks < d.num_processes:
      problems.append(f"eval.num_tasks = {config.eval.num_tasks}: fewer held-out tasks than "
                      f"scale.distributed.num_processes = {d.num_processes} (each process "
                      "plays at least one)")


def validate(config, mode: str = "train", workdir: str | None = None, *,
             host_memory: bool = True) -> None:
  """Checks `config` for `mode` ("train", "eval" or "export") and, when given, the `workdir`
  it reads and writes; raises ConfigError naming every problem. `host_memory=False` leaves out
  the bounds of this host's memory (the dry run checks a pod's configuration on another host)."""
  if mode not in MODES:
    raise ConfigError([f"mode = {mode!r}: must be one of {', '.join(MODES)}"])
  problems: list[str] = []
  _walk(default_config(), config, "", problems, free_sections=("env.options",))
  if problems:  # Later checks read values, which need the right keys and types.
    raise ConfigError(problems)
  nonfinite = _check_values(config, problems)
  m = config.model
  if m.num_kv_heads >= 1 and m.num_heads % m.num_kv_heads:
    problems.append(f"model.num_heads = {m.num_heads}: must be a multiple of model.num_kv_heads "
                    f"= {m.num_kv_heads}")
  if m.head_dim % 2:
    problems.append(f"model.head_dim = {m.head_dim}: must be even (RoPE)")
  if config.eval.num_tasks > config.env.num_eval_tasks:
    problems.append(f"eval.num_tasks = {config.eval.num_tasks}: more than the "
                    f"env.num_eval_tasks = {config.env.num_eval_tasks} held-out tasks")
  if config.env.pool.backend == "ray" and config.env.num_workers < 1:
    problems.append("env.pool.backend = 'ray': needs env.num_workers >= 1 (one actor each)")
  if config.env.pool.backend == "ray" and importlib.util.find_spec("ray") is None:
    problems.append("env.pool.backend = 'ray': ray is not installed (pip install -e '.[ray]')")
  if config.warm_start.num_trajectories > config.env.num_train_tasks:
    problems.append(f"warm_start.num_trajectories = {config.warm_start.num_trajectories}: more "
                    f"than the env.num_train_tasks = {config.env.num_train_tasks} training tasks")
  ws = config.warm_start
  if (ws.target_success > 0
      and ws.num_trajectories + ws.validation_tasks > config.env.num_train_tasks):
    problems.append(f"warm_start.validation_tasks = {ws.validation_tasks}: with the "
                    f"{ws.num_trajectories} demonstrated, more than the env.num_train_tasks = "
                    f"{config.env.num_train_tasks} training tasks")
  _check_env_options(config, problems)
  _check_scale(config, problems)
  if not problems:
    _check_budgets(config, problems)
  if not problems:  # the bounds read sizes the checks above have found valid
    group = (group_episodes(config) if estimator_registry.get(
        config.rollout.estimator).topology == "group" else None)
    bounds.check(config, problems, bounds.host_memory_bytes() if host_memory else None, group)
  if m.lora_rank and "model.lora_alpha" not in nonfinite and not m.lora_alpha > 0:
    problems.append(f"model.lora_alpha = {m.lora_alpha!r}: must be > 0")
  if m.lora_rank and config.scale.distributed.num_processes > 1:
    problems.append(f"model.lora_rank = {m.lora_rank}: LoRA runs in one process (on any mesh "
                    "of its devices); several processes are not yet checked against one")
  if m.checkpoint and not os.path.isdir(m.checkpoint):
    problems.append(f"model.checkpoint = {m.checkpoint!r}: no such directory")
  if mode in ("eval", "export"):
    if workdir is None:
      problems.append(f"workdir: {mode} needs the workdir of a training run")
    else:
      checkpoint_dir = os.path.join(workdir, "checkpoints")
      if not os.path.isdir(checkpoint_dir):
        problems.append(f"workdir = {workdir!r}: no checkpoint directory "
                        f"({checkpoint_dir!r} does not exist); train first")
  if workdir is not None and mode in ("train", "eval"):  # both write there
    _check_workdir(workdir, problems)
  if problems:
    raise ConfigError(problems)


def float_keys(schema=None, prefix: str = "") -> list[str]:
  """The dotted keys of every float value of `schema` (default: `default_config()`), in schema
  order; the free `env.options` section is not part of the schema."""
  schema = default_config() if schema is None else schema
  keys = []
  for key, value in schema.items():
    path = prefix + key
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      if path != "env.options":
        keys += float_keys(value, path + ".")
    elif isinstance(value, float):
      keys.append(path)
  return keys


def _check_values(config, problems: list[str]) -> set[str]:
  """Choices, finite floats (`float_keys` and any float in env.options) and ranges. Returns the
  keys whose value is NaN or Inf (their ranges are not checked again)."""
  for path, allowed in (("rollout.estimator", estimator_registry.names()), *_CHOICES.items()):
    value = _get(config, path)
    if value not in allowed:
      problems.append(f"{path} = {value!r}: must be one of {', '.join(map(repr, allowed))}")
  options = {f"env.options.{k}": v for k, v in dict(config.env.options).items()
             if isinstance(v, float)}
  values = {**{path: _get(config, path) for path in float_keys()}, **options}
  # An int is finite (and may be too large for math.isfinite's float).
  nonfinite = {path for path, value in values.items()
               if not isinstance(value, int) and not math.isfinite(value)}
  for path in sorted(nonfinite, key=list(values).index):
    problems.append(f"{path} = {values[path]!r}: must be a finite number")
  for path, low, high, why in _RANGES:
    value = _get(config, path)
    if path not in nonfinite and (value < low or (high is not None and value > high)):
      bound = f">= {low}" if high is None else f"in [{low}, {high}]"
      problems.append(f"{path} = {value!r}: must be {bound}" + (f" ({why})" if why else ""))
  for path, test, allowed, why in _INTERVALS:
    value = _get(config, path)
    if path not in nonfinite and not test(value):
      problems.append(f"{path} = {value!r}: must be {allowed}" + (f" ({why})" if why else ""))
  return nonfinite


def _check_workdir(workdir: str, problems: list[str]) -> None:
  """The workdir can be written: an existing directory, or a path whose nearest existing
  ancestor is a directory, where a file can be created (a probe, created and removed: it also
  finds a read-only mount or an immutable directory, which permission bits do not show to
  root). Nothing is left behind."""
  path = existing = os.path.abspath(workdir)
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    what = "exists and" if existing == path else f"{existing!r}, a path above it,"
    problems.append(f"workdir = {workdir!r}: {what} is not a directory")
    return
  try:
    fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=existing)
    os.close(fd)
    os.remove(probe)
  except OSError as error:
    where = "" if existing == path else f" (where it would be created, {existing!r})"
    problems.append(f"workdir = {workdir!r}: cannot write there{where}: "
                    f"{error.strerror or error}")


def to_plain(config) -> dict:
  """The configuration as plain nested dicts (for JSON and comparison)."""
  return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def saved_differences(saved: dict, current: dict,
                      ignore: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
  """{dotted key: (saved value, current value)} for the keys whose values differ between a
  run's saved configuration and `current` (both `to_plain` dicts; a missing key's value is
  None), in key order, except those in `ignore` and keys added to the library since the run was
  saved that `current` holds at their default (they change nothing).

  Example: saved {"rollout": {"k": 2}}, current {"rollout": {"k": 2, "root_k": 0}} → {};
  current {"rollout": {"k": 2, "root_k": 3}} → {"rollout.root_k": (None, 3)}.
  """
  a, b = _flat(saved), _flat(current)
  defaults = _flat(to_plain(default_config()))
  return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
          if a.get(k) != b.get(k) and k not in ignore
          and not (k not in a and k in defaults and b[k] == defaults[k])}


# ----------------------------------------------------------------------------- overrides


def describe_override_error(argv: Sequence[str], config) -> str | None:
  """Explains a failed `--config.a.b=v` override: which key is unknown, or which type was wanted.

  `config` is the configuration the file produced before overrides (None if the file itself
  could not be loaded). Returns None when no override in `argv` is at fault.
  """
  if config is None:
    return None
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    path, _, raw = arg[len("--config."):].partition("=")
    node, parts = config, path.split(".")
    for depth, part in enumerate(parts):
      if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
        prefix = ".".join(parts[:depth])
        section = isinstance(node, (ml_collections.ConfigDict, dict))
        known = ", ".join(sorted(node.keys())) if section else "(none: not a section)"
        where = f"under '{prefix}'" if prefix else "at the top level"
        return f"{path}: unknown key; known keys {where}: {known}"
      node = node[part]
    if isinstance(node, (ml_collections.ConfigDict, dict)):
      return f"{path}: is a section, not a value; set one of its keys ({', '.join(node.keys())})"
    if isinstance(node, bool) and raw.lower() not in ("true", "false", "1", "0"):
      return f"{path} = {raw!r}: must be of type bool (true or false)"
    for kind in (int, float):
      if isinstance(node, kind) and not isinstance(node, bool):
        try:
          kind(raw)
        except ValueError:
          return f"{path} = {raw!r}: must be of type {kind.__name__}"
  return None
