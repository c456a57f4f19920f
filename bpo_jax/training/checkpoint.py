"""Checkpoints for exact resume: the train state's arrays plus the loop's own state, via Orbax.

A checkpoint at iteration i holds everything the loop needs to continue as if it had never
stopped:

* `state`: a pytree of arrays (parameters, optimiser state), saved with
  `ocp.args.StandardSave` and restored into an abstract tree of the same structure, so the
  restored leaves have the shapes, dtypes and shardings the caller asks for;
* `loop`: a JSON object (`ocp.args.JsonSave`) with the iteration, the raw bits of the RNG key,
  the position in the training task order, and the metrics history (which the loop rewrites to
  its JSONL file on resume, so the file equals that of an uninterrupted run).

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoint as the latest one.

Example:

  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=2)
  checkpointer.save(5, {"params": params, "opt_state": opt_state}, {"iteration": 5, ...})
  step = checkpointer.latest_step()                    # 5
  state, loop = checkpointer.restore(step, abstract_state)
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def key_to_json(key: jax.Array) -> list[int]:
  """The raw uint32 words of a PRNG key (typed or raw), exactly, as a JSON-able list."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return [int(x) for x in np.asarray(key, np.uint32).reshape(-1)]


def key_from_json(words: list[int]) -> jax.Array:
  """The raw (uint32[2]) PRNG key of `key_to_json`'s words."""
  return jax.numpy.asarray(np.asarray(words, np.uint32))


class Checkpointer:
  """Saves and restores `(state pytree, loop dict)` pairs by iteration number."""

  def __init__(self, directory: str, keep: int = 2, create: bool = True):
    self.directory = os.path.abspath(directory)
    if not create and not os.path.isdir(self.directory):
      raise FileNotFoundError(f"no checkpoint directory at {self.directory!r}")
    # Synchronous saves: the loop goes on only once a checkpoint is complete. A save cut short
    # (the process killed) leaves a temporary directory, which is removed on the next start.
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                           enable_async_checkpointing=False,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, loop: dict) -> None:
    """Writes checkpoint `step` and waits until it is complete on disk."""
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    loop=ocp.args.JsonSave(loop)))
    self.manager.wait_until_finished()

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """The checkpoint `step` restored into `abstract_state`'s structure (ShapeDtypeStructs or
    arrays); returns `(state, loop)`."""
    if step not in self.manager.all_steps():
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory!r}; "
                              f"have {self.all_steps()}")
    abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    restored = self.manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      loop=ocp.args.JsonRestore()))
    return restored.state, dict(restored.loop)

  def close(self) -> None:
    self.manager.close()
