"""Packing a rollout tree's tokens into one row, each distinct token once.

A tree's text is a prompt (the task and the first observation) followed, for every node i, by a
*segment*: the action tokens a_i the policy generated, then the observation tokens o_i the sandbox
returned. A root-to-leaf path reads `prompt, seg(i_1), seg(i_2), ..., seg(leaf)`.

Packed layout. The prompt comes first, then the valid nodes' segments in depth-first preorder.
Numbering the prompt 0 and the nodes 1..M in that preorder, the subtree of a node is a contiguous
range `[start, end]` of numbers, so

    token j may attend token k  <=>  start[k] <= start[j] <= end[k]   and   k <= j,

i.e. k's segment is an ancestor-or-self of j's segment and k comes first. Attention is therefore
described by two int32 per token instead of an L x L matrix; `attention_mask` expands it inside the
jitted update. Positions restart along each path: a segment's first token sits one past the last
token of its parent's segment, so every path sees the positions it saw during sampling.

Next-token prediction. Token j is predicted by the logits at `predecessor[j]`: j-1 inside a
segment, and the last token of the parent's segment (or the prompt) for a segment's first token.
Several children share that predecessor, which is why logprobs are gathered by index rather than
shifted (`gather_token_logprobs`).

Loss quantities per token: action tokens carry their node's advantage and path weight and the
behaviour logprob recorded at sampling; prompt and observation tokens carry none (loss_mask False).

Per-path layout (the reference): one row per leaf path, causal attention, each action token
weighted by the *leaf's* path weight. Since the path weights of the leaves below node i sum to w_i,
`sum_paths w_leaf * (...)_i = w_i * (...)_i`, so both layouts give the same loss and gradient
(tests/test_packing.py checks it through the decoder).

Both layouts pad rows to a length from a small set of buckets, so the update compiles a bounded
number of times.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

# Row lengths the update compiles for; a batch is padded to the smallest bucket that fits.
DEFAULT_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)


@dataclasses.dataclass
class TreeTokens:
  """Host-side token record of one tree, filled by the rollout.

  Attributes:
    prompt: int32[P], the tokens before the first action (P >= 1).
    parent: int32[N], as `RolloutTree.parent` (-1 for a child of the root state; parents first).
    action_tokens: N arrays of int32, the tokens the policy generated for each node.
    action_logprobs: N arrays of float32, the behaviour logprob of each action token.
    observation_tokens: N arrays of int32, the tokens of the observation after each action.
    valid: bool[N]; invalid nodes (failed branches, padding) and their subtrees are left out.
  """

  prompt: np.ndarray
  parent: np.ndarray
  action_tokens: list
  action_logprobs: list
  observation_tokens: list
  valid: np.ndarray | None = None

  def __post_init__(self):
    self.prompt = np.asarray(self.prompt, np.int32)
    self.parent = np.asarray(self.parent, np.int32)
    n = self.parent.shape[0]
    if self.prompt.ndim != 1 or self.prompt.size == 0:
      raise ValueError(f"prompt must be a non-empty 1-D token array, got shape {self.prompt.shape}")
    for name in ("action_tokens", "action_logprobs", "observation_tokens"):
      if len(getattr(self, name)) != n:
        raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} nodes")
    self.valid = np.ones(n, bool) if self.valid is None else np.asarray(self.valid, bool)
    for i in range(n):
      if len(self.action_tokens[i]) != len(self.action_logprobs[i]):
        raise ValueError(
            f"node {i}: {len(self.action_tokens[i])} action tokens but "
            f"{len(self.action_logprobs[i])} action logprobs")
      p = self.parent[i]
      if p >= i or p < -1:
        raise ValueError(f"node {i}: parent {p} must be -1 or an earlier node")

  @property
  def num_nodes(self) -> int:
    return int(self.parent.shape[0])

  def children(self) -> list[list[int]]:
    """Valid children of each node; index `num_nodes` holds the root state's children."""
    kids = [[] for _ in range(self.num_nodes + 1)]
    alive = self.alive()
    for i in range(self.num_nodes):
      if alive[i]:
        kids[self.parent[i] if self.parent[i] >= 0 else self.num_nodes].append(i)
    return kids

  def alive(self) -> np.ndarray:
    """valid, and every ancestor valid too."""
    alive = self.valid.copy()
    for i in range(self.num_nodes):
      if self.parent[i] >= 0 and not alive[self.parent[i]]:
        alive[i] = False
    return alive

  def segment(self, i: int) -> np.ndarray:
    return np.concatenate([np.asarray(self.action_tokens[i], np.int32),
                           np.asarray(self.observation_tokens[i], np.int32)])

  def num_unique_tokens(self) -> int:
    alive = self.alive()
    return self.prompt.size + sum(self.segment(i).size for i in range(self.num_nodes) if alive[i])

  def leaf_paths(self) -> list[list[int]]:
    """Root-to-leaf node paths over valid nodes, leaves in preorder."""
    kids = self.children()
    paths, stack = [], [(c, [c]) for c in reversed(kids[self.num_nodes])]
    while stack:
      node, path = stack.pop()
      if not kids[node]:
        paths.append(path)
      stack.extend((c, path + [c]) for c in reversed(kids[node]))
    return paths


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PackedBatch:
  """Rows of tokens ready for the update; every field is [B, L].

  `segment_start < 0` marks padding. For the per-path layout `segment_start` is 0 everywhere
  valid and `segment_end` is 0, which makes `attention_mask` plain causal.
  """

  tokens: jax.Array
  positions: jax.Array
  predecessor: jax.Array
  segment_start: jax.Array
  segment_end: jax.Array
  loss_mask: jax.Array
  advantage: jax.Array
  weight: jax.Array
  old_logprob: jax.Array

  @property
  def shape(self):
    return self.tokens.shape


@dataclasses.dataclass
class _Row:
  tokens: list
  positions: list
  predecessor: list
  segment_start: list
  segment_end: list
  loss_mask: list
  advantage: list
  weight: list
  old_logprob: list

  @classmethod
  def empty(cls):
    return cls(*[[] for _ in dataclasses.fields(cls)])

  def append_segment(self, tokens, logprobs, num_action, *, first_position, first_predecessor,
                     start, end, advantage, weight):
    """Appends one segment; returns (last position, index of its last token)."""
    base = len(self.tokens)
    n = len(tokens)
    self.tokens.extend(int(t) for t in tokens)
    self.positions.extend(range(first_position, first_position + n))
    self.predecessor.extend([first_predecessor] + list(range(base, base + n - 1)) if n else [])
    self.segment_start.extend([start] * n)
    self.segment_end.extend([end] * n)
    self.loss_mask.extend([True] * num_action + [False] * (n - num_action))
    self.advantage.extend([advantage] * num_action + [0.0] * (n - num_action))
    self.weight.extend([weight] * num_action + [0.0] * (n - num_action))
    self.old_logprob.extend(list(np.asarray(logprobs, np.float32)) + [0.0] * (n - num_action))
    return first_position + n - 1, base + n - 1


def pack_tree(tree: TreeTokens, advantages, weights) -> _Row:
  """Packs one tree (prompt, then valid nodes in preorder); see the module docstring."""
  advantages = np.asarray(advantages, np.float32)
  weights = np.asarray(weights, np.float32)
  if advantages.shape[0] < tree.num_nodes or weights.shape[0] < tree.num_nodes:
    raise ValueError(f"need an advantage and a weight per node ({tree.num_nodes}), got "
                     f"{advantages.shape[0]} and {weights.shape[0]}")
  kids = tree.children()
  # Preorder numbering (prompt = 0) and the last number inside each subtree.
  order, stack = [], list(reversed(kids[tree.num_nodes]))
  while stack:
    node = stack.pop()
    order.append(node)
    stack.extend(reversed(kids[node]))
  number = {node: k + 1 for k, node in enumerate(order)}
  end = {}
  for node in reversed(order):
    end[node] = max([number[node]] + [end[c] for c in kids[node]])
  row = _Row.empty()
  last_pos, last_idx = row.append_segment(
      tree.prompt, [], 0, first_position=0, first_predecessor=-1, start=0, end=len(order),
      advantage=0.0, weight=0.0)
  # (position, index) of the last token on the path up to and including each node.
  path_end = {-1: (last_pos, last_idx)}
  for node in order:
    pos, idx = path_end[int(tree.parent[node])]
    seg = tree.segment(node)
    num_action = len(tree.action_tokens[node])
    if seg.size:
      path_end[node] = row.append_segment(
          seg, tree.action_logprobs[node], num_action, first_position=pos + 1,
          first_predecessor=idx, start=number[node], end=end[node],
          advantage=float(advantages[node]), weight=float(weights[node]))
    else:
      path_end[node] = (pos, idx)
  return row


def pack_paths(tree: TreeTokens, advantages, weights) -> list[_Row]:
  """The per-path reference layout: one causal row per leaf, tokens weighted by the leaf's weight."""
  advantages = np.asarray(advantages, np.float32)
  weights = np.asarray(weights, np.float32)
  rows = []
  for path in tree.leaf_paths():
    row = _Row.empty()
    pos, idx = row.append_segment(tree.prompt, [], 0, first_position=0, first_predecessor=-1,
                                  start=0, end=0, advantage=0.0, weight=0.0)
    leaf_weight = float(weights[path[-1]])
    for node in path:
      seg = tree.segment(node)
      if seg.size:
        pos, idx = row.append_segment(
            seg, tree.action_logprobs[node], len(tree.action_tokens[node]), first_position=pos + 1,
            first_predecessor=idx, start=0, end=0, advantage=float(advantages[node]),
            weight=leaf_weight)
    rows.append(row)
  return rows


def choose_bucket(length: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
  """The smallest bucket >= length; an error naming the length if none fits."""
  for b in sorted(buckets):
    if b >= length:
      return b
  raise ValueError(f"a row of {length} tokens exceeds the largest bucket {max(buckets)}; "
                   "raise the bucket list or lower the rollout's token budget")


def stack_rows(rows: Sequence[_Row], buckets: Sequence[int] = DEFAULT_BUCKETS,
               num_rows: int | None = None) -> PackedBatch:
  """Pads rows to one bucket length (and optionally to `num_rows` rows) as a numpy PackedBatch."""
  if not rows:
    raise ValueError("no rows to stack")
  num_rows = len(rows) if num_rows is None else num_rows
  if num_rows < len(rows):
    raise ValueError(f"num_rows={num_rows} is less than the {len(rows)} rows given")
  length = choose_bucket(max(len(r.tokens) for r in rows), buckets)
  fill = dict(tokens=0, positions=0, predecessor=-1, segment_start=-1, segment_end=-1,
              loss_mask=False, advantage=0.0, weight=0.0, old_logprob=0.0)
  dtypes = dict(tokens=np.int32, positions=np.int32, predecessor=np.int32, segment_start=np.int32,
                segment_end=np.int32, loss_mask=bool, advantage=np.float32, weight=np.float32,
                old_logprob=np.float32)
  out = {}
  for name, value in fill.items():
    arr = np.full((num_rows, length), value, dtypes[name])
    for b, row in enumerate(rows):
      data = getattr(row, name)
      arr[b, :len(data)] = data
    out[name] = arr
  return PackedBatch(**out)


def pack_trees(trees: Sequence[TreeTokens], advantages, weights,
               buckets: Sequence[int] = DEFAULT_BUCKETS, num_rows: int | None = None) -> PackedBatch:
  """Packs each tree into its own row; `advantages[b]`, `weights[b]` are tree b's per-node arrays."""
  rows = [pack_tree(t, a, w) for t, a, w in zip(trees, advantages, weights, strict=True)]
  return stack_rows(rows, buckets, num_rows)


def pack_trees_per_path(trees: Sequence[TreeTokens], advantages, weights,
                        buckets: Sequence[int] = DEFAULT_BUCKETS,
                        num_rows: int | None = None) -> PackedBatch:
  """The reference layout for a batch of trees: every leaf path of every tree is a row."""
  rows = [r for t, a, w in zip(trees, advantages, weights, strict=True)
          for r in pack_paths(t, a, w)]
  return stack_rows(rows, buckets, num_rows)


def attention_mask(segment_start: jax.Array, segment_end: jax.Array) -> jax.Array:
  """bool[B, L, L]: query j may attend key k (see the module docstring).

  Padding queries attend only themselves, so no softmax row is empty.
  """
  qs = segment_start[:, :, None]
  ks = segment_start[:, None, :]
  ke = segment_end[:, None, :]
  length = segment_start.shape[-1]
  idx = jnp.arange(length)
  causal = idx[None, :, None] >= idx[None, None, :]
  valid = (qs >= 0) & (ks >= 0)
  allowed = (ks <= qs) & (qs <= ke) & causal & valid
  return allowed | (jnp.eye(length, dtype=bool)[None] & (qs < 0))


def gather_token_logprobs(logits: jax.Array, tokens: jax.Array, predecessor: jax.Array):
  """Per-token logprob and entropy of the distribution that predicted each token.

  Args:
    logits: [B, L, V] from the decoder run on the packed rows.
    tokens: int32[B, L].
    predecessor: int32[B, L], the position whose logits predict each token (-1: none).

  Returns:
    (logprob, entropy), each float32[B, L]; 0 where predecessor < 0. Only [B, L] values are
    gathered (never a second [B, L, V] array), so large vocabularies stay cheap.
  """
  logits = logits.astype(jnp.float32)
  log_norm = jax.nn.logsumexp(logits, axis=-1)  # [B, L]
  probs = jnp.exp(logits - log_norm[..., None])
  entropy_at = log_norm - jnp.sum(probs * logits, axis=-1)  # H = logZ - E[logit]
  pred = jnp.maximum(predecessor, 0)
  batch = jnp.arange(logits.shape[0])[:, None]
  picked = logits[batch, pred, tokens]
  logprob = picked - jnp.take_along_axis(log_norm, pred, axis=1)
  entropy = jnp.take_along_axis(entropy_at, pred, axis=1)
  has_pred = predecessor >= 0
  return jnp.where(has_pred, logprob, 0.0), jnp.where(has_pred, entropy, 0.0)


def token_logprobs_from_hidden(hidden: jax.Array, output_rows: jax.Array, tokens: jax.Array,
                               predecessor: jax.Array, temperature: float = 1.0,
                               chunk: int = 1024):
  """`gather_token_logprobs` of the logits `hidden @ output_rows.T / temperature`, computed
  `chunk` tokens at a time: no [B, L, V] array, in the forward pass or the backward.

  Token j is predicted by the hidden state at `predecessor[j]`, so the states are first
  gathered per token, h_j = hidden[b, predecessor[b, j]]; then for each chunk of tokens, under
  `jax.checkpoint` (the backward recomputes a chunk's logits rather than keeping them),

      z_j = h_j · E^T / τ,   log π(t_j) = z_j[t_j] − logsumexp(z_j),
      H_j = logsumexp(z_j) − Σ_v softmax(z_j)_v z_j,v.

  The largest temporary is [chunk, V] float32, against [B, L, V] for the logits of every
  position: at a 152k vocabulary, 0.6 GB per 1024 tokens instead of 2.5 GB per 4096-token row,
  for the logits alone, and again for their softmax and the backward's copies.

  Args:
    hidden: [B, L, H], the final-normed hidden states (`Decoder.hidden_states`).
    output_rows: [V, H], the output projection as rows (`Decoder.output_embedding`); the
      logits are computed in the hidden states' dtype and cast to float32, as the decoder's
      own output is.
    tokens: int32[B, L].
    predecessor: int32[B, L], the position predicting each token (-1: none).
    temperature: a Python float > 0, dividing the logits.
    chunk: tokens per chunk (a static int >= 1); B * L is padded up to a multiple of it.

  Returns:
    (logprob, entropy), each float32[B, L]; 0 where predecessor < 0.
  """
  b, length, width = hidden.shape
  n = b * length
  chunk = min(int(chunk), n)
  pad = (-n) % chunk
  pred = jnp.maximum(predecessor, 0)
  states = jnp.take_along_axis(hidden, pred[..., None], axis=1).reshape(n, width)
  states = jnp.pad(states, ((0, pad), (0, 0))).reshape(-1, chunk, width)
  targets = jnp.pad(tokens.reshape(n), (0, pad)).reshape(-1, chunk)
  rows = output_rows.astype(hidden.dtype)

  @jax.checkpoint
  def one_chunk(args):
    x, t = args
    logits = jnp.einsum("ch,vh->cv", x, rows).astype(jnp.float32)
    if temperature != 1.0:
      logits = logits / np.float32(temperature)
    log_norm = jax.nn.logsumexp(logits, axis=-1)
    probs = jnp.exp(logits - log_norm[:, None])
    entropy = log_norm - jnp.sum(probs * logits, axis=-1)
    picked = jnp.take_along_axis(logits, t[:, None], axis=-1)[:, 0]
    return picked - log_norm, entropy

  logprob, entropy = jax.lax.map(one_chunk, (states, targets))
  logprob = logprob.reshape(-1)[:n].reshape(b, length)
  entropy = entropy.reshape(-1)[:n].reshape(b, length)
  has_pred = predecessor >= 0
  return jnp.where(has_pred, logprob, 0.0), jnp.where(has_pred, entropy, 0.0)


def abstract_batch(rows: int, row_length: int, sharding=None) -> PackedBatch:
  """A `[rows, row_length]` PackedBatch of `jax.ShapeDtypeStruct`s (with `sharding`, if given):
  what an update is compiled for before any batch exists."""
  dtypes = dict(tokens=jnp.int32, positions=jnp.int32, predecessor=jnp.int32,
                segment_start=jnp.int32, segment_end=jnp.int32, loss_mask=jnp.bool_,
                advantage=jnp.float32, weight=jnp.float32, old_logprob=jnp.float32)
  return PackedBatch(**{name: jax.ShapeDtypeStruct((rows, row_length), dtype, sharding=sharding)
                        for name, dtype in dtypes.items()})
