"""What a run builds from its settings before any training: tasks, sandboxes, tokenizer.

`build_experiment(settings, workdir)` (a run's `Settings`, `training/settings.py`) makes the
training and held-out tasks of the configured environment, the sandbox pool (free-text
sandboxes: a step takes the model's reply and the environment's parser takes the action out of
it), the run's text path (`text.build`: a
byte-level BPE tokenizer trained on the environment's text and saved to `<workdir>/tokenizer`,
or with `model.checkpoint` that checkpoint's tokenizer, chat template and generation config)
and the initial decoder (`initial_model`: the HF checkpoint of `model.checkpoint`, whose
config.json decides the shape, or a from-scratch decoder built from the seed). `task_order` is
the seeded order in which iterations draw the training tasks.

Trainable and frozen parameters. With `model.lora_rank > 0` the train state's parameters are
the adapters alone; the base (`Experiment.frozen`) is rebuilt by every start of the run from the
same source (the checkpoint's weights, or the seed), so checkpoints hold only the adapters and
their optimiser state. `Experiment.full_params(trainable)` joins them for the update's reference
and export.

Sampling decodes without adapters: `Experiment.sampling_params(trainable)` folds each adapter
into its kernel, `W + (alpha/r)·A·B` (`lora.merge_lora`, one jitted program), once per
iteration before the rollouts and once per evaluation, and the samplers run the model of
`Experiment.sampling_graphdef` (the same decoder without adapters) on it: a decoding step is
plain matmuls, and the adapters with their optimisation barrier stay in the update alone.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import text
from bpo_jax.models import config as model_config_lib
from bpo_jax.models import decoder as decoder_lib
from bpo_jax.models import lora as lora_lib
from bpo_jax.models import params as params_lib
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import registry
from bpo_jax.training import config as config_lib
from bpo_jax.training import distributed
from bpo_jax.training import settings as settings_lib
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib


def make_tasks(settings, split: str, num: int) -> list:
  """`num` tasks of the configured environment's split ("train" or "test")."""
  env = registry.get_environment(settings.env.name)
  return env.make_tasks(split, num=num, seed=settings.env.task_seed,
                        **dict(settings.env.options))


def sandbox_factory(settings):
  """A picklable factory of the configured environment's free-text sandboxes (a step takes a
  reply; `registry.make_free_text_sandbox`)."""
  return functools.partial(registry.make_free_text_sandbox, settings.env.name,
                           **dict(settings.env.options))


def make_pool(settings) -> pool_lib.SandboxPool:
  """The run's sandbox pool: worker processes on this host, or Ray actors
  (`env.pool.backend = "ray"`, imported only then)."""
  env = settings.env
  if env.pool.backend == "ray":
    from bpo_jax.sandboxes import ray_pool  # pylint: disable=g-import-not-at-top
    return ray_pool.RaySandboxPool(sandbox_factory(settings), num_workers=env.num_workers,
                                   timeout_s=env.timeout_s, address=env.pool.ray_address,
                                   cpus_per_worker=env.pool.cpus_per_worker,
                                   resource=env.pool.ray_resource)
  # In-process sandboxes keep no backups: there is no worker to lose.
  return pool_lib.SandboxPool(sandbox_factory(settings), num_workers=env.num_workers,
                              timeout_s=env.timeout_s, keep_backups=env.num_workers > 0)


def build_text(settings, workdir: str, train_tasks) -> tuple[Any, text.ChatFormat]:
  """The run's tokenizer and chat format: the checkpoint's (`model.checkpoint`), or a BPE
  tokenizer trained once on the primary process and saved to `<workdir>/tokenizer`; every
  process then loads the same directory.

  Raises:
    text.TokenizerError: the tokenizer cannot serve the chat format (one line).
  """
  name = settings.env.name
  system_prompt = registry.get_action_syntax(name).system_prompt
  directory = settings.model.checkpoint
  if not directory:
    if distributed.is_primary():
      text.ensure_bpe_tokenizer(name, workdir, train_tasks,
                                env_options=dict(settings.env.options))
    distributed.barrier("tokenizer saved")
    directory = os.path.join(workdir, text.TOKENIZER_DIR)
  return text.load_format(directory, system_prompt or None,
                          settings.env.max_observation_tokens or None)


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
  """What a run builds from its settings before any training."""

  settings: settings_lib.Settings
  workdir: str
  tokenizer: Any
  fmt: text.ChatFormat
  model_config: model_config_lib.ModelConfig
  graphdef: Any
  train_tasks: list
  eval_tasks: list
  pool: pool_lib.SandboxPool
  frozen: Any = None  # the frozen base parameters of a LoRA run; None when every one trains
  # The sampler programs compiled at start-up (`training/startup.py`), shared by the rollouts
  # and the evaluations; None: each compiled on its first call.
  programs: Any = None

  def full_params(self, params):
    """The whole model's parameters from the trainable ones (adapters joined to the base)."""
    return params if self.frozen is None else nnx.merge_state(params, self.frozen)

  def sampling_params(self, params):
    """The policy of the trainable `params` as samplers decode it: the whole model with each
    adapter merged into its kernel (`W + s·A·B`, summed in float32 and rounded once to the
    kernel's dtype), no adapter leaves left; for `sampling_graphdef`."""
    full = self.full_params(params)
    if self.model_config.lora_rank == 0:
      return full
    return _merge_program(self.model_config)(full)

  @functools.cached_property
  def sampling_graphdef(self):
    """The graphdef samplers decode with: `graphdef` without adapters (the same otherwise)."""
    if self.model_config.lora_rank == 0:
      return self.graphdef
    plain = self.model_config.without_lora()
    return nnx.graphdef(nnx.eval_shape(lambda: decoder_lib.Decoder(plain, rngs=nnx.Rngs(0))))

  def close(self):
    self.pool.shutdown()


@functools.lru_cache(maxsize=None)
def _merge_program(model_config: model_config_lib.ModelConfig):
  """`lora.merge_lora` for `model_config`, compiled once per parameter layout."""
  return jax.jit(functools.partial(lora_lib.merge_lora, config=model_config))


# ModelConfig fields `scale.model_preset` is checked against when the run loads a checkpoint.
SHAPE_FIELDS = ("architecture", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "vocab_size", "tie_word_embeddings")


def check_preset(settings, loaded: model_config_lib.ModelConfig) -> None:
  """`scale.model_preset`, with a checkpoint, must name the checkpoint's shape (ConfigError)."""
  if not settings.scale.model_preset:
    return
  preset = getattr(model_config_lib.ModelConfig, settings.scale.model_preset)()
  differ = [f"{name} {getattr(loaded, name)} (preset {getattr(preset, name)})"
            for name in SHAPE_FIELDS if getattr(loaded, name) != getattr(preset, name)]
  if differ:
    raise config_lib.ConfigError([
        f"scale.model_preset = {settings.scale.model_preset!r}: the checkpoint "
        f"{settings.model.checkpoint!r} has another shape: " + ", ".join(differ)])


def initial_model(settings, vocab_size: int) -> decoder_lib.Decoder:
  """The run's starting decoder: `model.checkpoint`'s weights (adapters from the seed, the
  layer loop's remat and scan from `scale`: `translate.checkpoint_overrides`), or a
  from-scratch decoder of the `model` section built from the seed."""
  m = settings.model
  if not m.checkpoint:
    model_config = translate.model_config(settings, vocab_size).replace(
        lora_rank=m.lora_rank, lora_alpha=m.lora_alpha)
    return decoder_lib.Decoder(model_config, rngs=nnx.Rngs(params=settings.seed))
  model, model_config = params_lib.load_hf_checkpoint(
      m.checkpoint, seed=settings.seed, **translate.checkpoint_overrides(settings))
  if vocab_size > model_config.vocab_size:
    raise params_lib.CheckpointError(
        f"model.checkpoint = {m.checkpoint!r}: the tokenizer has {vocab_size} tokens, more than "
        f"the model's vocab_size {model_config.vocab_size}")
  check_preset(settings, model_config)
  return model


def split_trainable(params, model_config) -> tuple[Any, Any]:
  """(trainable, frozen): (adapters, base) with LoRA, else (every parameter, None)."""
  if model_config.lora_rank == 0:
    return params, None
  return lora_lib.split_lora(params)


def build_experiment(settings, workdir: str) -> tuple[Experiment, update_lib.TrainState]:
  """Tasks, tokenizer and chat format, sandbox pool, initial model.

  Raises:
    text.TokenizerError: the tokenizer cannot serve the chat format.
    config_lib.ConfigError: a path of the configured budgets does not fit the context.
  """
  train_tasks = make_tasks(settings, "train", settings.env.num_train_tasks)
  eval_tasks = make_tasks(settings, "test", settings.env.num_eval_tasks)
  tokenizer, fmt = build_text(settings, workdir, train_tasks)
  config_lib.check_text_budgets(settings, fmt)
  model = initial_model(settings, fmt.vocab_size)
  model_config = model.config
  graphdef, params = nnx.split(model)
  trainable, frozen = split_trainable(params, model_config)
  state = update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=trainable, opt_state=None)
  return Experiment(settings=settings, workdir=workdir, tokenizer=tokenizer, fmt=fmt,
                    model_config=model_config, graphdef=graphdef, train_tasks=train_tasks,
                    eval_tasks=eval_tasks, pool=make_pool(settings), frozen=frozen), state

