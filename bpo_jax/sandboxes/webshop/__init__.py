"""A WebShop-compatible shop (Yao et al., 2022) as a snapshot-able sandbox.

`make_sandbox(**config)` and `make_tasks(split, num, seed, **config)` are the entry points, and
`atomic_strings(**config)` names the product ids a from-scratch tokenizer keeps whole; see
`shop.py` for pages and actions, `reward.py` for the reward, `catalogue.py` for the data,
`released.py` for WebShop's released files, `search.py` and `index_cache.py` for the search
index, and `actions.py` for the action syntax a language model is told and the parser of its
replies.
"""

from bpo_jax.sandboxes.webshop.catalogue import (
    Catalogue, Product, WebShopTask, generate_catalogue, make_catalogue, split_goal_indices)
from bpo_jax.sandboxes.webshop.index_cache import cached_index, default_cache_dir
from bpo_jax.sandboxes.webshop.released import load_webshop_files, released_paths
from bpo_jax.sandboxes.webshop.reward import (
    PurchaseReward, TypeMatch, attribute_matches, normalize_color, option_matches,
    purchase_reward, title_nouns, type_reward)
from bpo_jax.sandboxes.webshop.search import ProductIndex
from bpo_jax.sandboxes.webshop.shop import (
    ShopState, WebShopSandbox, atomic_strings, get_shop, make_sandbox, make_tasks)
