"""What a fork of the KV cache costs, paged against dense (the reference), and what a BPO
iteration's trees hold in a paged cache against the dense cache's bytes.

Fork: a batch of 8 rows, each holding a prefix of P tokens (P = 128 and 4096, plus 5 so the
last page is partly filled), row 0 forked into K = 4 siblings (`Sampler.take_rows` with rows
[0, 0, 0, 0, 1, ..., 7]), on a cache of P + 64 slots per row with a 0.5B-class layer shape
(`--layers` 24, 2 KV heads of 64, bfloat16). Dense gathers whole rows, so its fork grows with
the cache length; paged copies the table rows and at most one page per sibling. Medians over
`--repeats` forks, the two prefixes interleaved; the paged cache is put back (the siblings
dropped) between forks, untimed.

Trees: the rollout engine grows one BPO iteration of the quickstart configuration's trees
(`experiments/configs/quickstart.py`: its rollout settings, model shape and 16 rooms tasks)
with a random policy and a paged cache of `--page-size` slots. After every sampler call it
records the bytes of the pages in use and the bytes of a dense cache for the same rows
(rows x `model.max_length` slots); `tree_cache_bytes_over_dense` is the ratio of their peaks.

    python benchmarks/fork_cost.py [--json] [--repeats 9] [--page-size 16]

With --json: one object with `fork_seconds_ratio_4096_over_128` (paged; goal <= 1.2),
`dense_fork_seconds_ratio_4096_over_128`, the four fork seconds, the paged fork's pages copied
and bytes moved at each prefix, `tree_cache_bytes_over_dense`, the peak bytes of each and
`tree_rows_peak`.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import common  # noqa: E402
from bpo_jax import rollout  # noqa: E402
from bpo_jax import sampling  # noqa: E402
from bpo_jax import text  # noqa: E402
from bpo_jax.models import Decoder  # noqa: E402
from bpo_jax.models import ModelConfig  # noqa: E402
from bpo_jax.models import paged  # noqa: E402
from bpo_jax.sandboxes import pool as pool_lib  # noqa: E402
from bpo_jax.sandboxes import rooms  # noqa: E402
from bpo_jax.training import settings as settings_lib  # noqa: E402
from bpo_jax.training import translate  # noqa: E402
from experiments.configs import quickstart  # noqa: E402

PREFIXES = (128, 4096)
ROWS, SIBLINGS, OFFSET = 8, 4, 5


def _filled_state(sampler: sampling.Sampler, prefix: int) -> sampling.DecodeState:
  """ROWS rows of `prefix` tokens each (random keys and values; the numbers do not matter)."""
  ds = sampler.init_state(ROWS)
  cache = ds.cache
  lengths = np.full((ROWS,), prefix, np.int32)
  if isinstance(cache, paged.PagedKVCache):
    cache = paged.with_room(cache, lengths)
    cache.book.trim(lengths)
  fill = lambda x: jnp.full(x.shape, 0.5, x.dtype)
  cache = cache.replace(keys=jax.tree.map(fill, cache.keys), values=jax.tree.map(fill, cache.values),
                        lengths=jnp.asarray(lengths))
  return ds.replace(cache=cache)


class _Forks:
  """Forks row 0 of a batch of ROWS rows of `prefix` tokens into SIBLINGS rows, one at a time;
  keeps each fork's seconds and the paged cache's work."""

  def __init__(self, sampler: sampling.Sampler, prefix: int):
    self.sampler, self.ds = sampler, _filled_state(sampler, prefix)
    self.seconds, self.work = [], {}

  def fork(self) -> None:
    rows = [0] * SIBLINGS + list(range(1, ROWS))
    before = dict(self.ds.cache.book.stats) if self.sampler.page_size else {}
    start = time.perf_counter()
    forked = self.sampler.take_rows(self.ds, rows)
    jax.block_until_ready((forked.cache.keys, forked.next_logits))
    self.seconds.append(time.perf_counter() - start)
    if self.sampler.page_size:  # consumed by the fork: put back, the siblings dropped
      self.work = {k: forked.cache.book.stats[k] - before[k] for k in before}
      self.ds = self.sampler.take_rows(forked, [0] + list(range(SIBLINGS, SIBLINGS + ROWS - 1)))


def _fork_config(layers: int) -> ModelConfig:
  return ModelConfig.tiny(vocab_size=1024, hidden_size=128, intermediate_size=128,
                          num_layers=layers, num_heads=14, num_kv_heads=2, head_dim=64,
                          dtype="bfloat16")


def tree_cache(page_size: int, seed: int = 0) -> dict:
  """Peak paged bytes in use and dense bytes over one quickstart BPO iteration's rollout."""
  settings = settings_lib.from_config(quickstart.get_config())
  tasks = rooms.make_tasks("train", num=settings.rollout.tasks_per_iteration, seed=0,
                           difficulty=1)
  with tempfile.TemporaryDirectory() as workdir:
    _, fmt = text.build_text("rooms", workdir, tasks, env_options={"difficulty": 1},
                             max_observation_tokens=settings.env.max_observation_tokens)
  config = translate.model_config(settings, fmt.vocab_size)
  graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(seed)))
  rollout_config = translate.rollout_config(settings)
  rollout_config = type(rollout_config)(**{**rollout_config.__dict__, "kv_page_size": page_size})
  pool = pool_lib.SandboxPool.for_environment("rooms", num_workers=0,
                                              max_steps=settings.env.max_turns)
  engine = rollout.RolloutEngine(graphdef, config, fmt, pool, rollout_config)
  slot_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
  peaks = dict(paged=0, dense=0, rows=0)

  def recording(method):
    def call(*args, **kwargs):
      out = method(*args, **kwargs)
      ds = out[0] if isinstance(out, tuple) else out
      if ds is not None:
        book = ds.cache.book
        peaks["paged"] = max(peaks["paged"], book.pages_in_use() * book.page_bytes)
        peaks["dense"] = max(peaks["dense"], ds.batch_size * rollout_config.max_length * slot_bytes)
        peaks["rows"] = max(peaks["rows"], ds.batch_size)
      return out
    return call

  for name in ("take_rows", "append", "generate"):
    setattr(engine.sampler, name, recording(getattr(engine.sampler, name)))
  try:
    batch = engine.rollout(params, tasks, jax.random.key(seed))
  finally:
    pool.shutdown()
  leaves = float(np.median([r.leaves().size for r in batch.rollouts]))
  return dict(tree_cache_bytes_over_dense=peaks["paged"] / peaks["dense"],
              tree_paged_peak_bytes=peaks["paged"], tree_dense_peak_bytes=peaks["dense"],
              tree_rows_peak=peaks["rows"], tree_leaves_per_tree=leaves,
              tree_page_size=page_size)


def main(argv=None):
  p = common.parser(__doc__.split("\n\n")[0], repeats=9)
  p.add_argument("--page-size", type=int, default=16, help="slots per page")
  p.add_argument("--layers", type=int, default=24, help="layers of the fork's cache")
  args = p.parse_args(argv)
  if args.page_size < 1 or args.layers < 1 or args.repeats < 1:
    p.error("--page-size, --layers and --repeats must be positive")

  config = _fork_config(args.layers)
  graphdef = nnx.graphdef(Decoder(_fork_config(1), rngs=nnx.Rngs(0)))
  forks = {(name, prefix): _Forks(sampling.Sampler(graphdef, config, prefix + OFFSET + 64,
                                                   page_size=page_size), prefix + OFFSET)
           for prefix in PREFIXES for name, page_size in (("dense", 0), ("paged", args.page_size))}
  # The two prefixes interleaved, so that load from other processes falls on both alike; each
  # cache kind on its own, so that a dense fork's gather of whole rows does not leave the
  # paged one a cold processor cache. The first fork of each compiles and is left out.
  for name in ("dense", "paged"):
    for _ in range(args.repeats + 1):
      for prefix in PREFIXES:
        forks[(name, prefix)].fork()
  figures = {f"{name}_fork_seconds_{prefix}": statistics.median(f.seconds[1:])
             for (name, prefix), f in forks.items()}
  work = {key: f.work for key, f in forks.items()}
  for name in ("dense", "paged"):
    ratio = figures[f"{name}_fork_seconds_{PREFIXES[1]}"] / figures[f"{name}_fork_seconds_{PREFIXES[0]}"]
    figures[("" if name == "paged" else "dense_") + "fork_seconds_ratio_4096_over_128"] = ratio
  for prefix in PREFIXES:
    figures[f"paged_fork_pages_copied_{prefix}"] = work[("paged", prefix)]["pages_copied"]
    figures[f"paged_fork_bytes_moved_{prefix}"] = (work[("paged", prefix)]["kv_bytes_copied"]
                                                   + work[("paged", prefix)]["row_bytes_moved"])
  figures.update(tree_cache(args.page_size))
  figures.update(page_size=args.page_size, layers=args.layers, repeats=args.repeats)

  lines = [f"fork of one row into {SIBLINGS} in a batch of {ROWS} ({args.layers} layers, 2 KV "
           f"heads of 64, bfloat16; pages of {args.page_size}; medians of {args.repeats})",
           f"  {'prefix':>8} {'dense (reference) s':>20} {'paged s':>10} {'paged pages copied':>19}"]
  for prefix in PREFIXES:
    lines.append(f"  {prefix:>8} {figures[f'dense_fork_seconds_{prefix}']:>20.5f} "
                 f"{figures[f'paged_fork_seconds_{prefix}']:>10.5f} "
                 f"{figures[f'paged_fork_pages_copied_{prefix}']:>19}")
  lines += [f"  4096 / 128: dense {figures['dense_fork_seconds_ratio_4096_over_128']:.2f}, "
            f"paged {figures['fork_seconds_ratio_4096_over_128']:.2f} (goal <= 1.2)",
            f"quickstart BPO iteration ({figures['tree_rows_peak']} rows at most, median "
            f"{figures['tree_leaves_per_tree']:.0f} leaves per tree): paged cache peak "
            f"{figures['tree_paged_peak_bytes'] / 2**20:.2f} MiB, dense "
            f"{figures['tree_dense_peak_bytes'] / 2**20:.2f} MiB, ratio "
            f"{figures['tree_cache_bytes_over_dense']:.3f}"]
  common.emit(figures, args.json, lines)


if __name__ == "__main__":
  main()
