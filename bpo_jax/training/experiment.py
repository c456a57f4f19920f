"""What a run builds from its configuration before any training: tasks, sandboxes, tokenizer.

`build_experiment(config, workdir)` makes the training and held-out tasks of the configured
environment, the sandbox pool, the word tokenizer of the environment's vocabulary (saved to
`<workdir>/tokenizer` in HF format and loaded back from there) and the initial decoder: the HF
checkpoint of `model.checkpoint` (its config.json decides the shape), or a from-scratch decoder
built from the seed. `task_order` is the seeded order in which iterations draw the training
tasks.

Trainable and frozen parameters. With `model.lora_rank > 0` the train state's parameters are
the adapters alone; the base (`Experiment.frozen`) is rebuilt by every start of the run from the
same source (the checkpoint's weights, or the seed), so checkpoints hold only the adapters and
their optimiser state. `Experiment.full_params(trainable)` joins them for sampling and export.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from flax import nnx
import jax.numpy as jnp
import numpy as np

from bpo_jax import agent_format
from bpo_jax.models import config as model_config_lib
from bpo_jax.models import decoder as decoder_lib
from bpo_jax.models import lora as lora_lib
from bpo_jax.models import params as params_lib
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import registry
from bpo_jax.training import config as config_lib
from bpo_jax.training import distributed
from bpo_jax.training import tokenizer as tokenizer_lib
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib


def make_tasks(config, split: str, num: int) -> list:
  """`num` tasks of the configured environment's split ("train" or "test")."""
  env = registry.get_environment(config.env.name)
  return env.make_tasks(split, num=num, seed=config.env.task_seed, **dict(config.env.options))


def make_pool(config) -> pool_lib.SandboxPool:
  # In-process sandboxes keep no backups: there is no worker to lose.
  return pool_lib.SandboxPool.for_environment(
      config.env.name, num_workers=config.env.num_workers, timeout_s=config.env.timeout_s,
      keep_backups=config.env.num_workers > 0, **dict(config.env.options))


def environment_vocabulary(config, tasks: Sequence[Any]) -> list[str]:
  """The environment's `vocabulary()`, or, for environments without one, every word of the
  given tasks' expert episodes and of the actions admissible along them."""
  env = registry.get_environment(config.env.name)
  if hasattr(env, "vocabulary"):
    return list(env.vocabulary())
  words = set()
  sandbox = env.make_sandbox(**dict(config.env.options))
  try:
    for task in tasks:
      words.update(agent_format.split_words(sandbox.reset(task)))
      for action in sandbox.expert_actions() or []:
        if hasattr(sandbox, "admissible_actions"):
          for admissible in sandbox.admissible_actions():
            words.update(agent_format.split_words(admissible))
        step = sandbox.step(action)
        words.update(agent_format.split_words(action))
        words.update(agent_format.split_words(step.observation))
        if step.done:
          break
  finally:
    sandbox.close()
  return sorted(words - set(agent_format.SPECIAL_TOKENS))


def task_order(num_tasks: int, seed: int, start: int, count: int) -> list[int]:
  """Positions `[start, start + count)` of an endless task order: a seeded permutation of the
  training split per epoch. A pure function of its arguments (exact resume needs no state).

  Example: with 4 tasks, positions 0..3 are one permutation of 0..3 and 4..7 another.
  """
  out = []
  for position in range(start, start + count):
    epoch, offset = divmod(position, num_tasks)
    permutation = np.random.default_rng([seed, epoch]).permutation(num_tasks)
    out.append(int(permutation[offset]))
  return out



@dataclasses.dataclass
class Experiment:
  """What a run builds from its configuration before any training."""

  config: Any
  workdir: str
  tokenizer: tokenizer_lib.WordTokenizerAdapter
  fmt: agent_format.AgentFormat
  model_config: model_config_lib.ModelConfig
  graphdef: Any
  train_tasks: list
  eval_tasks: list
  pool: pool_lib.SandboxPool
  frozen: Any = None  # the frozen base parameters of a LoRA run; None when every one trains

  def full_params(self, params):
    """The whole model's parameters from the trainable ones (adapters joined to the base)."""
    return params if self.frozen is None else nnx.merge_state(params, self.frozen)

  def close(self):
    self.pool.shutdown()


# ModelConfig fields `scale.model_preset` is checked against when the run loads a checkpoint.
SHAPE_FIELDS = ("architecture", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "vocab_size", "tie_word_embeddings")


def check_preset(config, loaded: model_config_lib.ModelConfig) -> None:
  """`scale.model_preset`, with a checkpoint, must name the checkpoint's shape (ConfigError)."""
  if not config.scale.model_preset:
    return
  preset = getattr(model_config_lib.ModelConfig, config.scale.model_preset)()
  differ = [f"{name} {getattr(loaded, name)} (preset {getattr(preset, name)})"
            for name in SHAPE_FIELDS if getattr(loaded, name) != getattr(preset, name)]
  if differ:
    raise config_lib.ConfigError([
        f"scale.model_preset = {config.scale.model_preset!r}: the checkpoint "
        f"{config.model.checkpoint!r} has another shape: " + ", ".join(differ)])


def initial_model(config, vocab_size: int) -> decoder_lib.Decoder:
  """The run's starting decoder: `model.checkpoint`'s weights (adapters from the seed), or a
  from-scratch decoder of the `model` section built from the seed."""
  m = config.model
  if not m.checkpoint:
    model_config = translate.model_config(config, vocab_size).replace(
        lora_rank=m.lora_rank, lora_alpha=m.lora_alpha)
    return decoder_lib.Decoder(model_config, rngs=nnx.Rngs(params=config.seed))
  model, model_config = params_lib.load_hf_checkpoint(
      m.checkpoint, lora_rank=m.lora_rank, lora_alpha=m.lora_alpha, seed=config.seed)
  if vocab_size > model_config.vocab_size:
    raise params_lib.CheckpointError(
        f"model.checkpoint = {m.checkpoint!r}: the tokenizer has {vocab_size} tokens, more than "
        f"the model's vocab_size {model_config.vocab_size}")
  check_preset(config, model_config)
  return model


def split_trainable(params, model_config) -> tuple[Any, Any]:
  """(trainable, frozen): (adapters, base) with LoRA, else (every parameter, None)."""
  if model_config.lora_rank == 0:
    return params, None
  return lora_lib.split_lora(params)


def build_experiment(config, workdir: str) -> tuple[Experiment, update_lib.TrainState]:
  """Tokenizer (saved to and loaded from the workdir), tasks, sandbox pool, initial model."""
  train_tasks = make_tasks(config, "train", config.env.num_train_tasks)
  eval_tasks = make_tasks(config, "test", config.env.num_eval_tasks)
  tokenizer_dir = os.path.join(workdir, "tokenizer")
  if (distributed.is_primary()
      and not os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json"))):
    tokenizer_lib.save_word_tokenizer(environment_vocabulary(config, train_tasks), tokenizer_dir)
  distributed.barrier("tokenizer saved")
  tokenizer = tokenizer_lib.load_word_tokenizer(tokenizer_dir)
  fmt = agent_format.AgentFormat.for_word_tokenizer(
      tokenizer, max_observation_tokens=config.env.max_observation_tokens or None)
  model = initial_model(config, tokenizer.vocab_size)
  model_config = model.config
  graphdef, params = nnx.split(model)
  trainable, frozen = split_trainable(params, model_config)
  state = update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=trainable, opt_state=None)
  return Experiment(config=config, workdir=workdir, tokenizer=tokenizer, fmt=fmt,
                    model_config=model_config, graphdef=graphdef, train_tasks=train_tasks,
                    eval_tasks=eval_tasks, pool=make_pool(config), frozen=frozen), state

