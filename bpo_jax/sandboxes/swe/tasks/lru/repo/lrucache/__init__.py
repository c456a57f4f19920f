from lrucache.cache import LRUCache
from lrucache.memo import memoize
