"""WebShop's released files at a small size: the streaming reader, the loader's goals and splits,
the saved and memory-mapped BM25 index against a brute-force NumPy BM25, and its reuse."""

import hashlib
import json
import os
import random

import numpy as np
import pytest

from bpo_jax.sandboxes.base import TaskInputError
from bpo_jax.sandboxes.webshop import jsonstream, make_sandbox, make_tasks, search, shop
from bpo_jax.testing.tolerance import assert_close
from bpo_jax.testing.webshop_files import write_released_files

NUM_PRODUCTS = 800  # about 1,700 goals: enough for full test and eval splits and some train


@pytest.fixture(scope="module")
def released(tmp_path_factory):
  data = tmp_path_factory.mktemp("webshop_data")
  written = write_released_files(data, NUM_PRODUCTS, seed=0)
  config = {"data_dir": str(data), "data_size": "full",
            "index_cache_dir": str(tmp_path_factory.mktemp("webshop_index"))}
  return written, config


@pytest.fixture
def fresh_process(monkeypatch):
  """The shop's per-process caches emptied, as in a newly started worker."""
  monkeypatch.setattr(shop, "_by_config", {})
  monkeypatch.setattr(shop, "_by_fingerprint", {})


def test_json_stream_across_chunk_boundaries(tmp_path, monkeypatch):
  monkeypatch.setattr(jsonstream, "CHUNK_BYTES", 7)  # every value spans several chunks
  records = [{"a": "naïve › ü", "n": 12345.5e-3}, [], 987654321, "x" * 30, {"k": [1, {"z": None}]}]
  path = tmp_path / "a.json"
  path.write_text(" \n" + json.dumps(records, ensure_ascii=False) + "\n", encoding="utf-8")
  with jsonstream.JsonStream(path, "test") as s:
    assert list(s.iter_array()) == records
  assert s.digest() == hashlib.sha256(path.read_bytes()).hexdigest()
  with jsonstream.JsonStream(path, "test") as s:
    next(s.iter_array())  # stopping early still digests the whole file
  assert s.digest() == hashlib.sha256(path.read_bytes()).hexdigest()
  path.write_text(json.dumps({"b": [1, 2], "é": {"c": "d"}}), encoding="utf-8")
  with jsonstream.JsonStream(path, "test") as s:
    assert list(s.iter_object()) == [("b", [1, 2]), ("é", {"c": "d"})]
  for text, reason in (('[{"a": 1}, {"b": ', "Expecting value"), ('[1 2]', "expected one of"),
                       ('{"a" 1}', "expected one of"), ("", "found the end of the file")):
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=f"test file .* is not valid JSON: .*{reason}"):
      with jsonstream.JsonStream(path, "test") as s:
        list(s.iter_object() if text.startswith("{") else s.iter_array())


def test_goals_and_splits_are_the_release_s(released, fresh_process):
  written, config = released
  sandbox = make_sandbox(**config)
  cat = sandbox.catalogue
  assert [p.asin for p in cat.products] == written.kept_asins
  assert len(cat.products) == NUM_PRODUCTS - 3  # "nan", a too-long asin and a repeat dropped
  # One goal per instruction with attributes, in file order, the price limit appended.
  assert [(g.asin, g.instruction.split(", and price lower than")[0]) for g in cat.goals] == [
      (asin, text.strip(".")) for asin, text in written.goals]
  # The release: random.seed(233); random.shuffle(goals); test [0, 500), eval [500, 1500).
  order = list(range(len(cat.goals)))
  random.seed(233)
  random.shuffle(order)
  splits = {s: make_tasks(s, None, **config) for s in ("test", "eval", "train")}
  assert [len(splits[s]) for s in ("test", "eval", "train")] == [500, 1000, len(order) - 1500]
  assert splits["test"] == [cat.goals[i] for i in order[:500]]
  assert splits["eval"] == [cat.goals[i] for i in order[500:1500]]
  assert splits["train"] == [cat.goals[i] for i in order[1500:]]


def _brute_force_bm25(documents, query_terms):
  """BM25 (Lucene's variant) of every document, in float64, from a dense term-count matrix."""
  vocab = sorted({t for d in documents for t in d})
  col = {t: j for j, t in enumerate(vocab)}
  tf = np.zeros((len(documents), len(vocab)))
  for i, d in enumerate(documents):
    for t in d:
      tf[i, col[t]] += 1
  n = len(documents)
  df = (tf > 0).sum(axis=0)
  idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
  length = tf.sum(axis=1)
  k1, b = search.BM25_K1, search.BM25_B
  weights = idf * tf / (tf + k1 * (1 - b + b * length[:, None] / length.mean()))
  scores = np.zeros(n)
  for t in query_terms:
    if t in col:
      scores += weights[:, col[t]]
  return scores


def test_mapped_index_matches_brute_force_bm25(released, fresh_process):
  _, config = released
  sandbox = make_sandbox(**config)
  index = sandbox._index
  assert index.loaded_from is not None
  assert all(isinstance(index._arrays[k], np.memmap) for k in search.ARRAYS)
  analyzer = search.Analyzer()
  documents = [analyzer(search.product_document(p)) for p in sandbox.catalogue.products]
  rng = random.Random(1)
  queries = ["navy blue shampoo", "Coffee MUG large", "the x-large dog beds", "zzzz unknown"]
  queries += [" ".join(rng.sample(documents[rng.randrange(len(documents))], 3)) for _ in range(8)]
  for query in queries:
    reference = _brute_force_bm25(documents, analyzer(query))
    # Per term: the weight's ≤ 8 float32 roundings (cast from float64: 1), then one sum each.
    assert_close(index.scores(query), reference, steps=4 + 2 * len(analyzer(query)),
                 err_msg=query)
    positive = np.flatnonzero(reference > 0)
    expected = positive[np.lexsort((positive, -reference[positive]))][:50]
    assert index.search(query, 50) == expected.tolist(), query
  assert index.search("zzzz unknown", 50) == []


def test_second_load_maps_the_saved_index(released, fresh_process, monkeypatch):
  _, config = released
  first_sandbox = make_sandbox(**config)
  first = first_sandbox._index
  saved = {k: os.stat(f"{first.loaded_from}/{k}.npy").st_mtime_ns
           for k in search.ARRAYS}
  # A new process with the same files maps the saved index; building it again would raise.
  monkeypatch.setattr(shop, "_by_config", {})
  monkeypatch.setattr(shop, "_by_fingerprint", {})

  def no_build(*args, **kwargs):
    raise AssertionError("the index was built again")

  monkeypatch.setattr(search, "build_arrays", no_build)
  second = make_sandbox(**config)._index
  assert second is not first and second.loaded_from == first.loaded_from
  assert {k: os.stat(f"{second.loaded_from}/{k}.npy").st_mtime_ns
          for k in search.ARRAYS} == saved
  query = "large navy blue shampoo"
  np.testing.assert_array_equal(second.scores(query), first.scores(query))
  # Another goal source over the same products shares the index too.
  synthetic = make_sandbox(**config, human_goals=False)
  assert synthetic.catalogue.fingerprint != first_sandbox.catalogue.fingerprint
  assert synthetic._index.loaded_from == first.loaded_from


def test_released_config_errors(released, tmp_path):
  _, config = released
  with pytest.raises(ValueError, match="unknown WebShop catalogue 'huge'"):
    make_sandbox(**dict(config, data_size="huge"))
  with pytest.raises(ValueError, match="give data_dir or \\['products_path'\\], not both"):
    make_sandbox(**config, products_path="x.json")
  with pytest.raises(ValueError, match="'data_size' needs data_dir"):
    make_sandbox(data_size="full")
  with pytest.raises(ValueError, match="'index_cache_dir' needs products_path or data_dir"):
    make_sandbox(index_cache_dir=str(tmp_path))
  with pytest.raises(TaskInputError, match="WebShop data file .*items_.*No such file"):
    make_sandbox(data_dir=str(tmp_path), index_cache_dir=str(tmp_path))
