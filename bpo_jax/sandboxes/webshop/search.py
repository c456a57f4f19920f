"""Keyword search over a catalogue with BM25 (the `bm25s` library).

The WebShop release searches a Lucene index (Pyserini: BM25 with k1 = 0.9, b = 0.4, Lucene's
English stop words, Porter stemming) over each product's title, description, bullet points and
option values, and shows the top 50. This index scores the same fields with the same BM25
variant and parameters; words are lower-cased runs of two or more word characters, Lucene's
English stop words are dropped and the rest stemmed with the Snowball English (Porter2)
stemmer, so "Shoes" finds "shoe". Score ties are broken by catalogue order, so a query's
results are the same in every process.
"""

from __future__ import annotations

import re
import sys
from typing import Sequence

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


class ProductIndex:
  """A BM25 index over products; `search(query, k)` returns product indices, best first."""

  def __init__(self, products: Sequence[Product]):
    self._num_products = len(products)
    self._analyzer = Analyzer()
    corpus = [self._analyzer(product_document(p)) for p in products]
    self._retriever = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
    self._retriever.index(corpus, show_progress=False)
    # bm25s adds an empty term for documents without terms; it must never match a query.
    self._vocab = {t: i for t, i in self._retriever.vocab_dict.items() if t}

  def scores(self, query: str) -> np.ndarray:
    """BM25 score of every product for `query` (zeros when no query term is indexed)."""
    # Terms the catalogue never uses match nothing, so they are left out.
    known = [self._vocab[t] for t in self._analyzer(query) if t in self._vocab]
    if not known:
      return np.zeros(self._num_products, dtype=np.float32)
    return np.asarray(self._retriever.get_scores(known), dtype=np.float32)

  def search(self, query: str, k: int) -> list[int]:
    """Indices of the (at most) k best-scoring products with a positive score."""
    scores = self.scores(query)
    # lexsort sorts by its last key first: descending score, then ascending index.
    order = np.lexsort((np.arange(self._num_products), -scores))
    return [int(i) for i in order[:k] if scores[i] > 0]
