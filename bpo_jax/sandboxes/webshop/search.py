"""Keyword search over a catalogue with BM25 (the `bm25s` library).

The WebShop release searches a Lucene index (Pyserini, BM25 with k1 = 0.9, b = 0.4) over each
product's title, description, bullet points and option values and shows the top 50. This index
scores the same fields with the same BM25 parameters (Lucene's variant of the formula), and
breaks score ties by catalogue order so that a query's results are the same in every process.
"""

from __future__ import annotations

from typing import Sequence

import bm25s
import numpy as np

from bpo_jax.sandboxes.webshop.catalogue import Product

# Pyserini's default BM25 parameters, which the WebShop release searches with.
BM25_K1 = 0.9
BM25_B = 0.4


def product_document(product: Product) -> str:
  """The text a product is found by."""
  option_values = " ".join(v for _, values in product.options for v in values)
  return " ".join((product.title, product.description, " ".join(product.bullet_points), option_values))


class ProductIndex:
  """A BM25 index over products; `search(query, k)` returns product indices, best first."""

  def __init__(self, products: Sequence[Product]):
    self._num_products = len(products)
    self._tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
    corpus_ids = self._tokenizer.tokenize(
        [product_document(p) for p in products], update_vocab=True, return_as="ids",
        show_progress=False)
    self._retriever = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
    self._retriever.index(corpus_ids, show_progress=False)

  def scores(self, query: str) -> np.ndarray:
    """BM25 score of every product for `query` (zeros when no query word is indexed)."""
    vocab = self._tokenizer.get_vocab_dict()
    words = self._tokenizer.tokenize([query], update_vocab=False, return_as="tuple",
                                     show_progress=False)
    # Words the catalogue never uses cannot match anything; bm25s maps them to its empty token.
    known = [int(vocab[w]) for w in _query_words(words) if w in vocab and vocab[w] != vocab.get("")]
    if not known:
      return np.zeros(self._num_products, dtype=np.float32)
    return np.asarray(self._retriever.get_scores(known), dtype=np.float32)

  def search(self, query: str, k: int) -> list[int]:
    """Indices of the (at most) k best-scoring products with a positive score."""
    scores = self.scores(query)
    # lexsort sorts by its last key first: descending score, then ascending index.
    order = np.lexsort((np.arange(self._num_products), -scores))
    return [int(i) for i in order[:k] if scores[i] > 0]


def _query_words(tokenized) -> list[str]:
  ids, vocab = tokenized
  inverse = {v: k for k, v in vocab.items()}
  return [inverse[i] for i in ids[0]]
