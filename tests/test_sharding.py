"""Sharding on 8 fake CPU devices: rules, optimizer-state layout, sharded ≡ unsharded update,
no recompilation across steps, each process's devices for sampling, decoding on a mesh."""

import collections
import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import optax
import pytest

from bpo_jax import packing
from bpo_jax import sampling
from bpo_jax import sharding
from bpo_jax.models import Decoder, ModelConfig, lora
from bpo_jax.testing.tolerance import assert_close
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import update

CONFIG = ModelConfig.tiny(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=8)


def _mesh(data=2, fsdp=2, tensor=2):
  assert jax.device_count() >= 8, "tests/conftest.py sets 8 CPU devices"
  return sharding.make_mesh(sharding.MeshConfig(data=data, fsdp=fsdp, tensor=tensor),
                            jax.devices()[:data * fsdp * tensor])


def test_mesh_config_resolution_and_errors():
  assert sharding.MeshConfig(data=2, fsdp=-1, tensor=2).resolve(8) == (2, 2, 2)
  assert sharding.MeshConfig(data=1, fsdp=1, tensor=-1).resolve(8) == (1, 1, 8)
  with pytest.raises(ValueError, match="needs 12 devices, have 8"):
    sharding.MeshConfig(data=3, fsdp=2, tensor=2).resolve(8)
  with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
    sharding.MeshConfig(data=-1, fsdp=-1).resolve(8)
  with pytest.raises(ValueError, match="do not divide"):
    sharding.MeshConfig(data=3, fsdp=-1).resolve(8)


def test_multi_slice_mesh_without_slice_topology():
  # CPU devices have no slice_index: consecutive blocks of 4 devices stand in for 2 slices, and
  # "data" spans them slice-major while fsdp and tensor stay inside a slice.
  devices = jax.devices()[:8]
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, tensor=2, dcn_data=2), devices)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert [d.id for d in mesh.devices[0].ravel()] == [d.id for d in devices[:4]]
  assert [d.id for d in mesh.devices[1].ravel()] == [d.id for d in devices[4:]]


def test_logical_rules_and_fallback():
  mesh = _mesh(1, 2, 4)
  why = []
  # 2 KV heads on a 4-way tensor axis: replicated, and the reason is recorded.
  spec = sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), (32, 2, 8), mesh,
                                  explain=why)
  assert spec == P("fsdp", None, None)
  assert why == ["kv_heads: size 2 not divisible by 4 (('tensor',))"]
  assert sharding.logical_to_spec(("embed", "heads", "head_dim"), (32, 4, 8), mesh) == \
      P("fsdp", "tensor", None)
  assert sharding.logical_to_spec(("batch", "length"), (8, 16), mesh) == P("fsdp", None)
  with pytest.raises(ValueError, match="no sharding rule for logical axis 'bogus'"):
    sharding.logical_to_spec(("bogus",), (4,), mesh)


def test_param_and_optimizer_shardings_follow_the_rules():
  mesh = _mesh()
  model = Decoder(CONFIG, rngs=nnx.Rngs(0))
  tx = optax.adamw(1e-3)
  _, state = update.create_train_state(model, tx)
  param_sh = sharding.param_shardings(state.params, mesh)
  specs = {jax.tree_util.keystr(p): s.spec
           for p, s in jax.tree_util.tree_leaves_with_path(param_sh)}
  assert specs["['layers'][0]['attn']['q_kernel'].value"] == P("fsdp", "tensor", None)
  assert specs["['layers'][0]['mlp']['down_kernel'].value"] == P("tensor", "fsdp")
  assert specs["['embed'].value"] == P("tensor", "fsdp")
  assert specs["['final_norm']['weight'].value"] == P(None)
  opt_sh = sharding.optimizer_shardings(state.opt_state, state.params, param_sh, mesh)
  mu = opt_sh[0].mu
  assert jax.tree.leaves(mu)[0].spec == jax.tree.leaves(param_sh)[0].spec
  assert opt_sh[0].count.spec == P()


def _batch(rng, rows=8):
  trees, adv, w = [], [], []
  for _ in range(rows):
    n = 4
    tree = packing.TreeTokens(
        prompt=rng.integers(0, 64, 5), parent=[-1, -1, 0, 0],
        action_tokens=[rng.integers(0, 64, 3) for _ in range(n)],
        action_logprobs=[np.full(3, -4.0) for _ in range(n)],
        observation_tokens=[rng.integers(0, 64, 2) for _ in range(n)])
    trees.append(tree)
    adv.append(rng.normal(size=n))
    w.append(np.array([0.5, 0.5, 0.25, 0.25]))
  return packing.pack_trees(trees, adv, w, buckets=(32,))


@pytest.mark.slow
def test_sharded_train_step_equals_unsharded_and_compiles_once():
  mesh = _mesh()
  # SGD with momentum: sharded optimizer state, and parameters linear in the gradients (Adam's
  # g / (|g| + eps) would turn float noise in near-zero gradient entries into O(lr) changes).
  tx = optax.sgd(0.1, momentum=0.9)
  graphdef, state = update.create_train_state(Decoder(CONFIG, rngs=nnx.Rngs(1)), tx)
  reference_state = jax.tree.map(jnp.array, state)
  param_sh = sharding.param_shardings(state.params, mesh)
  state_sh = update.TrainState(
      step=NamedSharding(mesh, P()), params=param_sh,
      opt_state=sharding.optimizer_shardings(state.opt_state, state.params, param_sh, mesh))
  batch_sh = sharding.batch_sharding(mesh)
  config = update.UpdateConfig(micro_batches=2)
  sharded_step = update.make_train_step(graphdef, tx, config, state_sharding=state_sh,
                                        batch_sharding=batch_sh)
  plain_step = update.make_train_step(graphdef, tx, config)
  sharded_state = sharding.reshard(state, state_sh)
  rng = np.random.default_rng(0)
  for _ in range(3):
    batch = _batch(rng)
    sharded_state, m_sharded = sharded_step(sharded_state, sharding.reshard(batch, batch_sh))
    reference_state, m_plain = plain_step(reference_state, batch)
    # The mesh splits the decoder's sums (over tokens, features, micro-batches) across devices
    # and adds the parts in another order: ≤ 64 roundings along any path (sums counted by their
    # depth) at the value compared, or at a parameter's largest entry after three steps.
    assert_close(m_sharded["grad_norm"], m_plain["grad_norm"], steps=64)
    assert_close(m_sharded["loss"], m_plain["loss"], steps=64)
  for a, b in zip(jax.tree.leaves(sharded_state.params), jax.tree.leaves(reference_state.params)):
    assert_close(a, b, steps=64)
  # The layout survives the steps, and three steps compiled one program.
  for leaf, sh in zip(jax.tree.leaves(sharded_state.params), jax.tree.leaves(param_sh)):
    assert leaf.sharding.is_equivalent_to(sh, leaf.ndim)
  assert sharded_step.jitted._cache_size() == 1  # pylint: disable=protected-access


def test_cache_shardings_and_reshard_between_layouts():
  mesh = _mesh(2, 2, 2)
  from bpo_jax.models import KVCache
  cache = KVCache.init(CONFIG, batch_size=8, max_length=16)
  sh = sharding.cache_shardings(cache, mesh)
  # Values [B, Hkv, S, D], keys [B, Hkv, D, S]: rows over the batch axes, the 2 KV heads over
  # "tensor", slots and head dimensions whole.
  assert cache.values[0].shape == (8, 2, 16, 8)
  assert cache.keys[0].shape == (8, 2, 8, 16)
  assert sh.keys[0].spec == P(("data", "fsdp"), "tensor", None, None)
  assert sh.values[0].spec == P(("data", "fsdp"), "tensor", None, None)
  # Slots split over "tensor" (heads replicated): keys and values find them on their own axis.
  by_slots = {**sharding.SAMPLING_RULES, "kv_heads": None, "cache_length": "tensor"}
  sh_slots = sharding.cache_shardings(cache, mesh, by_slots)
  assert sh_slots.keys[0].spec == P(("data", "fsdp"), None, None, "tensor")
  assert sh_slots.values[0].spec == P(("data", "fsdp"), None, "tensor", None)
  assert sh.lengths.spec == P(("data", "fsdp"))
  placed = sharding.reshard(cache, sh)
  assert placed.keys[0].sharding.spec == P(("data", "fsdp"), "tensor", None, None)
  params = nnx.state(Decoder(CONFIG, rngs=nnx.Rngs(0)))
  train = sharding.reshard(params, sharding.param_shardings(params, mesh))
  sample = sharding.reshard(train, sharding.param_shardings(params, mesh,
                                                            sharding.SAMPLING_RULES))
  q = sample["layers"][0]["attn"]["q_kernel"][...]
  assert q.sharding.spec == P(None, "tensor", None)
  np.testing.assert_array_equal(q, params["layers"][0]["attn"]["q_kernel"][...])


def test_make_reshard_moves_like_reshard_in_one_program():
  mesh = _mesh(1, 4, 2)
  params = nnx.state(Decoder(CONFIG, rngs=nnx.Rngs(0)))
  train = sharding.reshard(params, sharding.param_shardings(params, mesh))
  sample_sh = sharding.param_shardings(params, mesh, sharding.SAMPLING_RULES)
  moved, eager = sharding.make_reshard(sample_sh)(train), sharding.reshard(train, sample_sh)
  for a, b, want, source in zip(jax.tree.leaves(moved), jax.tree.leaves(eager),
                                jax.tree.leaves(sample_sh), jax.tree.leaves(params)):
    assert a.sharding.is_equivalent_to(want, a.ndim) and b.sharding.is_equivalent_to(want, b.ndim)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(source))
    np.testing.assert_array_equal(np.asarray(b), np.asarray(source))


def _device_grid(shape, per_process):
  """A grid of stand-in devices 0..n-1, `per_process` consecutive ones to a process."""
  device = collections.namedtuple("Device", "id process_index")
  grid = np.empty(shape, object)
  for i in range(grid.size):
    grid.flat[i] = device(i, i // per_process)
  return grid


def _ids(grid):
  return np.vectorize(lambda d: d.id)(grid).tolist()


def test_process_grid_gives_each_process_its_tensor_groups():
  two = _device_grid((1, 4, 2), per_process=4)  # fsdp 4 x tensor 2 over two processes
  assert _ids(sharding.process_grid(two, 0)) == [[[0, 1], [2, 3]]]
  assert _ids(sharding.process_grid(two, 1)) == [[[4, 5], [6, 7]]]
  # data 2 x fsdp 2 x tensor 2: the data axis spans the processes.
  assert _ids(sharding.process_grid(_device_grid((2, 2, 2), 4), 1)) == [[[4, 5], [6, 7]]]
  # One process owns the grid: it is the grid.
  assert sharding.process_grid(two, 0).shape == (1, 2, 2)
  assert _ids(sharding.process_grid(_device_grid((2, 2, 2), 8), 0)) == _ids(
      _device_grid((2, 2, 2), 8))
  with pytest.raises(ValueError, match="tensor axis \\(8 devices\\) spans processes"):
    sharding.process_grid(_device_grid((1, 1, 8), 4), 0)
  with pytest.raises(ValueError, match="process 2 holds no device"):
    sharding.process_grid(two, 2)
  mesh = _mesh(1, 4, 2)  # every device is this process's
  assert sharding.process_submesh(mesh) is mesh


@pytest.mark.slow
def test_sampling_on_a_mesh_keeps_the_cache_laid_out_and_decodes_like_one_device():
  mesh = _mesh(1, 4, 2)
  graphdef, params = nnx.split(Decoder(CONFIG, rngs=nnx.Rngs(0)))
  on_mesh = sharding.make_reshard(
      sharding.param_shardings(params, mesh, sharding.SAMPLING_RULES))(params)
  assert sampling.params_mesh(params) is None and sampling.params_mesh(on_mesh) == mesh
  sampler = sampling.Sampler(graphdef, CONFIG, max_length=32)
  prompts = {b: list(range(1, 3 + b)) for b in range(8)}
  keys = jax.random.split(jax.random.key(3), 8)
  draw = sampling.SamplingParams(temperature=1.0, max_new_tokens=5)
  outputs = {}
  for name, state, where in (("one", params, None), ("mesh", on_mesh, mesh)):
    decode_state = sampler.append(state, sampler.init_state(8, where), prompts)
    decode_state, first = sampler.generate(state, decode_state, keys, draw)
    # The fork: rows 5 and 2, four copies each.
    decode_state = sampler.take_rows(decode_state, [5] * 4 + [2] * 4, where)
    decode_state, second = sampler.generate(state, decode_state, keys, draw)
    outputs[name] = (first, second, decode_state)
  decode_state = outputs["mesh"][2]
  # After every call the rows are over fsdp (every leaf: cache, lengths, next-token logits)
  # and the 2 KV heads over tensor.
  cache, want = decode_state.cache, sharding.cache_shardings(decode_state.cache, mesh)
  for leaf, laid_out in zip(jax.tree.leaves(cache), jax.tree.leaves(want)):
    assert leaf.sharding.is_equivalent_to(laid_out, leaf.ndim)
  assert cache.keys[0].sharding.is_equivalent_to(
      NamedSharding(mesh, P("fsdp", "tensor", None, None)), 4)
  assert decode_state.next_logits.sharding.spec[0] == "fsdp"
  for one, on in zip(outputs["one"][:2], outputs["mesh"][:2]):
    np.testing.assert_array_equal(np.asarray(on.tokens), np.asarray(one.tokens))
    # log-softmax of logits of magnitude < 1: a few roundings in a tensor-parallel order.
    assert_close(np.asarray(on.logprobs), np.asarray(one.logprobs), steps=16,
                 magnitude=float(np.abs(np.asarray(one.logprobs)).max()))
  np.testing.assert_array_equal(np.asarray(outputs["mesh"][2].lengths),
                                np.asarray(outputs["one"][2].lengths))


@pytest.mark.slow
def test_a_lora_base_laid_out_by_the_rules_gives_the_update_of_one_device():
  lora_config = dataclasses.replace(CONFIG, lora_rank=2, lora_alpha=4.0)
  graphdef, params = nnx.split(Decoder(lora_config, rngs=nnx.Rngs(2)))
  adapters, base = lora.split_lora(params)
  # B = 0 at initialisation: give the adapters values so that the gradient reaches A too.
  adapters = jax.tree.map(lambda x: x + 0.01, adapters)
  tx = optax.sgd(0.1, momentum=0.9)
  state = update.TrainState(step=jnp.zeros((), jnp.int32), params=adapters,
                            opt_state=tx.init(adapters))
  mesh = _mesh(1, 4, 2)
  placement = placement_lib.Placement(mesh=mesh, row_sharding=sharding.batch_sharding(mesh))
  placement = dataclasses.replace(placement, state_sharding=placement.shardings_of(state))
  placed = placement.place_frozen(base)
  # The base is laid out like trainable parameters (matrices over fsdp 4 x tensor 2, biases
  # over tensor, norms replicated), and a device holds just its shards.
  rules = sharding.param_shardings(base, mesh)
  expected = 0
  for leaf, want in zip(jax.tree.leaves(placed), jax.tree.leaves(rules)):
    assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
    split = [mesh.shape[a] for axes in want.spec if axes
             for a in ((axes,) if isinstance(axes, str) else axes)]
    expected += leaf.nbytes // int(np.prod(split))
  whole, per_device = placement_lib.state_bytes(placed)
  assert per_device == expected < whole / 7
  config = update.UpdateConfig(micro_batches=2)
  sharded_step = update.make_train_step(graphdef, tx, config,
                                        state_sharding=placement.state_sharding,
                                        batch_sharding=placement.row_sharding)
  plain_step = update.make_train_step(graphdef, tx, config)
  batch = _batch(np.random.default_rng(1))
  on_mesh, m_mesh = sharded_step(placement.place(state), placement.feed(batch), None, None,
                                 placed)
  one, m_one = plain_step(jax.tree.map(jnp.array, state), batch, None, None, base)
  assert_close(m_mesh["loss"], m_one["loss"], steps=64)
  assert float(m_one["grad_norm"]) > 0
  for a, b in zip(jax.tree.leaves(on_mesh.params), jax.tree.leaves(one.params)):
    assert_close(a, b, steps=64)
  # The sampling layout of the joined model (base and adapters) is split over tensor alone.
  joined = placement.for_sampling(nnx.merge_state(on_mesh.params, placed))
  q = joined["layers"][0]["attn"]["q_kernel"][...]
  assert q.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "tensor", None)), 3)
