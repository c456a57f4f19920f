"""Learning in the testbed: the library's estimators on grown trees, plain gradient steps, vmapped.

One iteration at parameters θ (the softmax table, float32[S, A]):

1. draw T tasks uniformly; grow each one's tree or group (`grow.grow`), with keys folded from
   the iteration's key by the tree's index;
2. score them by the estimator registered under the method's name
   (`training.estimator_registry`: BPO's sibling baselines and path weights with a zero trunk
   baseline, or RLOO, GRPO, GiGPO with 1/N per episode and their default conventions), γ = 1;
3. g = (1/T) Σ_trees Σ_i w_i A_i ∇_θ log π_θ(a_i | s_i), the "tree"-normalised policy-gradient
   objective's gradient (`losses.policy_loss`, one row per tree), taken by autodiff of the
   surrogate (1/T) Σ w_i A_i log π_θ(a_i | s_i) with w and A held fixed;
4. θ ← θ + lr · g (no clipping, no optimiser state).

`train` runs `iterations` of these under `lax.scan` and records the exact expected success J(θ)
(`worlds.expected_success`) before the first and after every update; `jax.vmap` over seeds.
`gradient_draws` gives `draws` independent iterations' g at one θ for the same tasks, for the
gradient's variance (claim 2).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from bpo_jax.testbed import grow
from bpo_jax.testbed import worlds
from bpo_jax.training import estimator_registry

METHODS = ("bpo", "grpo", "rloo", "gigpo")


@dataclasses.dataclass(frozen=True)
class Method:
  """An estimator by its registry name and the topology it is grown with."""
  name: str
  topology: grow.Topology

  def __post_init__(self):
    expected = estimator_registry.get(self.name).topology
    if expected != self.topology.kind:
      raise ValueError(f"estimator {self.name!r} needs a {expected!r} topology, got "
                       f"{self.topology.kind!r}")


def method(name: str, max_env_steps: int, **tree_rule) -> Method:
  """`name` at an env-step budget per task: BPO's trees with `tree_rule` (Topology's keys),
  or a group of as many whole episodes as fit."""
  kind = estimator_registry.get(name).topology
  return Method(name, grow.Topology(kind, max_env_steps, **(tree_rule if kind == "tree" else {})))


def initial_logits(world: worlds.ChainWorld) -> jax.Array:
  """The uniform policy."""
  return jnp.zeros((world.num_states, world.num_actions), jnp.float32)


def grow_batch(world, m: Method, logits, tasks, key) -> grow.Grown:
  """The trees (or groups) of one iteration, one per task, stacked."""
  def one(index, task):
    return grow.grow(world, m.topology, logits, task, grow.sampler(jax.random.fold_in(key, index)))
  return jax.vmap(one)(jnp.arange(tasks.shape[0]), tasks)


def coefficients(m: Method, grown: grow.Grown) -> jax.Array:
  """float32[T, C]: w_i · A_i per node, from the registry's advantage function."""
  advantages, weights = estimator_registry.get(m.name).advantages(grown.tree, gamma=1.0)
  return jnp.where(grown.tree.valid, advantages * weights, 0.0)


def policy_gradient(logits: jax.Array, grown: grow.Grown, coef: jax.Array) -> jax.Array:
  """g = ∇_θ (1/T) Σ_trees Σ_i c_i log π_θ(a_i | s_i), c held fixed (module docstring)."""
  def surrogate(theta):
    logp = jax.nn.log_softmax(theta, axis=-1)[grown.row, grown.action]
    return jnp.sum(jax.lax.stop_gradient(coef) * logp) / coef.shape[0]
  return jax.grad(surrogate)(logits)


def iteration_gradient(world, m: Method, logits, tasks, key) -> tuple[jax.Array, jax.Array]:
  """(g, mean env steps per tree) of one iteration on `tasks` with `key`."""
  grown = grow_batch(world, m, logits, tasks, key)
  steps = jnp.mean(jnp.sum(grown.tree.valid, axis=-1).astype(jnp.float32))
  return policy_gradient(logits, grown, coefficients(m, grown)), steps


def draw_tasks(world, key, num_tasks: int) -> jax.Array:
  return jax.random.randint(key, (num_tasks,), 0, world.num_tasks, jnp.int32)


def train(world, m: Method, key, *, iterations: int, tasks_per_iteration: int, lr: float):
  """One seed's run: (success float32[iterations + 1], env steps per tree float32[iterations],
  parameters float32[iterations + 1, S, A]). Iteration i uses fold_in(key, i)."""
  def body(logits, i):
    k_tasks, k_trees = jax.random.split(jax.random.fold_in(key, i))
    g, steps = iteration_gradient(world, m, logits, draw_tasks(world, k_tasks,
                                                               tasks_per_iteration), k_trees)
    new = logits + lr * g
    return new, (worlds.expected_success(new, world), steps, new)
  start = initial_logits(world)
  _, (success, steps, params) = jax.lax.scan(body, start, jnp.arange(1, iterations + 1))
  success = jnp.concatenate([worlds.expected_success(start, world)[None], success])
  return success, steps, jnp.concatenate([start[None], params])


@functools.partial(jax.jit, static_argnames=("m", "iterations", "tasks_per_iteration"))
def train_seeds(world, m: Method, keys, *, iterations: int, tasks_per_iteration: int, lr):
  """`train` vmapped over a batch of seed keys."""
  return jax.vmap(lambda k: train(world, m, k, iterations=iterations,
                                  tasks_per_iteration=tasks_per_iteration, lr=lr))(keys)


@functools.partial(jax.jit, static_argnames=("m", "draws", "tasks_per_iteration"))
def gradient_draws(world, m: Method, logits, key, *, draws: int, tasks_per_iteration: int):
  """float32[draws, S, A]: independent iterations' g at `logits` for one set of tasks (drawn
  from `key`), each draw's trees from its own key."""
  k_tasks, k_trees = jax.random.split(key)
  tasks = draw_tasks(world, k_tasks, tasks_per_iteration)
  return jax.vmap(lambda d: iteration_gradient(world, m, logits, tasks,
                                               jax.random.fold_in(k_trees, d))[0])(
      jnp.arange(draws))


@functools.partial(jax.jit, static_argnames=("m", "draws", "tasks_per_iteration"))
def gradient_moments(world, m: Method, logits, keys, *, draws: int, tasks_per_iteration: int):
  """Per seed (`logits` [seeds, S, A], `keys` [seeds]): (Σ_d ‖g_d − ḡ‖², ‖ḡ‖², and the first
  of these on the root state's row alone) over `draws` gradients of `gradient_draws`."""
  def one(theta, key):
    g = gradient_draws(world, m, theta, key, draws=draws, tasks_per_iteration=tasks_per_iteration)
    mean = g.mean(0)
    return jnp.sum((g - mean) ** 2), jnp.sum(mean**2), jnp.sum((g[:, 0] - mean[0]) ** 2)
  return jax.vmap(one)(logits, keys)
