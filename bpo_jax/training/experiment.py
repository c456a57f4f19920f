"""What a run builds from its configuration before any training: tasks, sandboxes, tokenizer.

`build_experiment(config, workdir)` makes the training and held-out tasks of the configured
environment, the sandbox pool, the word tokenizer of the environment's vocabulary (saved to
`<workdir>/tokenizer` in HF format and loaded back from there) and a from-scratch decoder built
from the seed. `task_order` is the seeded order in which iterations draw the training tasks.
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
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import registry
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

  def close(self):
    self.pool.shutdown()


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
  model_config = translate.model_config(config, tokenizer.vocab_size)
  model = decoder_lib.Decoder(model_config, rngs=nnx.Rngs(params=config.seed))
  graphdef, params = nnx.split(model)
  state = update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=None)
  return Experiment(config=config, workdir=workdir, tokenizer=tokenizer, fmt=fmt,
                    model_config=model_config, graphdef=graphdef, train_tasks=train_tasks,
                    eval_tasks=eval_tasks, pool=make_pool(config)), state

