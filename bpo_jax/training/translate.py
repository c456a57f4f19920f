"""A run's settings translated to what the library's parts take.

One place turns the `Settings` (`training/settings.py`, read once from the validated
configuration) into the decoder's `ModelConfig` (from the `model` section, or from the preset a
dry run compiles), the rollout engine's `RolloutConfig`, the update's `UpdateConfig`, the
optimisers and the mesh. The typed configs take the schema's names and defaults, so a setting
passes through under its own name. The training loop and the dry run both build from here, so
that they compile the same step for the same settings.
"""

from __future__ import annotations

import dataclasses

import optax

from bpo_jax import packing
from bpo_jax import rollout as rollout_lib
from bpo_jax import sharding
from bpo_jax.models import config as model_config_lib
from bpo_jax.training import estimator_registry
from bpo_jax.training import precision
from bpo_jax.training import settings as settings_lib
from bpo_jax.training import update as update_lib

Settings = settings_lib.Settings


def model_config(settings: Settings, vocab_size: int) -> model_config_lib.ModelConfig:
  """The decoder's `ModelConfig` from the `model` section and the tokenizer's vocabulary (with
  the `scale` section's parameter dtype, remat and scanned layers)."""
  m = settings.model
  llama = m.architecture == "llama"
  return model_config_lib.ModelConfig(
      architecture=m.architecture, vocab_size=vocab_size, hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, qkv_bias=not llama,
      tie_word_embeddings=True, max_position_embeddings=m.max_length, dtype=m.dtype,
      param_dtype=settings.scale.param_dtype, remat=settings.scale.remat,
      scan_layers=settings.scale.scan_layers)


def checkpoint_overrides(settings: Settings) -> dict:
  """What a run loads `model.checkpoint` with besides its config.json: the adapters of the
  `model` section and the `scale` section's remat and scanned layers (the parameters' dtype
  is the checkpoint's)."""
  m, s = settings.model, settings.scale
  return dict(lora_rank=m.lora_rank, lora_alpha=m.lora_alpha, remat=s.remat,
              scan_layers=s.scan_layers)


def preset_model_config(settings: Settings) -> model_config_lib.ModelConfig:
  """The `ModelConfig` of `scale.model_preset` with the scale section's precision and remat."""
  s = settings.scale
  if not s.model_preset:
    raise ValueError("scale.model_preset: the dry run compiles a named model; set it to one of "
                     "the ModelConfig presets, e.g. 'qwen2_5_7b' or 'llama3_1_8b'")
  return getattr(model_config_lib.ModelConfig, s.model_preset)(
      param_dtype=s.param_dtype, remat=s.remat, scan_layers=s.scan_layers)


def row_buckets(settings: Settings) -> tuple[int, ...]:
  """The packed row lengths the update compiles for: `packing.DEFAULT_BUCKETS`, doubled on until
  one holds a whole tree (`rollout.max_tree_tokens`; a tree is packed into one row) and one
  path of the context (`model.max_length`, a warm-start episode).

  Example: max_tree_tokens = 65536 gives (128, ..., 8192, 16384, 32768, 65536).
  """
  buckets = list(packing.DEFAULT_BUCKETS)
  while buckets[-1] < max(settings.rollout.max_tree_tokens, settings.model.max_length):
    buckets.append(2 * buckets[-1])
  return tuple(buckets)


def decode_rows(settings: Settings, config: rollout_lib.RolloutConfig,
                process_count: int = 1) -> int:
  """The most rows one process decodes at once, for the training rollouts' `config`: its share
  of the iteration's trees (tasks x trees per task, split over the processes) times a tree's
  most live branches (BPO: its leaves, since every branch ends in one; a group: its episodes),
  or its share of the held-out tasks (one episode each), whichever is more. Example: 2 tasks x
  1 tree x 4 leaves, 4 held-out tasks → 8."""
  branches = (config.episodes_per_group if config.topology == "group"
              else config.max_leaves or config.node_capacity)
  trees = settings.rollout.tasks_per_iteration * settings.rollout.trees_per_task
  share = lambda n: -(-n // process_count)
  return max(share(trees) * branches, share(settings.eval.num_tasks))


def kv_pool_pages(rows: int, max_length: int, page_size: int) -> int:
  """Pages per layer of a paged pool that never grows for `rows` live rows of `max_length`
  slots: rows·(⌈max_length / page_size⌉ + 1) + 1. A row holds at most ⌈max_length / page⌉
  pages and every page in use is held by a row; a fork copies at most one page per new row
  while the old rows still hold theirs (the + 1 per row); the null page (the last + 1).
  Example: 8 rows of 320 slots in pages of 16 → 8·21 + 1 = 169."""
  return rows * (-(-max_length // page_size) + 1) + 1


def rollout_config(settings: Settings, evaluation: bool = False) -> rollout_lib.RolloutConfig:
  """The rollout engine's settings: the estimator's trees or groups (`estimator_registry`), or,
  for evaluation, one episode per task at `eval.temperature`. A paged cache's pool is sized
  once for the run (`kv_pool_pages`), the same for rollouts and evaluations."""
  config = _rollout_config(settings, evaluation)
  page = settings.model.kv_page_size
  if not page:
    return config
  train = _rollout_config(settings, False) if evaluation else config
  pages = kv_pool_pages(decode_rows(settings, train), settings.model.max_length, page)
  return dataclasses.replace(config, kv_pool_pages=pages)


def _rollout_config(settings: Settings, evaluation: bool) -> rollout_lib.RolloutConfig:
  r = settings.rollout
  common = dict(max_turns=settings.env.max_turns, max_action_tokens=r.max_action_tokens,
                max_length=settings.model.max_length,
                kv_page_size=settings.model.kv_page_size)
  if evaluation:  # one backbone, never forked: no budget to keep
    return rollout_lib.RolloutConfig(
        topology="tree", fork_rule="never", max_leaves=1, max_env_steps=None,
        max_tree_tokens=None, temperature=settings.eval.temperature, **common)
  estimator = estimator_registry.get(r.estimator)
  if estimator.topology == "tree":
    return rollout_lib.RolloutConfig(
        topology="tree", k=r.k, root_k=r.root_k, fork_rule=r.fork_rule,
        entropy_measure=r.entropy_measure, entropy_threshold=r.entropy_threshold,
        fork_probability=r.fork_probability, siblings_fork=r.siblings_fork,
        max_leaves=r.max_leaves, max_env_steps=r.max_env_steps,
        max_tree_tokens=r.max_tree_tokens, temperature=r.temperature, top_p=r.top_p,
        state_ids=estimator.state_ids, **common)
  # `rollout.group_size` 0: as many whole episodes as fit in the env-step budget, N fixed
  # before the episodes start (`RolloutConfig.episodes_per_group`); the group's N episodes
  # are its only limit (no fork rule, leaf or token budget).
  return rollout_lib.RolloutConfig(
      topology="group", group_size=r.group_size, max_env_steps=r.max_env_steps,
      max_leaves=None, max_tree_tokens=None, temperature=r.temperature, top_p=r.top_p,
      state_ids=estimator.state_ids, **common)


def update_config(settings: Settings) -> update_lib.UpdateConfig:
  """The update step's settings; its logprobs use the sampling temperature (1 when greedy)."""
  t, r = settings.train, settings.rollout
  return update_lib.UpdateConfig(
      micro_batches=t.micro_batches, clip_epsilon=t.clip_epsilon, kl_coef=t.kl_coef,
      normalization=t.normalization, temperature=r.temperature if r.temperature > 0 else 1.0)


def optimizer_config(settings: Settings) -> update_lib.OptimizerConfig:
  """The policy-gradient optimiser (AdamW with gradient clipping)."""
  t = settings.train
  return update_lib.OptimizerConfig(learning_rate=t.learning_rate, weight_decay=t.weight_decay,
                                    max_grad_norm=t.max_grad_norm)


def uses_master_weights(settings: Settings) -> bool:
  """Low-precision parameters keep a float32 master copy in the optimizer (`scale`)."""
  return settings.scale.param_dtype != "float32" and settings.scale.master_weights


def _with_master_weights(settings: Settings, tx: optax.GradientTransformation):
  return precision.with_float32_master_weights(tx) if uses_master_weights(settings) else tx


def rl_optimizer(settings: Settings) -> optax.GradientTransformation:
  """The policy-gradient optimiser, with the float32 master copy where it applies."""
  return _with_master_weights(settings, update_lib.make_optimizer(optimizer_config(settings)))


def sft_optimizer(settings: Settings) -> optax.GradientTransformation:
  """The warm start's optimiser: Adam at `warm_start.learning_rate`, the same clipping."""
  return _with_master_weights(settings, update_lib.make_optimizer(update_lib.OptimizerConfig(
      learning_rate=settings.warm_start.learning_rate,
      max_grad_norm=settings.train.max_grad_norm)))


def mesh_config(settings: Settings) -> sharding.MeshConfig:
  """The `scale.mesh` axis sizes."""
  m = settings.scale.mesh
  return sharding.MeshConfig(data=m.data, fsdp=m.fsdp, tensor=m.tensor, dcn_data=m.dcn_data)
