"""WebShop's search index at 100,000 products: load, build, and what each worker process costs.

Writes a generated catalogue in the format of WebShop's released files
(`bpo_jax.testing.webshop_files`) into a temporary directory, then measures:

- `load_s`: streaming the three files into a catalogue (`load_webshop_files`);
- `index_build_s`: building the BM25 index and saving it (`index_cache.cached_index`, first call);
- the first worker, a fresh process that builds the index in memory from the products and
  searches it (what every worker did before the index was saved): `first_worker_rss_mb`, its
  resident-memory growth from just before the build to after the searches;
- each further worker (`--workers` of them, alive together), a fresh process that maps the saved
  index (`ProductIndex.load`) and runs the same searches: `further_worker_rss_mb` (growth of
  VmRSS, which counts the mapped file pages it touched although the page cache holds one copy
  for all processes), `further_worker_private_mb` (growth of RssAnon, the memory that is this
  process's alone) and `further_worker_pss_mb` (growth of the proportional set size, which
  splits each shared page among the processes mapping it, measured while all are alive);
- `extra_worker_memory_fraction`: the mean of `further_worker_private_mb` over
  `first_worker_rss_mb` (target <= 0.1), and `extra_worker_rss_fraction` the same with VmRSS;
- `search_ms`: the median time of one `search(query, 50)` in a mapped worker (queries of 1-4
  words drawn from product titles), and `search_ms_in_memory` in the first worker.

    python benchmarks/webshop_index.py [--json] [--products 100000] [--workers 3] [--queries 200]
"""

from __future__ import annotations

import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402


def _memory_kb() -> dict[str, int]:
  """VmRSS, RssAnon and RssFile (/proc/self/status) and Pss (/proc/self/smaps_rollup), in kB."""
  out = {}
  for path, keys in (("/proc/self/status", ("VmRSS", "RssAnon", "RssFile")),
                     ("/proc/self/smaps_rollup", ("Pss",))):
    with open(path) as f:
      for line in f:
        key, _, value = line.partition(":")
        if key in keys:
          out[key] = int(value.split()[0])
  return out


def _timed_searches(index, queries) -> float:
  """Median seconds of one search over `queries` (after one warm-up pass over five)."""
  for q in queries[:5]:
    index.search(q, 50)
  times = []
  for q in queries:
    start = time.perf_counter()
    index.search(q, 50)
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _first_worker(paths, queries, out) -> None:
  from bpo_jax.sandboxes.webshop import load_webshop_files, search
  cat = load_webshop_files(**paths)
  before = _memory_kb()
  index = search.ProductIndex(cat.products)
  seconds = _timed_searches(index, queries)
  after = _memory_kb()
  out.put(("first", {k: after[k] - before[k] for k in before}, seconds))


def _further_worker(directory, num_products, queries, barrier, out) -> None:
  from bpo_jax.sandboxes.webshop import search
  before = _memory_kb()
  index = search.ProductIndex.load(directory, num_products)
  seconds = _timed_searches(index, queries)
  barrier.wait(timeout=600)  # every worker has mapped and searched: the pages are shared
  after = _memory_kb()
  out.put(("further", {k: after[k] - before[k] for k in before}, seconds))
  barrier.wait(timeout=600)  # the workers hold their maps until all have measured


def _queries(products, count: int) -> list[str]:
  rng = random.Random(0)
  queries = []
  for _ in range(count):
    words = rng.choice(products).title.split()
    queries.append(" ".join(rng.sample(words, min(len(words), rng.randint(1, 4)))))
  return queries


def _run_workers(ctx, target, args_list):
  out = ctx.Queue()
  procs = [ctx.Process(target=target, args=(*args, out)) for args in args_list]
  for p in procs:
    p.start()
  results = [out.get(timeout=900) for _ in procs]
  for p in procs:
    p.join(timeout=60)
    if p.exitcode != 0:
      raise RuntimeError(f"a benchmark worker exited with status {p.exitcode}")
  return results


def main(argv=None):
  p = common.parser(__doc__.split("\n\n")[0], repeats=1)
  p.add_argument("--products", type=int, default=100_000, help="products in the catalogue")
  p.add_argument("--workers", type=int, default=3, help="further workers that map the index")
  p.add_argument("--queries", type=int, default=200, help="searches per worker")
  args = p.parse_args(argv)
  from bpo_jax.sandboxes.webshop import index_cache, load_webshop_files
  from bpo_jax.testing.webshop_files import write_released_files

  ctx = multiprocessing.get_context("spawn")
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    written = write_released_files(tmp, args.products, seed=0)
    generate_s = time.perf_counter() - start
    paths = dict(products_path=written.products_path, attributes_path=written.attributes_path,
                 human_instructions_path=written.human_instructions_path)
    data_mb = sum(os.path.getsize(v) for v in paths.values()) / 2**20
    start = time.perf_counter()
    cat = load_webshop_files(**paths)
    load_s = time.perf_counter() - start
    cache = os.path.join(tmp, "cache")
    start = time.perf_counter()
    index = index_cache.cached_index(cat.products, cat.index_key, cache)
    build_s = time.perf_counter() - start
    index_mb = sum(os.path.getsize(os.path.join(index.loaded_from, f))
                   for f in os.listdir(index.loaded_from)) / 2**20
    queries = _queries(cat.products, args.queries)
    num_products, directory = len(cat.products), index.loaded_from
    del cat, index
    [(_, first, first_s)] = _run_workers(ctx, _first_worker, [(paths, queries)])
    barrier = ctx.Barrier(args.workers)
    further = _run_workers(ctx, _further_worker,
                           [(directory, num_products, queries, barrier)] * args.workers)
  mb = lambda kb: kb / 1024  # noqa: E731
  first_mb = mb(first["VmRSS"])
  rss = [mb(m["VmRSS"]) for _, m, _ in further]
  private = [mb(m["RssAnon"]) for _, m, _ in further]
  pss = [mb(m["Pss"]) for _, m, _ in further]
  figures = {
      "products": num_products, "generated_files_mb": round(data_mb, 1),
      "generate_s": round(generate_s, 2), "load_s": round(load_s, 2),
      "index_build_s": round(build_s, 2), "index_files_mb": round(index_mb, 1),
      "first_worker_rss_mb": round(first_mb, 1),
      "further_worker_rss_mb": [round(x, 1) for x in rss],
      "further_worker_private_mb": [round(x, 1) for x in private],
      "further_worker_pss_mb": [round(x, 1) for x in pss],
      "extra_worker_memory_fraction": round(statistics.mean(private) / first_mb, 4),
      "extra_worker_rss_fraction": round(statistics.mean(rss) / first_mb, 4),
      "search_ms": round(1e3 * statistics.median(s for _, _, s in further), 3),
      "search_ms_in_memory": round(1e3 * first_s, 3),
  }
  lines = [
      f"{num_products} products ({data_mb:.0f} MB of JSON, generated in {generate_s:.1f} s)",
      f"load {load_s:.2f} s, index build and save {build_s:.2f} s ({index_mb:.1f} MB of files)",
      f"first worker (index in memory): +{first_mb:.1f} MB resident",
      "further workers (index mapped): +" + ", ".join(f"{x:.1f}" for x in rss)
      + " MB resident, of it private +" + ", ".join(f"{x:.1f}" for x in private)
      + " MB; proportional set +" + ", ".join(f"{x:.1f}" for x in pss) + " MB",
      f"extra_worker_memory_fraction {figures['extra_worker_memory_fraction']} (target <= 0.1),"
      f" with mapped pages {figures['extra_worker_rss_fraction']}",
      f"search(query, 50): {figures['search_ms']} ms mapped, "
      f"{figures['search_ms_in_memory']} ms in memory",
  ]
  common.emit(figures, args.json, lines)
  return figures


if __name__ == "__main__":
  main()
