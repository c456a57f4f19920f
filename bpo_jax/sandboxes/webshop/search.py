"""Keyword search over a catalogue with BM25, from arrays that can be memory-mapped.

The WebShop release searches a Lucene index (Pyserini: BM25 with k1 = 0.9, b = 0.4, Lucene's
English stop words, Porter stemming) over each product's title, description, bullet points and
option values, and shows the top 50. This index scores the same fields with the same BM25
variant and parameters; words are lower-cased runs of two or more word characters, Lucene's
English stop words are dropped and the rest stemmed with the Snowball English (Porter2)
stemmer, so "Shoes" finds "shoe". Score ties are broken by catalogue order, so a query's
results are the same in every process.

The index is a term-by-document matrix in compressed sparse rows, one row per term (sorted by
its UTF-8 bytes), holding each posting's whole BM25 weight (Lucene's variant; N documents,
df(t) of them with term t, tf(t, d) its count in document d of |d| terms, avgdl the mean |d|):

    w(t, d) = log(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
              * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))

and a query's score of d is the sum of w(t, d) over its terms (a repeated term counts again).
Five flat arrays hold it all (`ARRAYS`), so `save` writes them as `.npy` files and `load` maps
them read-only (`np.load(mmap_mode="r")`): every worker process of a machine then shares one
copy in the page cache, and a search touches only the rows of its terms.
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import importlib.metadata
import json
import os
import re
import sys
from typing import Iterable, Sequence

import numpy as np
import Stemmer


def _import_bm25s_without_jax_backend():
  """Imports bm25s without letting it start a JAX backend.

  When JAX is importable, bm25s runs `jax.lax.top_k` at import time, which initialises JAX's
  backend (on a GPU host: the device and its memory pool) in every sandbox worker process that
  imports this module. The index needs only bm25s's scores, never its top-k, so `jax.lax` is
  hidden while bm25s loads and bm25s falls back to NumPy.
  """
  if "bm25s" in sys.modules:
    return sys.modules["bm25s"]
  try:
    import jax.lax  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    import bm25s  # pylint: disable=g-import-not-at-top
    return bm25s
  saved = sys.modules["jax.lax"]
  sys.modules["jax.lax"] = None  # `import jax.lax` now raises ImportError
  try:
    import bm25s  # pylint: disable=g-import-not-at-top
  finally:
    sys.modules["jax.lax"] = saved
  return bm25s


bm25s = _import_bm25s_without_jax_backend()

from bpo_jax.sandboxes.webshop.catalogue import Product

# Pyserini's default BM25 parameters, which the WebShop release searches with.
BM25_K1 = 0.9
BM25_B = 0.4
# Lucene's English stop words (the set bm25s ships).
STOP_WORDS = frozenset(bm25s.stopwords.STOPWORDS_EN)

_WORD_RE = re.compile(r"(?u)\b\w\w+\b")


def product_document(product: Product) -> str:
  """The text a product is found by."""
  option_values = " ".join(v for _, values in product.options for v in values)
  return " ".join((product.title, product.description, " ".join(product.bullet_points), option_values))


class Analyzer:
  """Text -> index terms: lower case, words of 2+ characters, no stop words, Porter2 stems.

  Example: `Analyzer()("The Running Shoes, for men")` == `["run", "shoe", "men"]`.
  """

  def __init__(self):
    self._stemmer = Stemmer.Stemmer("english")

  def __call__(self, text: str) -> list[str]:
    words = [w for w in _WORD_RE.findall(text.lower()) if w not in STOP_WORDS]
    return self._stemmer.stemWords(words)



# The arrays of an index, saved as `<name>.npy`: CSR row pointers (one row per term), the
# posting's document and BM25 weight, and the sorted vocabulary as UTF-8 bytes with offsets.
ARRAYS = ("term_starts", "doc_ids", "weights", "vocab_bytes", "vocab_starts")
INDEX_FORMAT = "bpo_jax.webshop.bm25/1"


def build_arrays(documents: Iterable[Sequence[str]], k1: float = BM25_K1,
                 b: float = BM25_B) -> tuple[int, dict[str, np.ndarray]]:
  """(number of documents, ARRAYS) of the BM25 index over analysed documents (term lists)."""
  vocab: dict[str, int] = {}
  pair_terms, pair_tfs, lengths, starts = [], [], [], [0]
  for terms in documents:
    counts = collections.Counter(terms)
    pair_terms.extend(vocab.setdefault(t, len(vocab)) for t in counts)
    pair_tfs.extend(counts.values())
    lengths.append(len(terms))
    starts.append(len(pair_terms))
  num_docs = len(lengths)
  names = sorted(vocab)  # code-point order, which is also the order of the UTF-8 bytes
  rank = np.empty(len(names), dtype=np.int64)
  rank[[vocab[t] for t in names]] = np.arange(len(names))
  terms = rank[np.asarray(pair_terms, dtype=np.int64)]
  docs = np.repeat(np.arange(num_docs, dtype=np.int64), np.diff(np.asarray(starts)))
  order = np.lexsort((docs, terms))  # by term, then by document
  terms, docs = terms[order], docs[order]
  tf = np.asarray(pair_tfs, dtype=np.float64)[order]
  df = np.bincount(terms, minlength=len(names))
  length = np.asarray(lengths, dtype=np.float64)
  avgdl = float(length.mean()) if num_docs and length.sum() > 0 else 1.0
  idf = np.log1p((num_docs - df + 0.5) / (df + 0.5))
  weights = idf[terms] * tf / (tf + k1 * (1.0 - b + b * length[docs] / avgdl))
  encoded = [t.encode("utf-8") for t in names]
  arrays = {
      "term_starts": np.concatenate([[0], np.cumsum(df)]).astype(np.int64),
      "doc_ids": docs.astype(np.int32),
      "weights": weights.astype(np.float32),
      "vocab_bytes": np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(),
      "vocab_starts": np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64),
  }
  return num_docs, arrays


def meta_tag(num_products: int) -> str:
  """A short digest of `_meta`: saved indices of other code versions live under other names."""
  blob = json.dumps(_meta(num_products), sort_keys=True).encode("utf-8")
  return hashlib.sha256(blob).hexdigest()[:8]


def _meta(num_products: int) -> dict:
  """What a saved index must agree on with the code that maps it."""
  try:
    stemmer = importlib.metadata.version("PyStemmer")
  except importlib.metadata.PackageNotFoundError:
    stemmer = "unknown"
  return {"format": INDEX_FORMAT, "num_products": num_products, "k1": BM25_K1, "b": BM25_B,
          "stop_words": len(STOP_WORDS), "stemmer": stemmer}


class _Vocabulary:
  """The sorted terms as a read-only sequence of bytes (what `bisect` needs)."""

  def __init__(self, blob: np.ndarray, starts: np.ndarray):
    self._blob, self._starts = blob, starts

  def __len__(self) -> int:
    return len(self._starts) - 1

  def __getitem__(self, i: int) -> bytes:
    return self._blob[self._starts[i]:self._starts[i + 1]].tobytes()

  def find(self, term: str) -> int:
    """The term's row, or -1 if no document has it."""
    key = term.encode("utf-8")
    i = bisect.bisect_left(self, key)
    return i if i < len(self) and self[i] == key else -1


class ProductIndex:
  """A BM25 index over products; `search(query, k)` returns product indices, best first.

  `ProductIndex(products)` builds it in memory; `save(directory)` writes it and
  `ProductIndex.load(directory)` maps it read-only (`loaded_from` is then that directory).
  """

  def __init__(self, products: Sequence[Product] | None = None, *, _arrays=None,
               _num_products: int = 0, _loaded_from: str | None = None):
    self._analyzer = Analyzer()
    if _arrays is None:
      _num_products, _arrays = build_arrays(
          self._analyzer(product_document(p)) for p in products)
    self._num_products = _num_products
    self._arrays = _arrays
    self._vocab = _Vocabulary(_arrays["vocab_bytes"], _arrays["vocab_starts"])
    self.loaded_from = _loaded_from

  @property
  def num_products(self) -> int:
    return self._num_products

  def save(self, directory: str | os.PathLike[str]) -> None:
    """Writes the arrays and `meta.json` into `directory` (which must exist)."""
    for name in ARRAYS:
      np.save(os.path.join(directory, f"{name}.npy"), self._arrays[name])
    meta = _meta(self._num_products)
    with open(os.path.join(directory, "meta.json"), "w", encoding="utf-8") as f:
      json.dump(meta, f, sort_keys=True)

  @classmethod
  def load(cls, directory: str | os.PathLike[str], num_products: int) -> "ProductIndex":
    """Maps a saved index read-only; ValueError if it is not one for `num_products` products."""
    directory = os.fspath(directory)
    try:
      with open(os.path.join(directory, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
      arrays = {name: np.load(os.path.join(directory, f"{name}.npy"), mmap_mode="r")
                for name in ARRAYS}
    except (OSError, ValueError) as e:
      raise ValueError(f"not a saved WebShop index: {directory!r} ({e})") from None
    expected = _meta(num_products)
    if meta != expected:
      raise ValueError(f"the index in {directory!r} is {meta}, expected {expected}")
    return cls(_arrays=arrays, _num_products=num_products, _loaded_from=directory)

  def scores(self, query: str) -> np.ndarray:
    """BM25 score of every product for `query` (zeros when no query term is indexed)."""
    scores = np.zeros(self._num_products, dtype=np.float32)
    starts, docs, weights = (self._arrays[k] for k in ("term_starts", "doc_ids", "weights"))
    for term in self._analyzer(query):
      row = self._vocab.find(term)
      if row >= 0:  # Terms the catalogue never uses match nothing.
        lo, hi = int(starts[row]), int(starts[row + 1])
        scores[docs[lo:hi]] += weights[lo:hi]  # a term's postings name distinct documents
    return scores

  def search(self, query: str, k: int) -> list[int]:
    """Indices of the (at most) k best-scoring products with a positive score."""
    scores = self.scores(query)
    hits = np.flatnonzero(scores > 0)
    # lexsort sorts by its last key first: descending score, then ascending index.
    order = hits[np.lexsort((hits, -scores[hits]))]
    return [int(i) for i in order[:k]]
