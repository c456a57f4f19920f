"""Memoisation with a bounded LRU cache."""
import functools

from lrucache.cache import LRUCache

_MISSING = object()


def memoize(capacity):
    def wrap(fn):
        cache = LRUCache(capacity)

        @functools.wraps(fn)
        def inner(*args):
            value = cache.get(args, _MISSING)
            if value is _MISSING:
                value = fn(*args)
                cache.put(args, value)
            return value

        inner.cache = cache
        return inner
    return wrap
