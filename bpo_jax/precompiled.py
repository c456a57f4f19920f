"""Programs compiled before their first call, kept by shape: a run's closed program set.

A `ProgramSet` maps a `sampling_shapes.ProgramKey` to the executable compiled for it
(`jit(f).lower(abstract inputs).compile()`, no data needed). The callers that hold one (the
`Sampler`'s `append` and `generate`, the update step of `training/startup.py`) look their
call's shape up and run its executable; a shape the set lacks still runs, compiled on the call
as without the set, and is counted as a miss with a warning: a run whose set is complete counts
none. `compile_sampler_programs` fills a set with the sampler's programs from abstract
parameters (shapes and dtypes, as `jax.eval_shape` gives them).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Hashable, Iterable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import sampling
from bpo_jax import sharding
from bpo_jax.sampling_shapes import ProgramKey


def label(key: Hashable) -> str:
  """A key as the logs name it (`ProgramKey.label`, else its repr)."""
  return key.label() if isinstance(key, ProgramKey) else repr(key)


class ProgramSet:
  """Compiled executables keyed by shape, the seconds each took, and the calls outside them.

  Attributes:
    limits: the `SamplingParams.limits()` its decode loops were compiled for (None: none).
    executables: {key: `jax.stages.Compiled`}.
    seconds: {key: seconds its lowering and compile took}, in compile order.
    hits: calls run from the set's executables.
    misses: calls whose key the set lacks (each compiled on the call by JAX, once per shape).
    missed: those keys, each once, in order.
  """

  def __init__(self, limits: sampling.SamplingParams | None = None):
    self.limits = limits
    self.executables: dict[Hashable, Any] = {}
    self.seconds: dict[Hashable, float] = {}
    self.hits = 0
    self.misses = 0
    self.missed: list[Hashable] = []

  def compile(self, key: Hashable, lower: Callable[[], Any]) -> float:
    """Compiles `lower()` (a `jax.stages.Lowered`) into the set under `key`; logs and returns
    the seconds it took (lowering included)."""
    start = time.perf_counter()
    self.executables[key] = lower().compile()
    seconds = time.perf_counter() - start
    self.seconds[key] = seconds
    logging.info("start-up compile: %s in %.2f s", label(key), seconds)
    return seconds

  @property
  def total_seconds(self) -> float:
    return float(sum(self.seconds.values()))

  def run(self, key: Hashable, args: tuple, kwargs: dict, compile_on_call: Callable):
    """The executable of `key` on `args`/`kwargs` (its inputs without the static ones), or,
    for a key the set lacks, `compile_on_call(*args, **kwargs)`: a miss, counted and logged."""
    executable = self.executables.get(key)
    if executable is not None:
      self.hits += 1
      return executable(*args, **kwargs)
    self.miss(key)
    return compile_on_call(*args, **kwargs)

  def miss(self, key: Hashable, why: str = "is not in the start-up program set") -> None:
    """Counts a call the set cannot run (`key` absent, or its inputs laid out otherwise than
    the set's programs take them); logs each key once."""
    self.misses += 1
    if key not in self.missed:
      self.missed.append(key)
      logging.warning("%s %s: compiled on its first call", label(key), why)


def abstract(tree):
  """`tree`'s arrays as `jax.ShapeDtypeStruct`s (shape and dtype; numpy scalars included)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)), tree)


def _abstract_unembedding(sampler: sampling.Sampler, params, batch: int):
  """What `Sampler.unembedding` gives a call on `batch` rows of `params`, as an abstract array
  (or None): the embedding transposed, laid out as its transpose (the embedding's partition
  spec reversed) where the embedding is laid out on a mesh."""
  if not sampler.config.tie_word_embeddings or batch < 2:
    return None
  if jax.local_devices()[0].platform != "cpu":
    return None
  embed = jax.tree.leaves(params["embed"])[0]
  out = jax.eval_shape(jnp.transpose, embed)
  layout = getattr(embed, "sharding", None)
  if isinstance(layout, jax.sharding.NamedSharding):
    spec = tuple(layout.spec) + (None,) * (embed.ndim - len(layout.spec))
    out = jax.ShapeDtypeStruct(out.shape, out.dtype, sharding=jax.sharding.NamedSharding(
        layout.mesh, jax.sharding.PartitionSpec(*reversed(spec))))
  return out


def _abstract_state(sampler: sampling.Sampler, batch: int, mesh):
  """A `DecodeState` of `batch` rows as the sampler's calls take it, abstract: a paged state
  with its fixed pool and without the host's bookkeeping; a dense one on `mesh` (the
  parameters', or None) laid out by `sharding.cache_shardings`, as `Sampler.init_state` and
  `Sampler.take_rows` make it there."""
  if sampler.page_size:
    return jax.eval_shape(lambda: _without_book(sampler.init_state(batch)))
  state = jax.eval_shape(lambda: sampling.init_decode_state(sampler.config, batch,
                                                            sampler.max_length))
  if mesh is None:
    return state
  return sharding.with_shardings(state, sharding.cache_shardings(state, mesh))


def _lower(sampler: sampling.Sampler, params, key: ProgramKey, limits: sampling.SamplingParams):
  """The `jax.stages.Lowered` of the sampler's program `key` on abstract `params` (laid out on
  a mesh where they carry its shardings), in the calling convention of `Sampler.append` /
  `Sampler.generate`: the state as `_abstract_state` makes it, host arrays (tokens, lengths,
  keys, settings) without a layout, as transfers leave them."""
  mesh = sampling.params_mesh(params)
  state = _abstract_state(sampler, key.batch, mesh)
  unembedding = _abstract_unembedding(sampler, params, key.batch)
  rows = jax.ShapeDtypeStruct((key.batch,), jnp.int32)
  if key.name == "append":
    tokens = jax.ShapeDtypeStruct((key.batch, key.tokens), jnp.int32)
    return sampling._append_donating.lower(  # pylint: disable=protected-access
        sampler.graphdef, params, state, tokens, rows, attend_length=key.window,
        unembedding=unembedding, mesh=mesh)
  run = sampling._generate_donating if key.keep_state else sampling._generate_jit  # pylint: disable=protected-access
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), key.batch))
  return run.lower(sampler.graphdef, params, state, keys, limits, attend_length=key.window,
                   keep_state=key.keep_state,
                   active=jax.ShapeDtypeStruct((key.batch,), jnp.bool_),
                   unembedding=unembedding, settings=abstract(limits.settings()), mesh=mesh)


def _without_book(decode_state):
  return decode_state.replace(cache=decode_state.cache.without_book())


def compile_sampler_programs(programs: ProgramSet, sampler: sampling.Sampler, params,
                             keys: Iterable[ProgramKey]) -> None:
  """Compiles the sampler's `keys` (`sampling_shapes.sampler_program_keys`) into `programs`
  for the policy's abstract `params`, at `programs.limits`. The sampler must be the donating
  one of a rollout engine (`Sampler(..., donate=True)`), with the dense cache or a paged one of
  a fixed pool (`pool_pages`)."""
  if not sampler.donate or (sampler.page_size and not sampler.pool_pages):
    raise ValueError("start-up programs are the rollout engine's: a donating sampler with the "
                     "dense cache or a paged one of a fixed pool")
  keys = list(keys)
  for key in keys:
    programs.compile(key, lambda key=key: _lower(sampler, params, key, programs.limits))
  if sampler.page_size:  # forks into free slots move their next logits (`Sampler.place`)
    for batch in sorted({key.batch for key in keys}):
      logits = jax.ShapeDtypeStruct((batch, sampler.config.vocab_size), jnp.float32)
      rows = jax.ShapeDtypeStruct((batch,), jnp.int32)
      programs.compile(ProgramKey("place_logits", batch, 0, 0),
                       lambda logits=logits, rows=rows: sampling._place_logits.lower(  # pylint: disable=protected-access
                           logits, rows, rows))
