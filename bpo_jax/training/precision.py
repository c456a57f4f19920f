"""Low-precision parameters with float32 master weights kept in the optimizer state.

Large policies are stored and run in bfloat16 (half the memory and bandwidth of float32), but
an optimizer step applied to bfloat16 weights loses every update smaller than half a bfloat16
ulp of the weight (8 significant bits: an update below ~0.4% of |w| rounds away). The usual
remedy is master weights: the optimizer keeps a float32 copy `m` of the parameters and its
moments in float32, and the model's parameters are the rounding of the master copy:

    g32      = float32(g)                       # the bfloat16 gradient, widened
    u, s'    = inner.update(g32, s, m)          # e.g. AdamW on float32 state
    m'       = m + u
    params'  = round_bf16(m')                   # what the model computes with

`with_float32_master_weights(tx)` is an optax wrapper doing exactly this. Its `update` returns
float32 updates `m' - float32(params)`; `optax.apply_updates` adds them in float32 and casts the
sum back to the parameter's dtype, which gives `round_bf16(m')` (the difference of two nearby
floats is exact in float32, so the sum is `m'` itself before rounding). Small updates
accumulate in `m` across steps instead of vanishing.

Example:

  tx = with_float32_master_weights(optax.adamw(1e-4))
  params = cast_floating(params, jnp.bfloat16)
  opt_state = tx.init(params)        # master copy and Adam moments in float32
  updates, opt_state = tx.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)   # still bfloat16

The master copy is a copy of the parameter tree inside the optimizer state, so
`bpo_jax.sharding.optimizer_shardings` gives it the parameters' sharding (FSDP-sharded like the
moments). Memory per parameter: 2 (bf16 weight) + 4 (master) + 8 (Adam moments) bytes, against
4 + 8 for a float32 model without a master copy.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class MasterWeightsState(NamedTuple):
  """The float32 master copy of the parameters and the wrapped optimizer's state on it."""

  master: Any
  inner: Any


def _is_floating(x) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def cast_floating(tree, dtype):
  """Casts the floating-point leaves of `tree` to `dtype`; integer leaves are kept.

  Works on arrays and on `jax.ShapeDtypeStruct`s (abstract trees keep their sharding).
  """

  def cast(x):
    if not _is_floating(x.dtype):
      return x
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
    return x.astype(dtype)

  return jax.tree.map(cast, tree)


def with_float32_master_weights(inner: optax.GradientTransformation
                                ) -> optax.GradientTransformation:
  """Wraps `inner` so it runs on a float32 master copy of low-precision parameters.

  Args:
    inner: any optax transformation (e.g. `update.make_optimizer(...)`); it sees float32
      gradients and float32 parameters only.

  Returns:
    A transformation whose state is `MasterWeightsState(master, inner_state)` and whose updates
    are float32 (see the module docstring for why `apply_updates` then lands on the rounded
    master weights). For float32 parameters it computes the same steps as `inner`.
  """

  def init_fn(params):
    # Its own buffers even where a parameter is float32 already (a cast to the same dtype
    # returns the same array): the train step donates parameters and optimizer state together.
    master = jax.tree.map(lambda x: jnp.array(x, copy=True), cast_floating(params, jnp.float32))
    return MasterWeightsState(master=master, inner=inner.init(master))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("with_float32_master_weights needs `params` in update(): the float32 "
                       "updates are taken relative to the current (low-precision) parameters")
    grads = cast_floating(updates, jnp.float32)
    inner_updates, inner_state = inner.update(grads, state.inner, state.master)
    master = optax.apply_updates(state.master, inner_updates)
    # Relative to the parameters the model holds, so `params + updates` lands on the master.
    new_updates = jax.tree.map(
        lambda m, p: m - p.astype(jnp.float32) if _is_floating(p) else jnp.zeros_like(p),
        master, params)
    return new_updates, MasterWeightsState(master=master, inner=inner_state)

  return optax.GradientTransformation(init_fn, update_fn)
