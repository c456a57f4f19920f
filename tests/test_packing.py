"""Packing: exact layout of a hand-built tree, the mask against brute-force ancestry, and
packed ≡ per-path (same loss, same gradient) through an attention model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import packing
from bpo_jax.testing.tolerance import assert_close


def _hand_tree():
  # prompt [1, 2]; node 0 under the root: action [3, 4], observation [5];
  # node 1 under the root: action [6]; node 2 under node 0: action [7], observation [8].
  return packing.TreeTokens(
      prompt=[1, 2], parent=[-1, -1, 0],
      action_tokens=[[3, 4], [6], [7]], action_logprobs=[[-0.1, -0.2], [-0.3], [-0.4]],
      observation_tokens=[[5], [], [8]])


def test_hand_tree_layout():
  row = packing.pack_tree(_hand_tree(), advantages=[1.0, -1.0, 2.0], weights=[0.5, 0.5, 0.5])
  # Preorder 0, 2, 1: prompt | node 0 | node 2 | node 1.
  assert row.tokens == [1, 2, 3, 4, 5, 7, 8, 6]
  assert row.positions == [0, 1, 2, 3, 4, 5, 6, 2]
  assert row.predecessor == [-1, 0, 1, 2, 3, 4, 5, 1]
  assert row.segment_start == [0, 0, 1, 1, 1, 2, 2, 3]
  assert row.segment_end == [3, 3, 2, 2, 2, 2, 2, 3]
  assert row.loss_mask == [False, False, True, True, False, True, False, True]
  assert row.advantage == [0, 0, 1, 1, 0, 2, 0, -1]
  assert row.weight == [0, 0, .5, .5, 0, .5, 0, .5]
  # Stored in float32: one rounding of the given float64 logprobs.
  assert_close(row.old_logprob, [0, 0, -.1, -.2, 0, -.4, 0, -.3], steps=1, dtype=np.float32)


def test_hand_tree_mask():
  batch = packing.stack_rows([packing.pack_tree(_hand_tree(), [0] * 3, [0] * 3)], buckets=(8,))
  mask = np.asarray(packing.attention_mask(batch.segment_start, batch.segment_end))[0]
  # Node 1's action token (index 7) sees the prompt and itself only.
  assert mask[7].tolist() == [True, True, False, False, False, False, False, True]
  # Node 2's observation token (index 6) sees prompt, node 0 and node 2.
  assert mask[6].tolist() == [True] * 7 + [False]


def _random_tree(rng, num_nodes, vocab=13):
  parent = [-1]
  for i in range(1, num_nodes):
    parent.append(int(rng.integers(-1, i)))
  lengths_a = rng.integers(1, 4, num_nodes)
  lengths_o = rng.integers(0, 3, num_nodes)
  return packing.TreeTokens(
      prompt=rng.integers(0, vocab, int(rng.integers(1, 4))), parent=parent,
      action_tokens=[rng.integers(0, vocab, n) for n in lengths_a],
      action_logprobs=[-rng.random(n) for n in lengths_a],
      observation_tokens=[rng.integers(0, vocab, n) for n in lengths_o],
      valid=rng.random(num_nodes) > 0.15)


def _token_nodes(tree, row):
  """Node of every packed token (-1 prompt), recovered independently from the tree."""
  alive = tree.alive()
  kids = tree.children()
  out, stack = [-1] * tree.prompt.size, list(reversed(kids[tree.num_nodes]))
  while stack:
    node = stack.pop()
    out += [node] * tree.segment(node).size
    stack.extend(reversed(kids[node]))
  assert len(out) == len(row.tokens)
  assert all(alive[n] for n in out if n >= 0)
  return out


@pytest.mark.parametrize("seed", range(5))
def test_mask_matches_brute_force_ancestry(seed):
  rng = np.random.default_rng(seed)
  tree = _random_tree(rng, 9)
  row = packing.pack_tree(tree, np.zeros(9), np.zeros(9))
  nodes = _token_nodes(tree, row)

  def ancestors_or_self(n):
    out = {-1}
    while n >= 0:
      out.add(n)
      n = int(tree.parent[n])
    return out

  batch = packing.stack_rows([row], buckets=(64,))
  mask = np.asarray(packing.attention_mask(batch.segment_start, batch.segment_end))[0]
  length = len(row.tokens)
  for j in range(length):
    for k in range(length):
      expect = k <= j and nodes[k] in ancestors_or_self(nodes[j])
      assert mask[j, k] == expect, (j, k)
  # Padding attends only itself.
  assert mask[length:, :].sum() == 64 - length
  # Positions count tokens along the path; the predecessor is the previous token on the path.
  for j in range(length):
    visible = [k for k in range(j) if mask[j, k]]
    assert row.positions[j] == len(visible)
    assert row.predecessor[j] == (visible[-1] if visible else -1)


def _init_attention_model(key, vocab=13, dim=16):
  k1, k2, k3, k4 = jax.random.split(key, 4)
  s = dim ** -0.5
  return dict(embed=jax.random.normal(k1, (vocab, dim)),
              pos=jax.random.normal(k2, (64, dim)) * 0.5,
              qkv=jax.random.normal(k3, (dim, 3 * dim)) * s,
              out=jax.random.normal(k4, (dim, vocab)) * s)


def _attention_logits(params, batch):
  """One attention layer that respects the packed mask and positions."""
  x = params["embed"][batch.tokens] + params["pos"][batch.positions]
  q, k, v = jnp.split(x @ params["qkv"], 3, axis=-1)
  mask = packing.attention_mask(batch.segment_start, batch.segment_end)
  scores = jnp.where(mask, jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(q.shape[-1]), -1e30)
  h = x + jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, -1), v)
  return h @ params["out"]


def _weighted_objective(params, batch):
  logprob, _ = packing.gather_token_logprobs(
      _attention_logits(params, batch), batch.tokens, batch.predecessor)
  return jnp.sum(jnp.where(batch.loss_mask, batch.weight * batch.advantage * logprob, 0.0))


_objective_and_grad = jax.jit(jax.value_and_grad(_weighted_objective))


@pytest.mark.parametrize("seed", range(3))
def test_packed_equals_per_path_loss_and_gradient(seed):
  rng = np.random.default_rng(100 + seed)
  trees = [_random_tree(rng, int(rng.integers(3, 8))) for _ in range(3)]
  advantages = [rng.normal(size=t.num_nodes) for t in trees]
  weights = [rng.random(t.num_nodes) for t in trees]
  # Path weights must add up: a node's weight is the sum of its leaves' weights (exactly as the
  # estimators' path weights do), so set the leaves at random and sum upwards.
  for t, w in zip(trees, weights):
    kids = t.children()
    for i in reversed(range(t.num_nodes)):
      if kids[i]:
        w[i] = sum(w[c] for c in kids[i])
  # Fixed shapes across seeds: two compilations in all.
  packed = packing.pack_trees(trees, advantages, weights, buckets=(128,))
  per_path = packing.pack_trees_per_path(trees, advantages, weights, buckets=(128,), num_rows=24)
  num_paths = sum(len(t.leaf_paths()) for t in trees)
  assert 3 < num_paths <= 24
  assert int(per_path.loss_mask.sum()) > int(packed.loss_mask.sum())
  params = _init_attention_model(jax.random.key(seed))
  packed = jax.tree.map(jnp.asarray, packed)
  per_path = jax.tree.map(jnp.asarray, per_path)
  loss_p, grad_p = _objective_and_grad(params, packed)
  loss_r, grad_r = _objective_and_grad(params, per_path)
  # The two layouts sum the same terms in other orders and lengths: one attention layer and the
  # token sum, ≤ 64 roundings along any path (sums counted by their depth) at the largest value
  # compared, the loss or a parameter's largest gradient entry.
  assert_close(loss_p, loss_r, steps=64)
  for name in params:
    assert_close(grad_p[name], grad_r[name], steps=64, err_msg=name)


def test_gather_matches_log_softmax_shift():
  key = jax.random.key(0)
  logits = jax.random.normal(key, (2, 6, 11))
  tokens = jax.random.randint(jax.random.key(1), (2, 6), 0, 11)
  pred = jnp.broadcast_to(jnp.arange(6) - 1, (2, 6))
  logprob, entropy = packing.gather_token_logprobs(logits, tokens, pred)
  logp = jax.nn.log_softmax(logits, -1)
  ref = np.take_along_axis(np.asarray(logp[:, :-1]), np.asarray(tokens[:, 1:, None]), -1)[..., 0]
  # An 11-way log-softmax two ways (max, exp, sum, log, difference): ≤ 16 roundings at the
  # largest |logprob|; the entropy adds 11 products and their sum.
  assert_close(logprob[:, 1:], ref, steps=16)
  ref_h = -np.sum(np.exp(logp) * logp, -1)[:, :-1]
  assert_close(entropy[:, 1:], ref_h, steps=32)
  assert np.all(np.asarray(logprob[:, 0]) == 0)


def test_errors_name_the_fault():
  with pytest.raises(ValueError, match="node 1: parent 1"):
    packing.TreeTokens(prompt=[1], parent=[-1, 1], action_tokens=[[1], [2]],
                       action_logprobs=[[0.], [0.]], observation_tokens=[[], []])
  with pytest.raises(ValueError, match="node 0: 2 action tokens but 1"):
    packing.TreeTokens(prompt=[1], parent=[-1], action_tokens=[[1, 2]],
                       action_logprobs=[[0.]], observation_tokens=[[]])
  with pytest.raises(ValueError, match="exceeds the largest bucket 4"):
    packing.stack_rows([packing.pack_tree(_hand_tree(), [0] * 3, [0] * 3)], buckets=(4,))


def _chunk_case(seed=0):
  """Hidden states [2, 7, 8], 13 output rows, and predecessors with forks (several tokens
  predicted from one position), a token with none and row 1's padding."""
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=(2, 7, 8)).astype(np.float32)
  rows = rng.normal(size=(13, 8)).astype(np.float32)
  tokens = rng.integers(0, 13, (2, 7)).astype(np.int32)
  predecessor = np.array([[-1, 0, 1, 2, 1, 4, 1], [-1, 0, 1, 1, 3, -1, -1]], np.int32)
  return hidden, rows, tokens, predecessor


@pytest.mark.parametrize("chunk", [1, 5, 14, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_match_a_float64_reference(chunk, temperature):
  hidden, rows, tokens, predecessor = _chunk_case()
  logprob, entropy = jax.jit(packing.token_logprobs_from_hidden, static_argnums=(4, 5))(
      hidden, rows, tokens, predecessor, temperature, chunk)
  pred = np.maximum(predecessor, 0)
  states = np.take_along_axis(hidden.astype(np.float64), pred[..., None], axis=1)
  z = states @ rows.astype(np.float64).T / temperature  # [2, 7, 13]
  log_norm = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
  ref = np.take_along_axis(z, tokens[..., None], -1)[..., 0] - log_norm
  ref_h = log_norm - np.sum(np.exp(z - log_norm[..., None]) * z, -1)
  has = predecessor >= 0
  magnitude = float(np.max(np.abs(z)))
  # An 8-term dot, a division, then a 13-way logsumexp and a difference: under 32 roundings at
  # the largest |logit|; the entropy adds 13 products and their sum.
  assert_close(np.where(has, logprob, 0), np.where(has, ref, 0), steps=32, magnitude=magnitude)
  assert_close(np.where(has, entropy, 0), np.where(has, ref_h, 0), steps=64,
               magnitude=magnitude)
  assert np.all(np.asarray(logprob)[~has] == 0) and np.all(np.asarray(entropy)[~has] == 0)


def test_chunked_logprobs_have_the_gradient_of_the_full_logits():
  hidden, rows, tokens, predecessor = _chunk_case(1)
  weights = np.random.default_rng(2).normal(size=tokens.shape).astype(np.float32)

  def objective(h, e, chunk):
    if chunk:
      logprob, entropy = packing.token_logprobs_from_hidden(h, e, tokens, predecessor, 0.7, chunk)
    else:
      logprob, entropy = packing.gather_token_logprobs(h @ e.T / np.float32(0.7), tokens,
                                                       predecessor)
    return jnp.sum(weights * logprob) + 0.1 * jnp.sum(entropy)

  grad = jax.jit(jax.grad(objective, argnums=(0, 1)), static_argnums=2)
  full = grad(hidden, rows, 0)
  for chunk in (3, 1024):
    for ours, ref in zip(grad(hidden, rows, chunk), full):
      # Sums over up to 14 tokens of 13-way softmax terms, each an 8-term dot: under 128
      # roundings at the largest gradient entry.
      assert_close(ours, ref, steps=128)
