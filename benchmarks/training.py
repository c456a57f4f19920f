"""Packed update against the per-path update on BPO-shaped trees with shared prefixes.

The same trees, model and optimizer step, laid out two ways (bpo_jax.packing): one row per tree
with every token once (ancestor attention), or one causal row per root-to-leaf path (the
reference layout of agent-RL code that trains on independent sequences). Both give the same
gradient (tests/test_training_update.py); this measures time. The ideal speedup is
(tokens summed over all paths) / (unique tokens), what packing saves if time were linear in
tokens; attention's quadratic term and padding make the real one smaller.

    python benchmarks/training.py [--json]

With --json: one object with `packed_speedup`, `ideal_speedup`, the two median step times and the
token counts. Target: packed_speedup >= 0.7 * ideal_speedup.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flax import nnx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks import common  # noqa: E402
from bpo_jax import packing  # noqa: E402
from bpo_jax.models import Decoder, ModelConfig  # noqa: E402
from bpo_jax.training import update  # noqa: E402


def bpo_shaped_tree(rng, vocab, prompt_len=96, depth=8, forks=(2, 4, 6), k=4, action_len=12,
                    observation_len=20):
  """A backbone of `depth` steps with k-way forks at the given depths; siblings roll to depth."""
  parent, action, observation = [], [], []

  def add(p):
    parent.append(p)
    action.append(rng.integers(0, vocab, action_len))
    observation.append(rng.integers(0, vocab, observation_len))
    return len(parent) - 1

  def chain(p, start_depth):
    for _ in range(start_depth, depth):
      p = add(p)

  node = -1
  for d in range(depth):
    if d in forks:
      children = [add(node) for _ in range(k)]
      for c in children[1:]:
        chain(c, d + 1)
      node = children[0]
    else:
      node = add(node)
  tree = packing.TreeTokens(
      prompt=rng.integers(0, vocab, prompt_len), parent=parent, action_tokens=action,
      action_logprobs=[-rng.random(a.size) for a in action], observation_tokens=observation)
  n = len(parent)
  return tree, rng.normal(size=n), np.full(n, 1.0)


def main():
  p = common.parser(__doc__.splitlines()[0])
  p.add_argument("--hidden", type=int, default=512, help="model width (heads of 64)")
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--trees", type=int, default=4)
  args = p.parse_args()
  vocab = args.vocab
  # Width large against row length, as in the LLMs this targets (a 7B model has 3584 hidden
  # units for rows of a few thousand tokens), so attention's quadratic term is a minority.
  config = ModelConfig.tiny(vocab_size=vocab, hidden_size=args.hidden,
                            intermediate_size=3 * args.hidden, num_layers=args.layers,
                            num_heads=args.hidden // 64, num_kv_heads=args.hidden // 128,
                            head_dim=64)
  model = Decoder(config, rngs=nnx.Rngs(0))
  tx = optax.sgd(1e-3)
  graphdef, state = update.create_train_state(model, tx)
  step = update.make_train_step(graphdef, tx, update.UpdateConfig(micro_batches=1))

  rng = np.random.default_rng(0)
  num_trees = args.trees
  trees = [bpo_shaped_tree(rng, vocab) for _ in range(num_trees)]
  toks, advs, ws = zip(*trees)
  unique = sum(t.num_unique_tokens() for t in toks)
  path_rows = [r for t, a, w in trees for r in packing.pack_paths(t, a, w)]
  path_tokens = sum(len(r.tokens) for r in path_rows)
  buckets = tuple(range(64, 8193, 64))  # tight padding for both layouts
  packed = packing.pack_trees(toks, advs, ws, buckets=buckets)
  per_path = packing.stack_rows(path_rows, buckets=buckets)

  def run(batch):
    holder = {"state": jax.tree.map(lambda x: x.copy(), state)}

    def once():
      holder["state"], metrics = step(holder["state"], batch, None, num_trees)
      return metrics["loss"]
    return once

  t_packed = common.median_seconds(run(packed), args.repeats)
  t_path = common.median_seconds(run(per_path), args.repeats)
  ideal = path_tokens / unique
  speedup = t_path / t_packed
  figures = {
      "packed_speedup": speedup,
      "ideal_speedup": ideal,
      "packed_over_ideal": speedup / ideal,
      "packed_step_s": t_packed,
      "per_path_step_s": t_path,
      "unique_tokens": unique,
      "path_tokens": path_tokens,
      "packed_shape": list(packed.tokens.shape),
      "per_path_shape": list(per_path.tokens.shape),
      "num_params": config.num_params(),
      "backend": jax.default_backend(),
  }
  lines = [
      f"model: {config.num_params() / 1e6:.1f}M parameters on {jax.default_backend()}; "
      f"{num_trees} trees, {len(path_rows)} paths",
      f"tokens: unique {unique}, over all paths {path_tokens}  -> ideal speedup {ideal:.2f}x",
      f"packed update   {packed.tokens.shape}: median {t_packed * 1e3:8.1f} ms",
      f"per-path update {per_path.tokens.shape}: median {t_path * 1e3:8.1f} ms",
      f"packed speedup {speedup:.2f}x = {speedup / ideal:.2f} of ideal (target >= 0.70)",
  ]
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
