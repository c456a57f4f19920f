"""A run's settings: the validated configuration as typed, frozen values (docs/DESIGN.md §2).

`from_config(config)` reads the `ml_collections` configuration (`training/config.py`, which
holds the schema and checks it) once, at the top of `train`, `evaluate`, `export` and the dry
run; every part of the run below them takes a `Settings`, or the section of it it needs, never
the configuration. The sections and their fields are the schema's, by the same names: a setting
has one name, and its one default is the schema's (these classes have none of their own).
`translate.py` turns them into what the library's parts take (`ModelConfig`, `RolloutConfig`,
`UpdateConfig`, optimisers, mesh).

    settings = from_config(config)       # after config.validate(config, mode, workdir)
    settings.rollout.k                   # 2, the schema's `rollout.k`
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any


@dataclasses.dataclass(frozen=True)
class PoolSettings:
  """`env.pool`: where the sandbox workers run."""

  backend: str
  ray_address: str
  cpus_per_worker: float
  ray_resource: str


@dataclasses.dataclass(frozen=True)
class EnvSettings:
  """`env`: which environment, its task splits and options."""

  name: str
  num_train_tasks: int
  num_eval_tasks: int
  task_seed: int
  max_turns: int
  num_workers: int
  timeout_s: float
  pool: PoolSettings
  max_observation_tokens: int
  options: dict  # the environment's own keyword arguments, plain values


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """`model`: the checkpoint or the from-scratch decoder's shape, LoRA, the context."""

  architecture: str
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  max_length: int
  kv_page_size: int
  dtype: str
  checkpoint: str
  lora_rank: int
  lora_alpha: float


@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
  """`warm_start`: supervised steps on expert trajectories."""

  num_trajectories: int
  steps: int
  batch_size: int
  learning_rate: float
  target_success: float
  target_temperature: float
  check_every: int
  validation_tasks: int


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
  """`rollout`: the estimator, its trees or groups, the fork rule and the per-tree budgets."""

  estimator: str
  tasks_per_iteration: int
  task_offset: int
  trees_per_task: int
  signal_rounds: int
  k: int
  root_k: int
  group_size: int
  fork_rule: str
  entropy_measure: str
  entropy_threshold: float
  entropy_quantile: float
  fork_probability: float
  siblings_fork: bool
  max_leaves: int
  max_tree_tokens: int
  max_env_steps: int
  max_action_tokens: int
  temperature: float
  top_p: float
  trunk_baseline: str
  gamma: float
  group_normalize_std: bool
  group_std_ddof: int
  group_std_eps: float
  gigpo_step_weight: float
  gigpo_step_gamma: float


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """`train`: the optimiser and the policy-gradient update."""

  iterations: int
  learning_rate: float
  weight_decay: float
  max_grad_norm: float
  epochs: int
  micro_batches: int
  clip_epsilon: float
  kl_coef: float
  normalization: str
  max_skipped_updates: int


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
  """`checkpoint`: how often to save and how many to keep."""

  every: int
  keep: int


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """`eval`: held-out evaluation."""

  every: int
  num_tasks: int
  temperature: float
  confidence: float


@dataclasses.dataclass(frozen=True)
class LogSettings:
  """`log`: console, JSONL and TensorBoard output."""

  tensorboard: bool
  progress_bar: bool


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  """`scale.mesh`: axis sizes (one may be -1: the devices left over)."""

  data: int
  fsdp: int
  tensor: int
  dcn_data: int


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
  """`scale.distributed`: the processes of a multi-host run."""

  coordinator_address: str
  num_processes: int
  process_id: int


@dataclasses.dataclass(frozen=True)
class ScaleSettings:
  """`scale`: mesh, precision, remat, multi-host settings, the dry run's target."""

  mesh: MeshSettings
  param_dtype: str
  master_weights: bool
  remat: str
  scan_layers: bool
  model_preset: str
  chip: str
  num_devices: int
  decode_batch: int
  compile_cache_dir: str
  startup_compile: str
  distributed: DistributedSettings


@dataclasses.dataclass(frozen=True)
class Settings:
  """Every setting of a run, by section (`training/config.py` documents each key)."""

  seed: int
  env: EnvSettings
  model: ModelSettings
  warm_start: WarmStartSettings
  rollout: RolloutSettings
  train: TrainSettings
  checkpoint: CheckpointSettings
  eval: EvalSettings
  log: LogSettings
  scale: ScaleSettings

  def to_plain(self) -> dict:
    """The settings as plain nested dicts, as `config.to_plain` gives the configuration."""
    return dataclasses.asdict(self)


def _plain(value: Any) -> Any:
  """A configuration value without `ml_collections` types (a nested section as a dict)."""
  if hasattr(value, "to_dict"):
    return value.to_dict()
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  return value


def _section(cls: type, node) -> Any:
  """`cls` filled from the configuration section `node`, its subsections recursively."""
  hints = typing.get_type_hints(cls)
  values = {}
  for field in dataclasses.fields(cls):
    value = node[field.name]
    kind = hints[field.name]
    values[field.name] = (_section(kind, value) if dataclasses.is_dataclass(kind)
                          else _plain(value))
  return cls(**values)


def from_config(config) -> Settings:
  """The settings of a validated configuration (`config.validate` first: a key the schema
  does not have is an error there, not here)."""
  return _section(Settings, config)
