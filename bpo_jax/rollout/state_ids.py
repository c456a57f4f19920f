"""Hashes of sandbox states: `RolloutTree.state_id` values and the digests fork decisions log."""

from __future__ import annotations

import hashlib


def text_state_id(text: str | bytes) -> int:
  """A non-negative int32 hash of a state's text or snapshot bytes (-1 stays "unknown")."""
  data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little") & 0x7FFFFFFF


def _digest(data: bytes) -> str:
  """The `Decision.snapshot_digest` of a snapshot's bytes."""
  return hashlib.blake2b(data, digest_size=16).hexdigest()
