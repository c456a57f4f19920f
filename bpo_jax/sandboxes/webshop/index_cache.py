"""The search index of a WebShop data set, built once and memory-mapped by every process.

`cached_index(products, key, cache_dir)` looks for `<cache_dir>/bm25-<key>-<tag>/` (`tag`: a
digest of the index format, BM25 parameters, stop words and stemmer version, so another version
of the code saves its own); if it is there it maps it (`ProductIndex.load`), otherwise it
builds the index, writes it into a fresh directory beside it and renames that into place, so a
reader never sees a half-written index. An exclusive lock on `<that directory>.lock` makes the
first process build while the others wait and then map what it wrote. `key` names the documents (the products file's digest and
how many of its products are used), so one saved index serves every configuration of the same
products. The default `cache_dir` is `$BPO_JAX_CACHE/webshop`, else
`$XDG_CACHE_HOME/bpo_jax/webshop`, else `~/.cache/bpo_jax/webshop`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from typing import Iterator, Sequence

from bpo_jax.sandboxes.base import TaskInputError
from bpo_jax.sandboxes.webshop.catalogue import Product
from bpo_jax.sandboxes.webshop import search
from bpo_jax.sandboxes.webshop.search import ProductIndex


def default_cache_dir() -> str:
  """Where saved indices live when no `index_cache_dir` is given."""
  if os.environ.get("BPO_JAX_CACHE"):
    return os.path.join(os.environ["BPO_JAX_CACHE"], "webshop")
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bpo_jax", "webshop")


@contextlib.contextmanager
def _exclusive(path: str) -> Iterator[None]:
  with open(path, "a+b") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def index_directory(key: str, cache_dir: str | os.PathLike[str] | None = None) -> str:
  return os.path.join(os.fspath(cache_dir or default_cache_dir()), f"bm25-{key}")


def cached_index(products: Sequence[Product], key: str,
                 cache_dir: str | os.PathLike[str] | None = None) -> ProductIndex:
  """The index of `products`, mapped from the cache; built and saved there by the first caller.

  A directory that exists but does not hold an index for these products (another format, a
  different product count) is an error naming it, never silently replaced.
  """
  final = index_directory(f"{key}-{search.meta_tag(len(products))}", cache_dir)
  parent = os.path.dirname(final)
  try:
    os.makedirs(parent, exist_ok=True)
  except OSError as e:
    raise TaskInputError(f"env.options.index_cache_dir: cannot create the WebShop index cache "
                         f"directory {parent!r}: {e.strerror or e}") from None
  if os.path.isdir(final):
    return _load(final, len(products))
  with _exclusive(final + ".lock"):
    if not os.path.isdir(final):  # another process may have built it while this one waited
      fresh = tempfile.mkdtemp(prefix=os.path.basename(final) + ".building-", dir=parent)
      try:
        ProductIndex(products).save(fresh)
        os.rename(fresh, final)
      except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
  return _load(final, len(products))


def _load(directory: str, num_products: int) -> ProductIndex:
  """The saved index; a directory that does not hold this one is the user's to remove."""
  try:
    return ProductIndex.load(directory, num_products)
  except ValueError as e:
    raise TaskInputError(f"WebShop index cache: {e}; remove that directory to rebuild it") from None
