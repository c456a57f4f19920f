"""The shapes the sampler compiles for: token buckets, attention windows, and the closed set
of (program, shape) keys a run's settings allow.

`Sampler.append` pads the tokens it appends to a token bucket (`bucket_length`, powers of two
from 16, capped at the cache length) and attends over a window (`attend_length_for`, powers of
two from `MIN_ATTEND_LENGTH`, capped at the cache length); `Sampler.generate` decodes over a
window. With the batch sizes a run pads its rows to, these fix every shape the sampler's
programs are compiled for (`sampler_program_keys`), so they can all be compiled before the
first rollout (`bpo_jax.precompiled`).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Optional, Sequence

import numpy as np

# The shortest attention window (see "Attention window" in `bpo_jax.sampling`).
MIN_ATTEND_LENGTH = 256


def bucket_length(n: int, minimum: int = 16, maximum: Optional[int] = None) -> int:
  """The padded length for n tokens: the next power of two ≥ max(n, minimum), capped.

  Example: `bucket_length(17) == 32`, `bucket_length(3) == 16`, `bucket_length(40, maximum=48)
  == 48`.
  """
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  size = max(minimum, 1 << max(n - 1, 0).bit_length())
  if maximum is not None:
    if n > maximum:
      raise ValueError(f"{n} tokens exceed the maximum length {maximum}")
    size = min(size, maximum)
  return size


def attend_length_for(lengths_after: Sequence[int], max_length: int,
                      minimum: int = MIN_ATTEND_LENGTH) -> int:
  """The attention window for rows that will hold `lengths_after` tokens each.

  The next power of two ≥ the longest row and ≥ `minimum`, capped at `max_length` (rows longer
  than the cache stop at its end). Rows that take no tokens are left out by the caller.
  Example: `attend_length_for([100, 40], 1024) == 256`, `attend_length_for([300], 1024) ==
  512`, `attend_length_for([1500], 1024) == 1024`, `attend_length_for([], 48) == 48`.
  """
  longest = int(np.max(np.asarray(lengths_after, np.int64), initial=1))
  return bucket_length(min(longest, max_length), minimum=minimum, maximum=max_length)


def pad_token_rows(rows: Sequence[Sequence[int]], length: Optional[int] = None,
                   maximum: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads token lists into (tokens [B, T] int32, lengths [B] int32).

  T is `length` if given, else `bucket_length` of the longest row (capped at `maximum`).
  """
  lengths = np.asarray([len(r) for r in rows], np.int32)
  longest = int(lengths.max()) if len(rows) else 0
  if length is None:
    length = bucket_length(max(longest, 1), maximum=maximum)
  if longest > length:
    raise ValueError(f"a row has {longest} tokens, more than the padded length {length}")
  tokens = np.zeros((len(rows), length), np.int32)
  for b, row in enumerate(rows):
    tokens[b, :len(row)] = np.asarray(row, np.int32)
  return tokens, lengths



class ProgramKey(NamedTuple):
  """One compiled sampler program: `name` "append" (continued prefill of `tokens` padded
  tokens per row) or "generate" (a decode loop, `keep_state` as in `sampling.generate`), on
  `batch` rows attending over `window` cache slots. Fields a program does not have are 0 / True.
  """
  name: str
  batch: int
  tokens: int
  window: int
  keep_state: bool = True

  def label(self) -> str:
    """`append[batch=8,tokens=64,window=256]`, `generate[batch=8,window=256]`,
    `train_step[rows=2,length=512]` (the update: `batch` rows of `tokens`),
    `estimator[trees=4,capacity=20]` (`batch` trees of `tokens` nodes): for logs."""
    if self.name == "train_step":
      return f"train_step[rows={self.batch},length={self.tokens}]"
    if self.name == "estimator":  # `batch` stacked trees of `tokens` nodes
      return f"estimator[trees={self.batch},capacity={self.tokens}]"
    if self.name == "place_logits":  # a paged cache's forks into free slots
      return f"place_logits[batch={self.batch}]"
    if self.name == "append":
      return f"append[batch={self.batch},tokens={self.tokens},window={self.window}]"
    probe = "" if self.keep_state else ",probe"
    return f"generate[batch={self.batch},window={self.window}{probe}]"


def token_buckets(max_length: int) -> list[int]:
  """𝒯(L) = {bucket_length(n, maximum=L) : 1 ≤ n ≤ L}: the powers of two from 16 below L, and
  L. Example: `token_buckets(320) == [16, 32, 64, 128, 256, 320]`, `token_buckets(8) == [8]`."""
  return sorted({min(max(16, 1 << k), max_length) for k in range(max_length.bit_length() + 1)})


def windows(max_length: int, minimum: int = MIN_ATTEND_LENGTH) -> list[int]:
  """𝒲(L) = {attend_length_for([n], L) : 1 ≤ n ≤ L}: the powers of two from `minimum` below L,
  and L; |𝒲| = 1 + ceil(log2(L / minimum)) for L > minimum, else 1 (just L).
  Example: `windows(1024) == [256, 512, 1024]`, `windows(320) == [256, 320]`,
  `windows(100) == [100]`."""
  return sorted({min(max(minimum, 1 << k), max_length)
                 for k in range(max_length.bit_length() + 1)})


def batch_sizes(buckets: Sequence[int], max_rows: int) -> list[int]:
  """The padded batch sizes for 1..`max_rows` live rows (`RolloutConfig.batch_size`): every
  bucket up to the first that holds `max_rows`, then multiples of the largest bucket.
  Example: buckets (8, 16, 32), 20 rows → [8, 16, 32]; 70 rows → [8, 16, 32, 64, 96]."""
  sizes = []
  for bucket in buckets:
    sizes.append(bucket)
    if bucket >= max_rows:
      return sizes
  largest = buckets[-1]
  return sizes + [largest * m for m in range(2, -(-max_rows // largest) + 1)]


class AppendBounds(NamedTuple):
  """What is known of a rollout's appends before it runs (`sampler_program_keys`).

  Attributes:
    prefill_batches: the batch sizes of a call's first append, which fills empty rows (the
      prompts: one row per tree or held-out task).
    longest_prompt: most tokens of a prompt.
    longest_append: most tokens of a later append (an observation).
  """
  prefill_batches: tuple[int, ...]
  longest_prompt: int
  longest_append: int


def _append_pairs(max_length: int, bounds: Optional[AppendBounds], prefill: bool
                  ) -> set[tuple[int, int]]:
  """The (T, w) pairs of the appends on a batch (see `sampler_program_keys`)."""
  buckets, spans = token_buckets(max_length), windows(max_length)
  if bounds is None:
    return {(t, w) for w in spans for t in buckets if t <= w}
  later = bucket_length(min(bounds.longest_append, max_length), maximum=max_length)
  pairs = {(t, w) for w in spans for t in buckets if t <= min(w, later)}
  if prefill:
    for n in range(1, min(bounds.longest_prompt, max_length) + 1):
      t = bucket_length(n, maximum=max_length)
      pairs.add((t, max(attend_length_for([n], max_length), t)))
  return pairs


def sampler_program_keys(batches: Iterable[int], max_length: int, probe: bool = False,
                         bounds: Optional[AppendBounds] = None) -> list[ProgramKey]:
  """Every program the rollout engine's sampler can run, for rows padded to `batches` with
  `max_length` cache slots each.

  An append of n ≤ L tokens to rows that end with at most ℓ ≤ L tokens pads them to the token
  bucket T = bucket_length(n) ∈ 𝒯(L) and attends over w = max(attend_length_for([ℓ]), T). Since
  ℓ ≥ n, w ∈ 𝒲(L) and T ≤ w (a T above `MIN_ATTEND_LENGTH` is itself in 𝒲), and every such
  pair occurs (a short append to a long row, a long prefill). A decode loop attends over
  attend_length_for([ℓ + max_new_tokens]) ∈ 𝒲(L), keeping its state (a rollout's action) or,
  with `probe`, not (the greedy-action entropy probe). So, in this order:

      append:   {(b, T, w) : b ∈ batches, w ∈ 𝒲(L), T ∈ 𝒯(L), T ≤ w}
      generate: {(b, w, keep) : b ∈ batches, w ∈ 𝒲(L), keep ∈ {True} (∪ {False} with probe)}

  per batch size Σ_{w ∈ 𝒲} |{T ∈ 𝒯 : T ≤ w}| appends and |𝒲| (or 2|𝒲|) decode loops.
  Example: batches [8], L = 320 gives 5 + 6 = 11 appends and 2 decode loops.

  With `bounds` (`AppendBounds`) the appends are fewer. A call's first append fills empty
  rows, so its longest row sets both: n ≤ `longest_prompt` gives (T(n), max(W(n), T(n))),
  W = attend_length_for, on `prefill_batches` only; every later append has n ≤
  `longest_append`, so T ≤ T(longest_append), on any batch and window:

      append:   {(b, T, w) : b ∈ batches, w ∈ 𝒲, T ∈ 𝒯, T ≤ min(w, T(longest_append))}
                ∪ {(b, T(n), max(W(n), T(n))) : b ∈ prefill_batches, n ≤ longest_prompt}

  Example: batches [8], L = 320, prompts of at most 100 tokens, appends of at most 40: T ≤ 64
  after the prefill, 3 + 3 appends, and the prefill's (128, 256); 7 appends.
  """
  prefill = set() if bounds is None else set(bounds.prefill_batches)
  keys = []
  for batch in sorted(set(int(b) for b in batches) | prefill):
    pairs = _append_pairs(max_length, bounds, bounds is None or batch in prefill)
    keys += [ProgramKey("append", batch, t, w) for w, t in sorted((w, t) for t, w in pairs)]
    for window in windows(max_length):
      keys.append(ProgramKey("generate", batch, 0, window))
      if probe:
        keys.append(ProgramKey("generate", batch, 0, window, keep_state=False))
  return keys
