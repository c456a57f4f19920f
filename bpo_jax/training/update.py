"""The train state and the jitted policy update over packed trees.

One update step takes a `packing.PackedBatch` of B rows (one tree per row, or one path per row in
the per-path reference layout), splits it into `micro_batches` micro-batches of B/M rows,
accumulates the gradient of the token objective (`bpo_jax.losses.policy_loss`) over them with a
`lax.scan`, and applies one optax step (gradient clipping is part of the optimizer chain).

Normalisation across micro-batches. Each micro-batch contributes the *sum* of its token terms,
divided by one denominator D computed from the whole batch, so the accumulated gradient equals
the gradient of the whole-batch loss whatever M is:

  * "tree":     D = the number of trees (non-padding rows); unbiased (see losses.py);
  * "token":    D = the number of action tokens in the batch (GRPO/DAPO token mean);
  * "sequence": each row's terms are divided by its own action-token count, D = rows.

Frozen parameters. With LoRA the train state's parameters are the adapters alone; the frozen
base is passed to each call as `frozen` and joined to them (`nnx.merge_state`) inside the
step, so its gradient is never taken and the optimiser state covers the adapters only. The
reference parameters `ref` of the KL term have the train state's structure (the starting
adapters, or the starting parameters) and share the same frozen base.

PPO epochs are the host loop `ppo_update`: the same batch (with the behaviour logprobs recorded
at sampling) is used `num_epochs` times, so the ratio moves away from 1 after the first step.

Metrics: loss, gradient norm (before clipping), the variance of the per-micro-batch gradient
norms (each micro-batch's gradient scaled by M, i.e. an estimate of the full gradient), clip
fraction, approximate KL to the sampling policy, KL to the reference policy when given, and the
mean entropy of the action tokens' distributions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bpo_jax import losses
from bpo_jax import packing
from bpo_jax.models.decoder import forward
from bpo_jax.models.decoder import forward_hidden


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  """Everything an update changes: step count, parameters and optimizer state (a pytree)."""

  step: jax.Array
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW with warm-up, optional cosine decay, and global-norm clipping."""

  learning_rate: float = 2e-4
  warmup_steps: int = 0
  decay_steps: int = 0  # 0: constant after warm-up
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  max_grad_norm: float = 1.0  # 0 disables clipping


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
  if config.learning_rate <= 0:
    raise ValueError(f"learning_rate must be positive, got {config.learning_rate}")
  if config.decay_steps > 0:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, max(config.warmup_steps, 1),
        config.warmup_steps + config.decay_steps)
  elif config.warmup_steps > 0:
    schedule = optax.linear_schedule(0.0, config.learning_rate, config.warmup_steps)
  else:
    schedule = config.learning_rate
  chain = []
  if config.max_grad_norm > 0:
    chain.append(optax.clip_by_global_norm(config.max_grad_norm))
  chain.append(optax.adamw(schedule, b1=config.b1, b2=config.b2,
                           weight_decay=config.weight_decay))
  return with_fixed_state_dtypes(optax.chain(*chain))


def with_fixed_state_dtypes(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` whose state keeps its dtypes from `init` on: each leaf is made in the dtype that
  `update` returns it in.

  Adam's moments start as zeros in the parameters' dtype, and an update mixes the (at least)
  float32 gradients into them: `mu' = b1·mu + (1-b1)·g` of bfloat16 adapters comes back
  float32. A state whose dtypes change after the first step changes the compiled update's
  inputs, which compiles it again. Made float32 from the start instead (zeros widen exactly),
  the state computes the same numbers as the state the first update returns, and every step
  runs the one program.
  """

  def init_fn(params):
    state = tx.init(params)
    # The update's gradients: accumulated in at least float32 (`_gradient_accumulator`).
    grads = jax.tree.map(
        lambda p: jax.ShapeDtypeStruct(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params)
    _, after = jax.eval_shape(tx.update, grads, state, params)
    return jax.tree.map(lambda x, a: x if x.dtype == a.dtype else x.astype(a.dtype), state,
                        after)

  return optax.GradientTransformation(init_fn, tx.update)


def create_train_state(model: nnx.Module, tx: optax.GradientTransformation):
  """Splits an NNX model into (graphdef, TrainState); the model must hold only nnx.Param."""
  graphdef, params = nnx.split(model)
  for path, leaf in jax.tree_util.tree_leaves_with_path(
      nnx.state(model, nnx.Not(nnx.Param))):
    raise ValueError(f"the model has a non-parameter variable at {jax.tree_util.keystr(path)}; "
                     "the update only carries nnx.Param state")
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return graphdef, state


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  """Static settings of the update step (hashable: part of the compiled program)."""

  micro_batches: int = 2
  clip_epsilon: float = 0.2
  clip_epsilon_high: float | None = None
  kl_coef: float = 0.0
  normalization: str = "tree"
  temperature: float = 1.0  # the sampling temperature, so old and new logprobs match
  # Tokens whose logits are formed at once (`packing.token_logprobs_from_hidden`); 0: the
  # logits of every position at once, [rows, length, vocab].
  logits_chunk: int = 1024

  def __post_init__(self):
    if self.normalization not in losses.NORMALIZATIONS:
      raise ValueError(f"normalization must be one of {losses.NORMALIZATIONS}, "
                       f"got {self.normalization!r}")
    if self.micro_batches < 1:
      raise ValueError(f"micro_batches must be >= 1, got {self.micro_batches}")
    if self.logits_chunk < 0:
      raise ValueError(f"logits_chunk must be >= 0, got {self.logits_chunk}")
    if self.temperature <= 0:
      raise ValueError(f"temperature must be > 0 for training, got {self.temperature}")


def packed_logprobs(graphdef, params, batch: packing.PackedBatch, temperature: float = 1.0,
                    logits_chunk: int = 0):
  """Per-token logprob and entropy of a packed batch under the model (ancestor attention);
  with `logits_chunk` > 0, the logits formed that many tokens at a time (see UpdateConfig)."""
  mask = packing.attention_mask(batch.segment_start, batch.segment_end)
  if logits_chunk:
    hidden, rows = forward_hidden(graphdef, params, batch.tokens, positions=batch.positions,
                                  attention_mask=mask)
    return packing.token_logprobs_from_hidden(hidden, rows, batch.tokens, batch.predecessor,
                                              temperature, logits_chunk)
  logits, _ = forward(graphdef, params, batch.tokens, positions=batch.positions,
                      attention_mask=mask)
  if temperature != 1.0:
    logits = logits / np.float32(temperature)
  return packing.gather_token_logprobs(logits, batch.tokens, batch.predecessor)


def _joined(params, frozen):
  """The whole model's parameters: the trainable ones, with the frozen base when there is one."""
  return params if frozen is None else nnx.merge_state(params, frozen)


def _denominator(batch: packing.PackedBatch, normalization: str, num_trees=None) -> jax.Array:
  if normalization == "token":
    return jnp.maximum(jnp.sum(batch.loss_mask).astype(jnp.float32), 1.0)
  if normalization == "tree" and num_trees is not None:
    return jnp.asarray(num_trees, jnp.float32)
  rows = jnp.sum(batch.segment_start[:, 0] >= 0).astype(jnp.float32)
  return jnp.maximum(rows, 1.0)


def _token_weights(batch: packing.PackedBatch, normalization: str) -> jax.Array:
  if normalization != "sequence":
    return batch.weight
  row_tokens = jnp.maximum(jnp.sum(batch.loss_mask, axis=-1, keepdims=True), 1)
  return batch.weight / row_tokens


def _split_micro(batch, num_micro: int, row_sharding=None):
  """[B, L] fields -> [M, B/M, L] micro-batches.

  Unsharded, micro-batch m is rows `m·B/M .. (m+1)·B/M - 1`. With `row_sharding` (rows sharded
  over devices in contiguous blocks) micro-batch m is rows m, m + M, m + 2M, ...: every device
  then holds its share of every micro-batch, whereas a contiguous split would put each
  micro-batch on a few devices and XLA would replicate it over the others (M times the
  activation memory). The accumulated gradient is the same sum either way.
  """
  rows = batch.tokens.shape[0]
  if rows % num_micro:
    raise ValueError(f"{rows} rows do not split into {num_micro} micro-batches; pad the batch "
                     "with `num_rows` to a multiple")
  if row_sharding is None:
    return jax.tree.map(lambda x: x.reshape((num_micro, rows // num_micro) + x.shape[1:]), batch)
  spec = row_sharding.spec[0] if len(row_sharding.spec) else None
  axes = () if spec is None else ((spec,) if isinstance(spec, str) else tuple(spec))
  shards = int(np.prod([row_sharding.mesh.shape[a] for a in axes]))
  if (rows // num_micro) % shards:
    raise ValueError(f"{rows} rows in {num_micro} micro-batches give {rows // num_micro} rows "
                     f"per micro-batch, which the {shards} devices of the batch axes {axes} do "
                     f"not divide; use a multiple of {num_micro * shards} rows")
  return jax.tree.map(
      lambda x: jnp.swapaxes(x.reshape((rows // num_micro, num_micro) + x.shape[1:]), 0, 1),
      batch)


def _gradient_accumulator(params):
  """Zero gradients in at least float32: summing micro-batch gradients of bfloat16 parameters
  in bfloat16 would round each partial sum to 8 significant bits."""
  return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)),
                      params)


def _accumulate(acc, grads):
  return jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)


def _step_metrics(grads, micro_losses, micro_norms, sums) -> dict:
  """A step's metrics from its micro-batches' losses, gradient norms and token sums (per-token
  means over the step's action tokens)."""
  tokens = jnp.maximum(jnp.sum(sums["num_tokens"]), 1.0)
  metrics = {
      "loss": jnp.sum(micro_losses),
      "grad_norm": optax.tree.norm(grads),
      "micro_grad_norm_mean": jnp.mean(micro_norms),
      "micro_grad_norm_var": jnp.var(micro_norms),
      "clip_fraction": jnp.sum(sums["clip_fraction"]) / tokens,
      "approx_kl": jnp.sum(sums["approx_kl"]) / tokens,
      "entropy": jnp.sum(sums["entropy"]) / tokens,
      "num_action_tokens": jnp.sum(sums["num_tokens"]),
  }
  if "ref_kl" in sums:
    metrics["ref_kl"] = jnp.sum(sums["ref_kl"]) / tokens
  return metrics


def make_gradient_fn(graphdef, config: UpdateConfig, use_ref: bool = False,
                     batch_sharding: Any = None) -> Callable:
  """Returns `gradient(params, batch, ref=None, num_trees=None, frozen=None) -> (grads,
  micro_losses, micro_norms, sums)`: the update's gradient of the whole-batch loss, accumulated
  in at least float32 over the micro-batches, before any clipping or optimizer step (not jitted).

  `make_train_step` applies the optimizer to it; `gradient_variance` measures its spread.
  """

  def micro_loss(params, mb, denominator, ref, frozen):
    logprob, entropy = packed_logprobs(graphdef, _joined(params, frozen), mb, config.temperature,
                                       config.logits_chunk)
    ref_logprob = None
    if use_ref:
      ref_logprob, _ = packed_logprobs(graphdef, _joined(jax.lax.stop_gradient(ref), frozen),
                                       mb, config.temperature, config.logits_chunk)
    total, metrics = losses.policy_loss(
        logprob, mb.old_logprob, mb.advantage, _token_weights(mb, config.normalization),
        mb.loss_mask, ref_logprobs=ref_logprob, clip_eps=config.clip_epsilon,
        clip_eps_high=config.clip_epsilon_high, kl_coef=config.kl_coef, normalization="tree",
        normalizer=1.0)
    mask = mb.loss_mask.astype(jnp.float32)
    sums = {
        "clip_fraction": metrics["clip_fraction"] * metrics["num_tokens"],
        "approx_kl": metrics["approx_kl"] * metrics["num_tokens"],
        "entropy": jnp.sum(entropy * mask),
        "num_tokens": metrics["num_tokens"],
    }
    if use_ref:
      sums["ref_kl"] = metrics["ref_kl"] * metrics["num_tokens"]
    return total / denominator, sums

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def gradient(params, batch: packing.PackedBatch, ref=None, num_trees=None, frozen=None):
    denominator = _denominator(batch, config.normalization, num_trees)
    micro = _split_micro(batch, config.micro_batches, batch_sharding)

    def body(acc, mb):
      if batch_sharding is not None:  # each micro-batch spread over the batch axes
        mb = jax.lax.with_sharding_constraint(mb, batch_sharding)
      (loss, sums), grads = grad_fn(params, mb, denominator, ref, frozen)
      norm = optax.tree.norm(grads) * config.micro_batches
      return _accumulate(acc, grads), (loss, norm, sums)

    grads, (micro_losses, micro_norms, sums) = jax.lax.scan(
        body, _gradient_accumulator(params), micro)
    return grads, micro_losses, micro_norms, sums

  return gradient


def make_train_step(graphdef, tx: optax.GradientTransformation, config: UpdateConfig,
                    ref_params: Any = None, state_sharding: Any = None,
                    batch_sharding: Any = None) -> Callable:
  """Returns a jitted `train_step(state, batch, ref=None, num_trees=None, frozen=None) ->
  (state, metrics)`.

  `ref_params` given here only switches the KL term on; the values are passed at call time as
  `ref` (so the reference can be updated without recompiling). `num_trees` overrides the
  "tree" denominator, which otherwise counts non-padding rows: the per-path layout has one
  row per path, and passing the number of trees there makes its loss equal the packed one.
  """
  use_ref = config.kl_coef > 0
  if use_ref and ref_params is None:
    raise ValueError("kl_coef > 0 needs reference parameters")
  gradient = make_gradient_fn(graphdef, config, use_ref, batch_sharding)

  def train_step(state: TrainState, batch: packing.PackedBatch, ref=None, num_trees=None,
                 frozen=None):
    grads, micro_losses, micro_norms, sums = gradient(state.params, batch, ref, num_trees,
                                                      frozen)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = _step_metrics(grads, micro_losses, micro_norms, sums)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    # A NaN or Inf loss skips the update (the loop logs `skipped`).
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
    metrics["skipped"] = (~finite).astype(jnp.float32)
    return new_state, metrics

  if state_sharding is None:
    return jax.jit(train_step, donate_argnums=(0,))
  ref_sharding = state_sharding.params if use_ref else None
  jitted = jax.jit(train_step, donate_argnums=(0,),
                   in_shardings=(state_sharding, batch_sharding, ref_sharding, None, None),
                   out_shardings=(state_sharding, None))

  def sharded_train_step(state, batch, ref=None, num_trees=None, frozen=None):
    # in_shardings cover every positional argument, so the optional ones are always passed.
    return jitted(state, batch, ref, num_trees, frozen)

  sharded_train_step.jitted = jitted
  return sharded_train_step


def ppo_update(train_step: Callable, state: TrainState, batch: packing.PackedBatch,
               num_epochs: int = 1, ref=None):
  """`num_epochs` optimizer steps on one batch; returns the state and each epoch's metrics."""
  if num_epochs < 1:
    raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
  history = []
  for _ in range(num_epochs):
    state, metrics = train_step(state, batch, ref)
    history.append(metrics)
  return state, history


def make_sft_step(graphdef, tx: optax.GradientTransformation, micro_batches: int = 2,
                  state_sharding: Any = None, batch_sharding: Any = None,
                  logits_chunk: int = UpdateConfig.logits_chunk):
  """A jitted supervised step: mean negative log-likelihood of the loss-masked (action) tokens.

  Used for warm starts from expert trajectories packed as `PackedBatch` (advantage and weight
  are ignored). `sft_step(state, batch, frozen=None)`; `frozen`, `state_sharding` and
  `batch_sharding` as for `make_train_step` (sharded, the state keeps its layout and each
  micro-batch is spread over the batch axes); `logits_chunk` as `UpdateConfig`'s.
  """

  def micro_loss(params, mb, denominator, frozen):
    logprob, _ = packed_logprobs(graphdef, _joined(params, frozen), mb, 1.0, logits_chunk)
    return -jnp.sum(jnp.where(mb.loss_mask, logprob, 0.0)) / denominator

  def sft_step(state: TrainState, batch: packing.PackedBatch, frozen=None):
    denominator = jnp.maximum(jnp.sum(batch.loss_mask).astype(jnp.float32), 1.0)
    micro = _split_micro(batch, micro_batches, batch_sharding)

    def body(acc, mb):
      if batch_sharding is not None:
        mb = jax.lax.with_sharding_constraint(mb, batch_sharding)
      loss, grads = jax.value_and_grad(micro_loss)(state.params, mb, denominator, frozen)
      return (_accumulate(acc[0], grads), acc[1] + loss), None

    zeros = _gradient_accumulator(state.params)
    (grads, loss), _ = jax.lax.scan(body, (zeros, jnp.zeros(())), micro)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  if state_sharding is None:
    return jax.jit(sft_step, donate_argnums=(0,))
  jitted = jax.jit(sft_step, donate_argnums=(0,),
                   in_shardings=(state_sharding, batch_sharding, None),
                   out_shardings=(state_sharding, None))
  return lambda state, batch, frozen=None: jitted(state, batch, frozen)
