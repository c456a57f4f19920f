"""Low-rank adapters (LoRA; Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A projection `y = x W` with W [in..., out...] (our kernel layouts, e.g. q: [hidden, heads,
head_dim]) becomes

  y = x W + s · (x A) B,   A [in..., r] ~ N(0, 1/in),   B [r, out...] = 0,   s = alpha / r,

on the attention q/k/v/o and MLP gate/up/down projections of every layer when
`ModelConfig.lora_rank = r > 0`. With B = 0 the model computes exactly the base model; training
moves A and B only, the base W stays frozen. The adapters are `LoRAParam`s, a subclass of
`nnx.Param`, so filters pick them out:

  optimizer = nnx.Optimizer(model, tx, wrt=LoRAParam)          # only the adapters train
  adapters, base = split_lora(nnx.state(model))                 # trainable / frozen states
  logits, _ = forward(graphdef, nnx.merge_state(adapters, base), tokens)
  merged = merge_lora(nnx.state(model), model.config)           # W + s·A·B, no adapters left
  plain = nnx.merge(nnx.split(Decoder(config.without_lora(), ...))[0], merged)

`nnx.state(model, nnx.Param)` includes the adapters (a subclass); `BASE_PARAMS` selects the
base parameters alone. Parameter names: `{q,k,v,o}_lora_{a,b}` on each layer's `attn`,
`{gate,up,down}_lora_{a,b}` on its `mlp`, beside the kernel they adapt.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

ATTENTION_TARGETS = ("q", "k", "v", "o")
MLP_TARGETS = ("gate", "up", "down")


class LoRAParam(nnx.Param):
  """A low-rank adapter's A or B: trainable while the base `nnx.Param`s stay frozen."""


# Every parameter but the adapters: the frozen base of a LoRA model.
BASE_PARAMS = nnx.All(nnx.Param, nnx.Not(LoRAParam))


def trainable_filter(config):
  """What trains for `config`: the adapters with `lora_rank > 0`, else every parameter."""
  return LoRAParam if config.lora_rank > 0 else nnx.Param


def init_adapter(key: jax.Array, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                 rank: int, dtype) -> tuple[LoRAParam, LoRAParam]:
  """(A [in..., r] ~ N(0, 1/prod(in)), B [r, out...] = 0) as `LoRAParam`s of `dtype`."""
  fan_in = math.prod(in_shape)
  a = jax.random.normal(key, (*in_shape, rank), jnp.float32) / math.sqrt(fan_in)
  return LoRAParam(a.astype(dtype)), LoRAParam(jnp.zeros((rank, *out_shape), dtype))


def adapter_output(x: jax.Array, a: jax.Array, b: jax.Array, scale: float, dtype) -> jax.Array:
  """`s · (x A) B` for x [..., in...]: [..., out...], computed in `dtype`.

  The rank-r product is never formed as a full [in, out] matrix: two thin matmuls.
  """
  num_in = a.ndim - 1
  batch_shape = x.shape[:x.ndim - num_in]
  x_flat = x.reshape(*batch_shape, -1).astype(dtype)
  low = x_flat @ a.reshape(-1, a.shape[-1]).astype(dtype)
  out = (low * jnp.asarray(scale, dtype)) @ b.reshape(b.shape[0], -1).astype(dtype)
  return out.reshape(*batch_shape, *b.shape[1:])


def adapter_delta(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """`s · A B` [in..., out...] in float32, the change the adapter makes to its kernel."""
  a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
  return scale * jnp.tensordot(a32, b32, axes=1)


def split_lora(state: nnx.State) -> tuple[nnx.State, nnx.State]:
  """(adapters, everything else) of a model's state; `nnx.merge_state` joins them back."""
  adapters, rest = nnx.split_state(state, LoRAParam, ...)
  return adapters, rest


def _merge_module(module: dict, targets, scale: float) -> dict:
  """One `attn` / `mlp` pure dict with its adapters folded into the kernels and dropped."""
  merged = {k: v for k, v in module.items() if "_lora_" not in k}
  for name in targets:
    if f"{name}_lora_a" not in module:
      continue
    kernel = module[f"{name}_kernel"]
    delta = adapter_delta(module[f"{name}_lora_a"], module[f"{name}_lora_b"], scale)
    merged[f"{name}_kernel"] = (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)
  return merged


def merge_lora(state: nnx.State, config) -> nnx.State:
  """The state of the same model without adapters: each kernel W becomes `W + s · A B`.

  The result fits `Decoder(config.without_lora())`. The sum is taken in float32 and
  rounded once to the kernel's dtype, so a float32 merged model computes the unmerged one's
  function up to the rounding of `x (W + sAB)` against `x W + s (x A) B`. Pure (jit it if the
  model is large); the state passed in is left as it is. A state without adapters is returned
  unchanged.
  """
  if config.lora_rank == 0:
    return state
  pure = nnx.to_pure_dict(state)
  scale = config.lora_scale
  layers = {}
  for index, layer in pure["layers"].items():
    layers[index] = {**layer, "attn": _merge_module(layer["attn"], ATTENTION_TARGETS, scale),
                     "mlp": _merge_module(layer["mlp"], MLP_TARGETS, scale)}
  _, base = split_lora(state)
  merged = jax.tree.map(lambda x: x, base)  # new Variables: the input's are not touched
  nnx.replace_by_pure_dict(merged, {**nnx.to_pure_dict(base), "layers": layers})
  return merged
