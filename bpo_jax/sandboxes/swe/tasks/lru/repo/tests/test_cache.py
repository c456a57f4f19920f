import pytest

from lrucache import LRUCache


def test_evicts_oldest_insert():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache and len(cache) == 2


def test_put_refreshes():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10 and "b" not in cache


def test_counts_hits():
    cache = LRUCache(1)
    cache.put(1, 1)
    cache.get(1)
    cache.get(2)
    assert (cache.hits, cache.misses) == (1, 1)


def test_bad_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)
