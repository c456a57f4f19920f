"""The jitted update: packed ≡ per-path through the decoder, micro-batching invariance,
REINFORCE gradient at ratio 1, NaN skipping, and the SFT step."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bpo_jax import losses
from bpo_jax import packing
from bpo_jax.models import Decoder, ModelConfig
from bpo_jax.testing.model_rounding import forward_roundings, sum_roundings
from bpo_jax.testing.tolerance import assert_close, ulp_tol
from bpo_jax.training import update

VOCAB = 24
BUCKETS = (64,)


def _model(seed=0):
  config = ModelConfig.tiny(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                            num_heads=4, num_kv_heads=2, head_dim=8)
  return Decoder(config, rngs=nnx.Rngs(seed))


def _random_trees(rng, num_trees=2):
  trees, advantages, weights = [], [], []
  for _ in range(num_trees):
    n = int(rng.integers(3, 7))
    parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
    la, lo = rng.integers(1, 4, n), rng.integers(0, 3, n)
    tree = packing.TreeTokens(
        prompt=rng.integers(0, VOCAB, 3), parent=parent,
        action_tokens=[rng.integers(0, VOCAB, k) for k in la],
        action_logprobs=[-rng.random(k) for k in la],
        observation_tokens=[rng.integers(0, VOCAB, k) for k in lo])
    # Path weights as the estimators define them: product of 1/(number of siblings).
    kids = tree.children()
    w = np.zeros(n)
    for c in kids[n]:
      w[c] = 1.0 / len(kids[n])
    for i in range(n):
      for c in kids[i]:
        w[c] = w[i] / len(kids[i])
    trees.append(tree)
    advantages.append(rng.normal(size=n))
    weights.append(w)
  return trees, advantages, weights


def _state(model, lr=1e-2):
  tx = update.make_optimizer(update.OptimizerConfig(learning_rate=lr, max_grad_norm=0.0))
  graphdef, state = update.create_train_state(model, tx)
  return graphdef, tx, state


def _copy(state):
  return jax.tree.map(jnp.array, state)


@pytest.mark.slow
def test_packed_equals_per_path_through_decoder():
  rng = np.random.default_rng(0)
  trees, adv, w = _random_trees(rng, 3)
  # The packed rows padded to the per-path batch's 16: one shape, so one compilation of each
  # function below serves both layouts.
  packed = packing.pack_trees(trees, adv, w, buckets=BUCKETS, num_rows=16)
  per_path = packing.pack_trees_per_path(trees, adv, w, buckets=BUCKETS, num_rows=16)
  # Plain SGD: the new parameters are then a linear function of the gradient (Adam's
  # g / (|g| + eps) would amplify float noise in near-zero gradient entries).
  graphdef, state = update.create_train_state(_model(), optax.sgd(0.1))
  tx = optax.sgd(0.1)
  # Behaviour logprobs equal to the model's, so the objective is the REINFORCE one.
  logprobs = jax.jit(update.packed_logprobs, static_argnums=0)
  lp_packed, _ = logprobs(graphdef, state.params, packed)
  lp_path, _ = logprobs(graphdef, state.params, per_path)
  packed.old_logprob = np.asarray(lp_packed)
  per_path.old_logprob = np.asarray(lp_path)
  step = update.make_train_step(graphdef, tx, update.UpdateConfig(micro_batches=1))
  new_a, m_a = step(_copy(state), packed, None, 3)
  new_b, m_b = step(_copy(state), per_path, None, 3)
  # The layouts sum the same terms in other orders and lengths through two decoder layers:
  # ≤ 64 roundings along any path (sums counted by their depth) at the value compared, or at a
  # parameter's largest entry.
  assert_close(m_a["loss"], m_b["loss"], steps=64)
  assert_close(m_a["grad_norm"], m_b["grad_norm"], steps=64)
  assert float(m_a["grad_norm"]) > 1e-3
  for a, b in zip(jax.tree.leaves(new_a.params), jax.tree.leaves(new_b.params)):
    assert_close(a, b, steps=64)


@pytest.mark.slow
def test_micro_batching_and_reinforce_gradient():
  rng = np.random.default_rng(1)
  trees, adv, w = _random_trees(rng, 4)
  batch = packing.pack_trees(trees, adv, w, buckets=BUCKETS)
  # SGD: parameters linear in the gradient, so summation order cannot be amplified by Adam.
  tx = optax.sgd(0.1)
  graphdef, state = update.create_train_state(_model(1), tx)
  lp, _ = jax.jit(update.packed_logprobs, static_argnums=0)(graphdef, state.params, batch)
  batch.old_logprob = np.asarray(lp)

  # At ratio 1 the per-tree objective's gradient is -(1/num_trees) Σ w A ∇logπ (REINFORCE).
  def reinforce(params):
    logprob, _ = update.packed_logprobs(graphdef, params, batch)
    return -jnp.sum(jnp.where(batch.loss_mask, batch.weight * batch.advantage * logprob, 0.0)) / 4
  expected = jax.jit(jax.grad(reinforce))(state.params)
  expected_norm = optax.tree.norm(expected)

  results = {}
  for m in (1, 4):
    step = update.make_train_step(graphdef, tx, update.UpdateConfig(micro_batches=m))
    new, metrics = step(_copy(state), batch)
    results[m] = (new, metrics)
    # Micro-batches split the sums as above (≤ 64 roundings at the norm).
    assert_close(metrics["grad_norm"], expected_norm, steps=64)
    # At ratio ≈ 1 each token's k3 = exp(−x) + x − 1 cancels terms of magnitude 1: ≤ 4 roundings
    # there (exp, two sums, the mean).
    assert abs(float(metrics["approx_kl"])) <= ulp_tol(np.float32, 1.0, 4)
    assert float(metrics["clip_fraction"]) == 0.0
    assert float(metrics["skipped"]) == 0.0
  # The step is SGD on that gradient, at either micro-batching: new = old − 0.1 · expected (as
  # above, ≤ 64 roundings at a parameter's largest entry).
  for m in (1, 4):
    for new, old, grad in zip(jax.tree.leaves(results[m][0].params),
                              jax.tree.leaves(state.params), jax.tree.leaves(expected)):
      want = np.asarray(old) - 0.1 * np.asarray(grad)
      assert_close(new, want, steps=64, magnitude=np.abs(want).max() + np.abs(old).max())
  assert float(results[1][1]["micro_grad_norm_var"]) == 0.0
  assert float(results[4][1]["micro_grad_norm_var"]) > 0.0


@pytest.mark.slow
def test_nan_loss_skips_update():
  rng = np.random.default_rng(2)
  trees, adv, w = _random_trees(rng, 2)
  adv[0][:] = np.nan
  batch = packing.pack_trees(trees, adv, w, buckets=BUCKETS)
  graphdef, tx, state = _state(_model(2))
  before = jax.tree.map(np.asarray, state.params)
  step = update.make_train_step(graphdef, tx, update.UpdateConfig(micro_batches=1))
  new, metrics = step(state, batch)
  assert float(metrics["skipped"]) == 1.0
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(new.params)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_sft_step_lowers_expert_nll():
  rng = np.random.default_rng(3)
  trees, adv, w = _random_trees(rng, 2)
  batch = packing.pack_trees(trees, adv, w, buckets=BUCKETS)
  graphdef, tx, state = _state(_model(3), lr=3e-2)
  # The first loss is the mean NLL of the action tokens at the starting parameters (the step
  # donates the state, so this is taken first).
  logprob, _ = jax.jit(update.packed_logprobs, static_argnums=0)(graphdef, state.params, batch)
  nll = -np.where(batch.loss_mask, np.asarray(logprob, np.float64), 0.0)
  first_loss = nll.sum() / batch.loss_mask.sum()
  step = update.make_sft_step(graphdef, tx, micro_batches=2)
  losses_seen = []
  for _ in range(15):
    state, metrics = step(state, batch)
    losses_seen.append(float(metrics["loss"]))
  # The same forward in another program, two micro-batches' sums: the forward's roundings at a
  # token's NLL, and a sum over the tokens.
  assert_close(losses_seen[0], first_loss, dtype=np.float32, magnitude=nll.max(),
               steps=forward_roundings(_model(3).config, BUCKETS[0], logprobs=True)
               + sum_roundings(int(batch.loss_mask.sum())) + 2)
  assert losses_seen[-1] < 0.5 * losses_seen[0]


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match="normalization must be one of"):
    update.UpdateConfig(normalization="mean")
  with pytest.raises(ValueError, match="kl_coef > 0 needs reference"):
    graphdef, tx, _ = _state(_model())
    update.make_train_step(graphdef, tx, update.UpdateConfig(micro_batches=1, kl_coef=0.1))
  rng = np.random.default_rng(4)
  trees, adv, w = _random_trees(rng, 3)
  batch = packing.pack_trees(trees, adv, w, buckets=BUCKETS)
  graphdef, tx, state = _state(_model())
  step = update.make_train_step(graphdef, tx, update.UpdateConfig(micro_batches=2))
  with pytest.raises(ValueError, match="3 rows do not split into 2"):
    step(state, batch)


@pytest.mark.parametrize("tied", [True, False])
def test_chunked_logits_give_the_full_logits_logprobs(tied):
  """`UpdateConfig.logits_chunk`: the update's logprobs and entropies through the decoder,
  formed 5 tokens at a time, equal those of the whole [rows, length, vocab] logits."""
  config = ModelConfig.tiny(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                            num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=tied)
  graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(3)))
  trees, adv, w = _random_trees(np.random.default_rng(4), 3)
  batch = packing.pack_trees(trees, adv, w, buckets=BUCKETS, num_rows=4)
  logprobs = jax.jit(update.packed_logprobs, static_argnums=(0, 3, 4))
  full, full_h = logprobs(graphdef, state, batch, 0.8, 0)
  chunked, chunked_h = logprobs(graphdef, state, batch, 0.8, 5)
  # The same float32 decoder; only the output projection's summation order may differ: a
  # 32-term dot and the 24-way logsumexp after it.
  assert_close(chunked, full, steps=64)
  assert_close(chunked_h, full_h, steps=64)
  assert np.any(np.asarray(full) != 0)


@pytest.mark.slow
def test_optimizer_state_keeps_its_dtypes_and_the_update_compiles_once():
  """bfloat16 adapters: Adam's moments are made float32 at init (the dtype the first update
  returns them in), so every step runs one compiled program; the steps equal those of the
  plain optimizer, whose state turns float32 after its first update."""
  from bpo_jax.models import lora  # pylint: disable=g-import-not-at-top
  config = ModelConfig.tiny(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                            num_heads=4, num_kv_heads=2, head_dim=8, lora_rank=4,
                            param_dtype="bfloat16")
  graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))
  adapters, frozen = lora.split_lora(params)
  rng = np.random.default_rng(4)
  batch = packing.pack_trees(*_random_trees(rng, 2), buckets=BUCKETS)
  settings = update.OptimizerConfig(learning_rate=1e-2, max_grad_norm=1.0)
  fixed = update.make_optimizer(settings)
  plain = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, b1=0.9, b2=0.999,
                                                                   weight_decay=0.0))
  states = []
  for tx in (fixed, plain):
    state = update.TrainState(step=jnp.zeros((), jnp.int32), params=_copy(adapters),
                              opt_state=tx.init(adapters))
    step = update.make_train_step(graphdef, tx, update.UpdateConfig(micro_batches=1))
    dtypes = [jax.tree.map(lambda x: x.dtype, state)]
    for _ in range(3):
      state, _ = step(state, batch, frozen=frozen)
      dtypes.append(jax.tree.map(lambda x: x.dtype, state))
    states.append((state, dtypes, step))
  (state, dtypes, step), (plain_state, plain_dtypes, _) = states
  assert all(d == dtypes[0] for d in dtypes), "the state's dtypes changed across steps"
  assert plain_dtypes[0] != plain_dtypes[1]  # what the fix is for
  assert dtypes[0] == plain_dtypes[1]  # made in the dtypes the first update returns
  assert step._cache_size() == 1  # pylint: disable=protected-access
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(plain_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
