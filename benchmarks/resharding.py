"""Moving the parameters from the training layout to the sampling layout, device to device,
against the host round trip it replaces.

The training layout (`sharding.TRAINING_RULES`) splits the embedding dimension over "fsdp" and
heads, MLP width and vocabulary over "tensor"; the sampling layout (`sharding.SAMPLING_RULES`)
gathers the fsdp shards and keeps the tensor split. `sharding.reshard` moves a parameter tree
between them with one `jax.device_put` from device arrays to device arrays; the host round trip
is `jax.device_get` of the whole tree followed by `jax.device_put` onto the sampling layout.
Both are timed on a ~100M-parameter Qwen2-style model (random weights, built directly in the
training layout) on a mesh of fake CPU devices, medians over `--repeats`; the resharded tree is
checked equal to the source.

  python benchmarks/resharding.py [--json] [--repeats 7] [--fsdp 4] [--tensor 2]

With `--json` it prints one JSON object: the parameter count, the mesh, both medians in seconds
and `reshard_speedup_vs_host` (host round trip time over device-to-device time). On CPU devices
both moves copy within one memory, so the ratio measures the host path's extra gathering and
copies, not the PCIe or network traffic it would add on accelerators.
"""

import os
import sys

# Eight fake CPU devices unless the caller chose a device count (before JAX starts).
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # pylint: disable=g-import-not-at-top
from bpo_jax import models  # pylint: disable=g-import-not-at-top
from bpo_jax import sharding  # pylint: disable=g-import-not-at-top

# ~100M parameters, Qwen2-style (q/k/v bias, tied embeddings), float32: every matrix divides
# an 8-way fsdp or tensor axis.
MODEL = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_layers=12,
             num_heads=12, num_kv_heads=4, head_dim=64)


def random_params(config: models.ModelConfig, shardings):
  """Random parameters of `config`, created by one jitted function straight into `shardings`
  (no whole copy on one device or on the host)."""
  abstract = nnx.state(nnx.eval_shape(lambda: models.Decoder(config, rngs=nnx.Rngs(0))))
  leaves, treedef = jax.tree.flatten(abstract)

  def make(key):
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [
        0.02 * jax.random.normal(k, leaf.shape, leaf.dtype) for k, leaf in zip(keys, leaves)])

  return jax.jit(make, out_shardings=shardings)(jax.random.key(0))


def main():
  p = common.parser(__doc__.splitlines()[0])
  p.add_argument("--fsdp", type=int, default=4)
  p.add_argument("--tensor", type=int, default=2)
  args = p.parse_args()
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=args.fsdp, tensor=args.tensor),
                            jax.devices()[:args.fsdp * args.tensor])
  config = models.ModelConfig(**MODEL)
  abstract = nnx.state(nnx.eval_shape(lambda: models.Decoder(config, rngs=nnx.Rngs(0))))
  train_sh = sharding.param_shardings(abstract, mesh, sharding.TRAINING_RULES)
  sample_sh = sharding.param_shardings(abstract, mesh, sharding.SAMPLING_RULES)
  params = random_params(config, train_sh)
  num_params = sum(x.size for x in jax.tree.leaves(params))

  device = lambda: sharding.reshard(params, sample_sh)
  compiled = sharding.make_reshard(sample_sh)
  jitted = lambda: compiled(params)
  host = lambda: jax.device_put(jax.device_get(params), sample_sh)
  for move in (device, jitted):
    moved = move()
    for a, b, sh in zip(jax.tree.leaves(params), jax.tree.leaves(moved),
                        jax.tree.leaves(sample_sh)):
      assert b.sharding == sh, (b.sharding, sh)
      np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    del moved
  device_s = common.median_seconds(device, args.repeats)
  jitted_s = common.median_seconds(jitted, args.repeats)
  host_s = common.median_seconds(host, args.repeats)
  figures = {"num_params": int(num_params), "mesh": dict(mesh.shape),
             "devices": f"{mesh.size} x {jax.devices()[0].platform}",
             "reshard_device_s": device_s, "reshard_jit_s": jitted_s,
             "reshard_host_round_trip_s": host_s,
             "jit_speedup_vs_host": host_s / jitted_s,
             "reshard_speedup_vs_host": host_s / device_s, "repeats": args.repeats}
  lines = [
      f"parameters {num_params / 1e6:.1f}M, mesh {dict(mesh.shape)} of {figures['devices']}",
      f"training -> sampling layout, device to device (sharding.reshard): {device_s * 1e3:.1f} ms",
      f"the same as one jitted program (sharding.make_reshard):         {jitted_s * 1e3:.1f} ms",
      f"the same through host memory (device_get + device_put):         {host_s * 1e3:.1f} ms",
      f"reshard_speedup_vs_host: {host_s / device_s:.2f}x (median of {args.repeats})"]
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
