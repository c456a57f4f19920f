"""Estimators by name: the one table the configuration, the rollout settings and the loop read.

An entry says how an estimator scores an iteration's trees (its advantage function over a
stacked batch) and what the rollout must grow for it (a tree with forks along the way, or a
group of independent episodes per task; whether states carry ids). `rollout.estimator` names an
entry; nothing else in the library branches on the name. Adding an estimator is one call:

  >>> from bpo_jax import estimators
  >>> register(Estimator("rloo_copy", with_path_weights(_core("rloo_advantages")),
  ...                    topology="group"))

after which `rollout.estimator = "rloo_copy"` validates and trains.

The table itself loads no JAX (the configuration reads it before any compute); the advantage
functions import it when they first run.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from bpo_jax import tree as tree_lib

# `rollout.TOPOLOGIES`, named here too so that the schema reads the table without the rollout.
TOPOLOGIES = ("tree", "group")

# (trees, *, gamma, trees_per_task, trunk, **options) -> (advantages [T, N], weights [T, N]).
AdvantageFn = Callable[..., tuple]


@dataclasses.dataclass(frozen=True)
class Estimator:
  """One estimator: its advantage function and what the rollout grows for it.

  Attributes:
    name: the value of `rollout.estimator` that selects it.
    advantages: `advantages(trees, *, gamma, trees_per_task, trunk)` -> `(advantages [T, N],
      weights [T, N])` of a stacked batch of T trees, zero on invalid nodes; traced under
      `jax.jit` (see `advantages_and_weights`). The trees come grouped by task in consecutive
      runs of `trees_per_task`; `trunk` is `rollout.trunk_baseline`.
    topology: "tree" (forks decided online within the per-tree budgets, `rollout.k` siblings
      per fork) or "group" (independent episodes per task, a fork at the root:
      `rollout.group_size` of them, or with 0 as many as fit `rollout.max_env_steps`).
    state_ids: how the rollout labels states (`RolloutConfig.state_ids`, checked there);
      "observation" for estimators that group identical states.
    trunk_baseline: whether it reads `rollout.trunk_baseline` (the baseline of a tree's steps
      before its first fork).
    options: `(keyword, key)` pairs: `advantages` takes `keyword=` the setting `rollout.<key>` (e.g.
      GRPO's `ddof` from `rollout.group_std_ddof`); see `config_options`.
  """

  name: str
  advantages: AdvantageFn
  topology: str
  state_ids: str = "none"
  trunk_baseline: bool = False
  options: tuple[tuple[str, str], ...] = ()

  def __post_init__(self):
    if self.topology not in TOPOLOGIES:
      raise ValueError(f"Estimator {self.name!r}: topology must be one of {TOPOLOGIES}, got "
                       f"{self.topology!r}")


# name -> Estimator, in the order of registration (the order error messages list them in).
ESTIMATORS: dict[str, Estimator] = {}


def register(estimator: Estimator) -> Estimator:
  """Adds `estimator` to the table; a name can be registered once."""
  if estimator.name in ESTIMATORS:
    raise ValueError(f"an estimator named {estimator.name!r} is already registered")
  ESTIMATORS[estimator.name] = estimator
  return estimator


def names() -> tuple[str, ...]:
  """The registered estimators' names, in the order of registration."""
  return tuple(ESTIMATORS)


def get(name: str) -> Estimator:
  """The entry registered as `name`."""
  if name not in ESTIMATORS:
    raise ValueError(f"unknown estimator {name!r}; registered: {', '.join(names())}")
  return ESTIMATORS[name]


def with_path_weights(per_tree: Callable) -> AdvantageFn:
  """An `advantages` function from a per-tree one, `per_tree(tree, gamma=..., **options) -> [N]`.

  It is vmapped over the trees, and each node takes its path weight: 1/N per episode of a
  group of N (the weights of a star), so that every estimator averages over its episodes in the
  same "per tree" normalisation. `trees_per_task` and `trunk` are not read; `options` (the
  entry's `Estimator.options`) go to `per_tree`.
  """

  def advantages(trees: tree_lib.RolloutTree, *, gamma: float, trees_per_task: int = 1,
                 trunk: str = "zero", **options):
    del trees_per_task, trunk
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from bpo_jax import estimators  # pylint: disable=g-import-not-at-top
    values = jax.vmap(lambda t: per_tree(t, gamma=gamma, **options))(trees)
    weights = jax.vmap(estimators.path_weights)(trees)
    return values, jnp.where(trees.valid, weights, 0.0)

  return advantages


def _core(name: str) -> Callable:
  """`bpo_jax.estimators.<name>`, imported when first called."""

  def call(*args, **kwargs):
    from bpo_jax import estimators  # pylint: disable=g-import-not-at-top
    return getattr(estimators, name)(*args, **kwargs)

  call.__name__ = call.__qualname__ = name
  return call


def bpo_batch_advantages(trees: tree_lib.RolloutTree, *, gamma: float, trees_per_task: int = 1,
                         trunk: str = "zero"):
  """BPO's sibling baselines and path weights, with a trunk baseline from the other trees.

  The trunk (the steps before a tree's first fork) takes a baseline that does not depend on the
  tree's own actions: `trunk="zero"`; `"loo"`, the mean root value of the other trees of its
  task; or `"batch"`, the mean root value of every other tree in the batch (other tasks
  included: they are sampled independently of this tree, so the estimate stays unbiased, and
  with tasks of similar difficulty it removes most of the trunk's return variance).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bpo_jax import estimators  # pylint: disable=g-import-not-at-top
  if trunk == "zero":
    baseline = jnp.zeros(trees.parent.shape[:1], jnp.float32)
  else:
    root = jax.vmap(lambda t: estimators.root_value(t, gamma))(trees)
    groups = root.reshape(-1, trees_per_task) if trunk == "loo" else root[None]
    baseline = jax.vmap(estimators.leave_one_out_trunk_baselines)(groups).reshape(-1)
  out = jax.vmap(lambda t, b: estimators.bpo_advantages(t, gamma=gamma, trunk_baseline=b))(
      trees, baseline)
  return out.advantages, out.weights


# The estimators of docs/DESIGN.md §3. GRPO: Shao et al. 2024; RLOO: Ahmadian et al. 2024;
# GiGPO: Feng et al. 2025 (its step-level groups need the states' ids).
register(Estimator("bpo", bpo_batch_advantages, topology="tree", trunk_baseline=True))
register(Estimator("rloo", with_path_weights(_core("rloo_advantages")), topology="group"))
# GRPO's and GiGPO's conventions (std ddof and eps, normalisation, GiGPO's ω and step discount)
# are config keys: docs/DESIGN.md §3 says which settings match which paper and reference code.
_GROUP_STD = (("normalize_std", "group_normalize_std"), ("ddof", "group_std_ddof"),
              ("eps", "group_std_eps"))
register(Estimator("grpo", with_path_weights(_core("grpo_advantages")), topology="group",
                   options=_GROUP_STD))
register(Estimator("gigpo", with_path_weights(_core("gigpo_advantages")), topology="group",
                   state_ids="observation",
                   options=_GROUP_STD + (("step_weight", "gigpo_step_weight"),
                                         ("step_gamma", "gigpo_step_gamma"))))


def config_options(rollout) -> tuple[tuple[str, object], ...]:
  """The `options` argument of `advantages_and_weights` for the estimator of `rollout` (the
  `rollout` section of a run's `Settings`): its `(keyword, value)` pairs read from that section
  (hashable, for `jax.jit`).

  Example: GRPO with the defaults → (("normalize_std", True), ("ddof", 0), ("eps", 1e-6)).
  """
  return tuple((keyword, getattr(rollout, key)) for keyword, key in get(rollout.estimator).options)


def _advantages_and_weights(trees: tree_lib.RolloutTree, *, estimator: str, gamma: float,
                            trees_per_task: int = 1, trunk: str = "zero",
                            options: tuple[tuple[str, object], ...] = ()):
  """Per-node advantages and path weights of a stacked batch of trees, by the named estimator
  (`options`: its keyword settings, `config_options`).

  Returns:
    (advantages [T, N], weights [T, N]), zero on invalid nodes.
  """
  return get(estimator).advantages(trees, gamma=gamma, trees_per_task=trees_per_task,
                                   trunk=trunk, **dict(options))


@functools.cache
def _jitted_advantages_and_weights():
  import jax  # pylint: disable=g-import-not-at-top

  def advantages_and_weights(trees, *, estimator, gamma, trees_per_task=1, trunk="zero",
                             options=()):  # the name its programs compile under
    return _advantages_and_weights(trees, estimator=estimator, gamma=gamma,
                                   trees_per_task=trees_per_task, trunk=trunk, options=options)

  return jax.jit(advantages_and_weights,
                 static_argnames=("estimator", "gamma", "trees_per_task", "trunk", "options"))


def __getattr__(name):
  # `advantages_and_weights`: `_advantages_and_weights` under `jax.jit` (all but `trees`
  # static), made on first use (PEP 562) so that reading the table loads no JAX.
  if name == "advantages_and_weights":
    return _jitted_advantages_and_weights()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
