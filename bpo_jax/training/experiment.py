"""What a run builds from its configuration before any training: tasks, sandboxes, tokenizer.

`build_experiment(config, workdir)` makes the training and held-out tasks of the configured
environment, the sandbox pool (free-text sandboxes: a step takes the model's reply and the
environment's parser takes the action out of it), the run's text path (`text.build`: a
byte-level BPE tokenizer trained on the environment's text and saved to `<workdir>/tokenizer`,
or with `model.checkpoint` that checkpoint's tokenizer, chat template and generation config)
and the decoder (`build_model`). `task_order` is the seeded order in which iterations draw the
training tasks.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from flax import nnx
import jax.numpy as jnp
import numpy as np

import functools

from bpo_jax import text
from bpo_jax.models import config as model_config_lib
from bpo_jax.models import decoder as decoder_lib
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import registry
from bpo_jax.training import config as config_lib
from bpo_jax.training import distributed
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib


def make_tasks(config, split: str, num: int) -> list:
  """`num` tasks of the configured environment's split ("train" or "test")."""
  env = registry.get_environment(config.env.name)
  return env.make_tasks(split, num=num, seed=config.env.task_seed, **dict(config.env.options))


def sandbox_factory(config):
  """A picklable factory of the configured environment's free-text sandboxes (a step takes a
  reply; `registry.make_free_text_sandbox`)."""
  return functools.partial(registry.make_free_text_sandbox, config.env.name,
                           **dict(config.env.options))


def make_pool(config) -> pool_lib.SandboxPool:
  # In-process sandboxes keep no backups: there is no worker to lose.
  return pool_lib.SandboxPool(sandbox_factory(config), num_workers=config.env.num_workers,
                              timeout_s=config.env.timeout_s,
                              keep_backups=config.env.num_workers > 0)


def build_text(config, workdir: str, train_tasks) -> tuple[Any, text.ChatFormat]:
  """The run's tokenizer and chat format: the checkpoint's (`model.checkpoint`), or a BPE
  tokenizer trained once on the primary process and saved to `<workdir>/tokenizer`; every
  process then loads the same directory.

  Raises:
    text.TokenizerError: the tokenizer cannot serve the chat format (one line).
  """
  name = config.env.name
  system_prompt = registry.get_action_syntax(name).system_prompt
  directory = config.model.checkpoint
  if not directory:
    if distributed.is_primary():
      text.ensure_bpe_tokenizer(name, workdir, train_tasks, env_options=dict(config.env.options))
    distributed.barrier("tokenizer saved")
    directory = os.path.join(workdir, text.TOKENIZER_DIR)
  return text.load_format(directory, system_prompt or None,
                          config.env.max_observation_tokens or None)


def build_model(config, vocab_size: int) -> tuple[model_config_lib.ModelConfig, Any, Any]:
  """(model config, graphdef, parameters) of the decoder the run starts from: built from the
  seed with the config's shape and the tokenizer's vocabulary."""
  model_config = translate.model_config(config, vocab_size)
  model = decoder_lib.Decoder(model_config, rngs=nnx.Rngs(params=config.seed))
  graphdef, params = nnx.split(model)
  return model_config, graphdef, params


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
  tokenizer: Any
  fmt: text.ChatFormat
  model_config: model_config_lib.ModelConfig
  graphdef: Any
  train_tasks: list
  eval_tasks: list
  pool: pool_lib.SandboxPool

  def close(self):
    self.pool.shutdown()


def build_experiment(config, workdir: str) -> tuple[Experiment, update_lib.TrainState]:
  """Tasks, tokenizer and chat format, sandbox pool, initial model.

  Raises:
    text.TokenizerError: the tokenizer cannot serve the chat format.
    config_lib.ConfigError: a path of the configured budgets does not fit the context.
  """
  train_tasks = make_tasks(config, "train", config.env.num_train_tasks)
  eval_tasks = make_tasks(config, "test", config.env.num_eval_tasks)
  tokenizer, fmt = build_text(config, workdir, train_tasks)
  config_lib.check_text_budgets(config, fmt)
  model_config, graphdef, params = build_model(config, fmt.vocab_size)
  state = update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=None)
  return Experiment(config=config, workdir=workdir, tokenizer=tokenizer, fmt=fmt,
                    model_config=model_config, graphdef=graphdef, train_tasks=train_tasks,
                    eval_tasks=eval_tasks, pool=make_pool(config)), state

