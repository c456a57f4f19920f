"""Small tabular MDPs with exact enumeration of every tree a sampler can grow.

The MDP is a deterministic tree of action histories: a state at depth t is the sequence of t
actions taken so far, the episode ends after `horizon` steps, rewards r(s, a) are a table, and the
policy is a softmax over a logits table θ[s, a]. With γ = 1 the objective is
J(θ) = E[Σ_t r(s_t, a_t)], computed exactly by backward induction, and its gradient by autodiff:
the reference every estimator's expectation is compared against.

Samplers, enumerated exactly (each yields every tree with its probability):
  * `enumerate_online_trees`: BPO with the online rule: fork K ways at s when entropy(s) >
    threshold and fewer than `max_forks` forks were used so far (depth-first growth);
  * `enumerate_topk_trees`: a backbone first, then K − 1 alternatives at its k highest-entropy
    states (the after-the-fact rule);
  * `enumerate_independent`: K independent episodes from the root (RLOO/GRPO).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import branching
from bpo_jax import estimators
from bpo_jax.tree import RolloutTree, TreeBuilder, stack_trees


@dataclasses.dataclass(frozen=True)
class TabularMDP:
  """A deterministic MDP whose states are action histories (see module docstring)."""
  num_actions: int
  horizon: int
  logits: np.ndarray  # float64[S, A]
  rewards: np.ndarray  # float64[S, A]

  @property
  def num_states(self) -> int:
    return self.logits.shape[0]

  def state_offset(self, depth: int) -> int:
    return sum(self.num_actions**d for d in range(depth))

  def next_state(self, state: int, action: int, depth: int) -> int:
    """Index of the state reached from `state` (at `depth`) by `action`."""
    local = state - self.state_offset(depth)
    return self.state_offset(depth + 1) + local * self.num_actions + action

  def policy(self) -> np.ndarray:
    z = self.logits - self.logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)

  def entropy(self) -> np.ndarray:
    p = self.policy()
    return -(p * np.log(p)).sum(axis=1)


def make_mdp(seed: int = 0, num_actions: int = 2, horizon: int = 3,
             root_logits: tuple[float, ...] | None = None, logit_scale: float = 1.0,
             reward_scale: float = 1.0) -> TabularMDP:
  """A random MDP: logits ~ N(0, logit_scale²), rewards ~ N(0, 1)·reward_scale at every step,
  plus a larger final reward so that forks matter. `root_logits` makes the first step confident.
  """
  rng = np.random.default_rng(seed)
  num_states = sum(num_actions**d for d in range(horizon))
  logits = rng.normal(size=(num_states, num_actions)) * logit_scale
  if root_logits is not None:
    logits[0] = np.asarray(root_logits, float)
  rewards = rng.normal(size=(num_states, num_actions)) * 0.3 * reward_scale
  last = sum(num_actions**d for d in range(horizon - 1))
  rewards[last:] += rng.normal(size=(num_states - last, num_actions)) * 2.0 * reward_scale
  return TabularMDP(num_actions, horizon, logits, rewards)


def expected_return(logits: jax.Array, mdp: TabularMDP) -> jax.Array:
  """J(θ) = E[Σ_t r(s_t, a_t)] by backward induction (γ = 1), differentiable in the logits."""
  pi = jax.nn.softmax(logits, axis=-1)
  rewards = jnp.asarray(mdp.rewards, logits.dtype)
  a = mdp.num_actions
  value_next = jnp.zeros((a**mdp.horizon,), logits.dtype)
  for depth in reversed(range(mdp.horizon)):
    lo, hi = mdp.state_offset(depth), mdp.state_offset(depth + 1)
    q = rewards[lo:hi] + value_next.reshape(hi - lo, a)
    value_next = jnp.sum(pi[lo:hi] * q, axis=-1)
  return value_next[0]


def true_gradient(mdp: TabularMDP) -> np.ndarray:
  """∇_θ J, float64 NumPy [S, A] (autodiff of `expected_return` in float32, then cast)."""
  return np.asarray(jax.grad(expected_return)(jnp.asarray(mdp.logits, jnp.float32), mdp),
                    np.float64)


def state_values(mdp: TabularMDP) -> np.ndarray:
  """V(s) for every state (float64), by backward induction."""
  pi = mdp.policy()
  values = np.zeros(mdp.num_states + mdp.num_actions**mdp.horizon)
  for depth in reversed(range(mdp.horizon)):
    for s in range(mdp.state_offset(depth), mdp.state_offset(depth + 1)):
      nxt = [mdp.next_state(s, a, depth) for a in range(mdp.num_actions)]
      values[s] = sum(pi[s, a] * (mdp.rewards[s, a] + (values[nxt[a]] if depth + 1 <
                                                          mdp.horizon else 0.0))
                      for a in range(mdp.num_actions))
  return values[:mdp.num_states]


# A node of an enumerated tree: (parent, state, action, reward, depth).
Node = tuple[int, int, int, float, int]


@dataclasses.dataclass(frozen=True)
class Outcome:
  probability: float
  nodes: tuple[Node, ...]


def enumerate_online_trees(mdp: TabularMDP, *, threshold: float, fork_k: int,
                           max_forks: int, root_k: int | None = None) -> list[Outcome]:
  """Every tree of BPO's online rule with its probability (depth-first growth: a node's first
  child's subtree is grown before its second child is sampled); a fork at the root state takes
  `root_k` siblings (None: `fork_k`)."""
  pi = mdp.policy()
  entropy = mdp.entropy()
  out: list[Outcome] = []

  def grow(nodes, prob, forks_used, stack):
    if not stack:
      out.append(Outcome(prob, tuple(nodes)))
      return
    kind, state, parent, depth = stack[-1]
    rest = stack[:-1]
    if kind == "expand":
      fork = bool(branching.online_fork_decision(entropy[state], threshold, forks_used,
                                                 max_forks))
      k = (root_k if depth == 0 and root_k else fork_k) if fork else 1
      grow(nodes, prob, forks_used + int(fork), rest + (("child", state, parent, depth),) * k)
      return
    for action in range(mdp.num_actions):
      node = (parent, state, action, float(mdp.rewards[state, action]), depth)
      index = len(nodes)
      new_stack = rest
      if depth + 1 < mdp.horizon:
        new_stack = rest + (("expand", mdp.next_state(state, action, depth), index, depth + 1),)
      grow(nodes + [node], prob * pi[state, action], forks_used, new_stack)

  grow([], 1.0, 0, (("expand", 0, -1, 0),))
  return out


def _paths_from(mdp: TabularMDP, state: int, depth: int) -> Iterator[tuple[float, list]]:
  """Every action sequence from `state` to the end: (probability, [(state, action, reward)])."""
  pi = mdp.policy()
  if depth == mdp.horizon:
    yield 1.0, []
    return
  for action in range(mdp.num_actions):
    step = (state, action, float(mdp.rewards[state, action]))
    if depth + 1 == mdp.horizon:
      yield pi[state, action], [step]
      continue
    for p, rest in _paths_from(mdp, mdp.next_state(state, action, depth), depth + 1):
      yield pi[state, action] * p, [step] + rest


def return_variance_from(mdp: TabularMDP, state: int, depth: int) -> float:
  """Var of the return-to-go from `state` at `depth` under the policy (exact, float64)."""
  paths = list(_paths_from(mdp, state, depth))
  p = np.array([q for q, _ in paths])
  g = np.array([sum(r for _, _, r in steps) for _, steps in paths])
  return float(p @ g**2 - (p @ g) ** 2)


def _chain(nodes: list, parent: int, depth: int, steps: list) -> None:
  for state, action, reward in steps:
    nodes.append((parent, state, action, reward, depth))
    parent, depth = len(nodes) - 1, depth + 1


def enumerate_topk_trees(mdp: TabularMDP, *, k: int, fork_k: int) -> list[Outcome]:
  """Every tree of the after-the-fact rule: a full backbone, then fork_k − 1 alternative
  episodes (no further forks) at each of its k highest-entropy states."""
  entropy = mdp.entropy()
  out = []
  for p_backbone, backbone in _paths_from(mdp, 0, 0):
    nodes: list = []
    _chain(nodes, -1, 0, backbone)
    ent = jnp.asarray([entropy[s] for s, _, _ in backbone], jnp.float32)
    chosen = [int(i) for i in branching.top_k_fork_steps(ent, jnp.ones_like(ent, bool), k)]
    alternatives = []
    for t in sorted(chosen):
      alternatives += [(t, backbone[t][0])] * (fork_k - 1)
    options = [list(_paths_from(mdp, s, t)) for t, s in alternatives]
    for combo in itertools.product(*options):
      tree_nodes = list(nodes)
      prob = p_backbone
      for (t, _), (p, steps) in zip(alternatives, combo):
        prob *= p
        _chain(tree_nodes, t - 1, t, steps)  # node t − 1 of the backbone is at index t − 1.
      out.append(Outcome(prob, tuple(tree_nodes)))
  return out


def enumerate_independent(mdp: TabularMDP, num_episodes: int) -> list[Outcome]:
  """Every star tree of `num_episodes` independent episodes from the root."""
  paths = list(_paths_from(mdp, 0, 0))
  out = []
  for combo in itertools.product(paths, repeat=num_episodes):
    nodes: list = []
    prob = 1.0
    for p, steps in combo:
      prob *= p
      _chain(nodes, -1, 0, steps)
    out.append(Outcome(prob, tuple(nodes)))
  return out


def enumerate_sibling_fork(mdp: TabularMDP, fork_depth: int, num_siblings: int) -> list[Outcome]:
  """Every tree made of a policy prefix to depth t, then K sibling episodes from s_t."""
  out = []
  for p_prefix, prefix in prefixes(mdp, fork_depth):
    nodes: list = []
    _chain(nodes, -1, 0, prefix)
    state = state_after(mdp, prefix)
    paths = list(_paths_from(mdp, state, fork_depth))
    for combo in itertools.product(paths, repeat=num_siblings):
      tree_nodes = list(nodes)
      prob = p_prefix
      for p, steps in combo:
        prob *= p
        _chain(tree_nodes, fork_depth - 1, fork_depth, steps)
      out.append(Outcome(prob, tuple(tree_nodes)))
  return out


def prefixes(mdp: TabularMDP, length: int) -> Iterator[tuple[float, list]]:
  """Every action sequence of `length` steps from the root with its probability."""
  pi = mdp.policy()
  seqs = [(1.0, [], 0)]
  for depth in range(length):
    seqs = [(p * pi[s, a], steps + [(s, a, float(mdp.rewards[s, a]))],
             mdp.next_state(s, a, depth))
            for p, steps, s in seqs for a in range(mdp.num_actions)]
  for p, steps, _ in seqs:
    yield p, steps


def state_after(mdp: TabularMDP, steps: list) -> int:
  state = 0
  for depth, (s, a, _) in enumerate(steps):
    state = mdp.next_state(s, a, depth)
  return state


@dataclasses.dataclass(frozen=True)
class OutcomeBatch:
  """Enumerated trees as a stacked RolloutTree plus what the gradient needs."""
  probability: np.ndarray  # float64[B]
  trees: RolloutTree  # stacked, capacity N
  state: np.ndarray  # int32[B, N]
  action: np.ndarray  # int32[B, N]


def to_batch(outcomes: list[Outcome], mdp: TabularMDP, capacity: int | None = None
             ) -> OutcomeBatch:
  """Stacks enumerated outcomes into padded RolloutTrees (leaves terminal, entropy filled)."""
  capacity = capacity or max(len(o.nodes) for o in outcomes)
  entropy = mdp.entropy()
  trees, states, actions = [], np.zeros((len(outcomes), capacity), np.int32), None
  actions = np.zeros((len(outcomes), capacity), np.int32)
  for b, outcome in enumerate(outcomes):
    builder = TreeBuilder(capacity)
    for i, (parent, state, action, reward, depth) in enumerate(outcome.nodes):
      builder.add(parent, entropy=float(entropy[state]), state_id=state)
      states[b, i], actions[b, i] = state, action
    for i, (_, _, _, reward, depth) in enumerate(outcome.nodes):
      builder.set_outcome(i, reward, terminal=depth + 1 == mdp.horizon)
    trees.append(builder.build())
  return OutcomeBatch(np.array([o.probability for o in outcomes]), stack_trees(trees), states,
                      actions)


def tree_gradients(batch: OutcomeBatch, mdp: TabularMDP, coefficients: np.ndarray) -> np.ndarray:
  """float64[B, S, A]: Σ_i c_i ∇_θ log π(a_i | s_i) per tree, for per-node coefficients c (0 at
  invalid nodes). For the softmax table, ∇_θ log π(a|s) is (onehot(a) − π(·|s)) on row s."""
  pi = mdp.policy()
  b, n = batch.state.shape
  c = np.asarray(coefficients, np.float64) * np.asarray(batch.trees.valid, np.float64)
  score = -pi[batch.state]  # [B, N, A]
  np.put_along_axis(score, batch.action[..., None],
                    np.take_along_axis(score, batch.action[..., None], -1) + 1.0, -1)
  grads = np.zeros((b, mdp.num_states, mdp.num_actions))
  rows = np.broadcast_to(np.arange(b)[:, None], (b, n))
  np.add.at(grads, (rows, batch.state), c[..., None] * score)
  return grads


_bpo_batch = jax.jit(jax.vmap(lambda tree, trunk: estimators.bpo_advantages(
    tree, trunk_baseline=trunk)))
_root_values = jax.jit(jax.vmap(estimators.root_value))


def bpo_tree_gradients(batch: OutcomeBatch, mdp: TabularMDP,
                       trunk_baseline: np.ndarray | float = 0.0) -> np.ndarray:
  """float64[B, S, A]: each tree's BPO gradient Σ_i w_i A_i ∇log π(a_i|s_i) (γ = 1)."""
  b = batch.probability.shape[0]
  trunk = jnp.broadcast_to(jnp.asarray(trunk_baseline, jnp.float32), (b,))
  out = _bpo_batch(jax.tree_util.tree_map(jnp.asarray, batch.trees), trunk)
  coef = np.asarray(out.weights, np.float64) * np.asarray(out.advantages, np.float64)
  return tree_gradients(batch, mdp, coef)


def root_values(batch: OutcomeBatch) -> np.ndarray:
  return np.asarray(_root_values(jax.tree_util.tree_map(jnp.asarray, batch.trees)), np.float64)


def pair_batch(batch: OutcomeBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """All ordered pairs (i, j) of outcomes: probabilities p_i p_j and the two index arrays."""
  b = batch.probability.shape[0]
  i, j = np.meshgrid(np.arange(b), np.arange(b), indexing="ij")
  i, j = i.reshape(-1), j.reshape(-1)
  return batch.probability[i] * batch.probability[j], i, j


def select(batch: OutcomeBatch, index: np.ndarray) -> OutcomeBatch:
  return OutcomeBatch(batch.probability[index],
                      jax.tree_util.tree_map(lambda x: np.asarray(x)[index], batch.trees),
                      batch.state[index], batch.action[index])


def bpo_gradient_moments(batch: OutcomeBatch, mdp: TabularMDP, trunk: str,
                         num_trees: int = 2) -> tuple[np.ndarray, float]:
  """Exact mean [S, A] and total variance (trace of the covariance) of the BPO gradient averaged
  over `num_trees` independent trees of one task (num_trees = 2 for trunk "loo", 1 or 2 for
  "zero"). trunk: "zero" or "loo" (each tree's trunk baseline is the other tree's root value).
  """
  if trunk not in ("zero", "loo"):
    raise ValueError(f"trunk must be 'zero' or 'loo', got {trunk!r}")
  if num_trees == 1:
    if trunk == "loo":
      raise ValueError("a leave-one-out trunk baseline needs num_trees >= 2")
    g = bpo_tree_gradients(batch, mdp, 0.0)
    p = batch.probability
  elif num_trees == 2:
    p, i, j = pair_batch(batch)
    if trunk == "loo":
      v = root_values(batch)
      g_i = bpo_tree_gradients(select(batch, i), mdp, v[j])
      g_j = bpo_tree_gradients(select(batch, j), mdp, v[i])
    else:
      g0 = bpo_tree_gradients(batch, mdp, 0.0)
      g_i, g_j = g0[i], g0[j]
    g = 0.5 * (g_i + g_j)
  else:
    raise ValueError(f"num_trees must be 1 or 2, got {num_trees}")
  return _moments(p, g)


def _moments(p: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, float]:
  mean = np.tensordot(p, g, axes=1)
  second = float(np.dot(p, (g**2).reshape(len(p), -1).sum(-1)))
  return mean, second - float((mean**2).sum())


_rloo_batch = jax.jit(jax.vmap(lambda tree: estimators.rloo_advantages(tree)))


def rloo_gradient_moments(mdp: TabularMDP, num_episodes: int) -> tuple[np.ndarray, float]:
  """Exact mean and total variance of the RLOO gradient (1/K) Σ_j A_j Σ_t ∇log π over K episodes,
  the same per-path normalisation as BPO's weights (each episode has weight 1/K)."""
  batch = to_batch(enumerate_independent(mdp, num_episodes), mdp)
  adv = np.asarray(_rloo_batch(jax.tree_util.tree_map(jnp.asarray, batch.trees)), np.float64)
  return _moments(batch.probability, tree_gradients(batch, mdp, adv / num_episodes))


def expected_size(batch: OutcomeBatch) -> tuple[float, float]:
  """Expected (leaves, env steps) of one tree."""
  trees = jax.tree_util.tree_map(jnp.asarray, batch.trees)
  leaves = np.asarray(jax.vmap(estimators.leaf_mask)(trees)).sum(-1)
  steps = np.asarray(batch.trees.valid).sum(-1)
  return float(batch.probability @ leaves), float(batch.probability @ steps)


def sample_online_tree(mdp: TabularMDP, rng: np.random.Generator, *, threshold: float,
                       fork_k: int, max_forks: int) -> Outcome:
  """One tree grown by the online rule (the sampler `enumerate_online_trees` enumerates)."""
  pi = mdp.policy()
  entropy = mdp.entropy()
  nodes: list = []
  prob = 1.0
  forks_used = 0
  stack = [("expand", 0, -1, 0)]
  while stack:
    kind, state, parent, depth = stack.pop()
    if kind == "expand":
      fork = bool(branching.online_fork_decision(entropy[state], threshold, forks_used,
                                                 max_forks))
      forks_used += int(fork)
      stack += [("child", state, parent, depth)] * (fork_k if fork else 1)
      continue
    action = int(rng.choice(mdp.num_actions, p=pi[state]))
    prob *= pi[state, action]
    nodes.append((parent, state, action, float(mdp.rewards[state, action]), depth))
    if depth + 1 < mdp.horizon:
      stack.append(("expand", mdp.next_state(state, action, depth), len(nodes) - 1, depth + 1))
  return Outcome(prob, tuple(nodes))


MAX_ENUMERATED_GROUPS = 300_000


def variance_table(mdp: TabularMDP, *, threshold: float, fork_k: int, max_forks: int,
                   max_groups: int = MAX_ENUMERATED_GROUPS) -> list[dict]:
  """Exact total gradient variance (trace of the covariance) of BPO and RLOO, each unbiased.

  Rows: BPO with one tree and a zero trunk baseline; BPO with two trees of the task and a zero or
  a leave-one-out-across-trees trunk baseline; RLOO matched to each BPO row at equal expected
  leaves and at equal expected env steps (rounded to a whole number of episodes ≥ 2).
  Each row: name, trees/episodes, expected leaves and env steps, variance, and for RLOO the
  ratio var(BPO row) / var(RLOO). RLOO groups with more than `max_groups` outcomes are skipped.
  """
  batch = to_batch(enumerate_online_trees(mdp, threshold=threshold, fork_k=fork_k,
                                          max_forks=max_forks), mdp)
  leaves, steps = expected_size(batch)
  rows = []
  for num_trees, trunk in ((1, "zero"), (2, "zero"), (2, "loo")):
    _, var = bpo_gradient_moments(batch, mdp, trunk, num_trees)
    bpo_row = dict(name=f"BPO {num_trees} tree(s), {trunk} trunk", groups=num_trees,
                   leaves=num_trees * leaves, env_steps=num_trees * steps, variance=var)
    rows.append(bpo_row)
    for matched, k in (("leaves", branching.matched_group_size(num_trees * leaves)),
                       ("env steps", branching.matched_group_size(num_trees * steps,
                                                                  mdp.horizon))):
      if (mdp.num_actions**mdp.horizon)**k > max_groups:
        rows.append(dict(name=f"  RLOO K={k} (equal {matched}): not enumerated",
                         groups=k, leaves=k, env_steps=k * mdp.horizon, variance=float("nan"),
                         ratio=float("nan")))
        continue
      _, rvar = rloo_gradient_moments(mdp, k)
      rows.append(dict(name=f"  RLOO K={k} (equal {matched})", groups=k, leaves=k,
                       env_steps=k * mdp.horizon, variance=rvar, ratio=var / rvar))
  return rows


def root_siblings_table(mdp: TabularMDP, *, leaves: int = 4,
                        max_groups: int = MAX_ENUMERATED_GROUPS) -> list[dict]:
  """Exact total gradient variance of BPO trees of `leaves` leaves that fork at every state
  (threshold 0, zero trunk baseline) with K' = 2..`leaves` siblings at the root and K = 2 below,
  then of RLOO with N = 2.. episodes (groups of more than `max_groups` outcomes skipped).

  A tree spends fewer env steps the more of its leaves fork below the root (they share the
  prefix), so each row also gives variance × env steps: the variance of an average of such
  trees or groups over a fixed env-step budget (lower is better).
  """
  rows = []
  for root_k in range(2, leaves + 1):
    outcomes = enumerate_online_trees(mdp, threshold=0.0, fork_k=2,
                                      max_forks=1 + leaves - root_k, root_k=root_k)
    batch = to_batch(outcomes, mdp)
    tree_leaves, steps = expected_size(batch)
    _, var = bpo_gradient_moments(batch, mdp, "zero", 1)
    rows.append(dict(name=f"BPO K'={root_k} at the root, K=2 below", leaves=tree_leaves,
                     env_steps=steps, variance=var, per_step=var * steps))
  for n in range(2, leaves + 2):
    if (mdp.num_actions**mdp.horizon)**n > max_groups:
      break
    _, var = rloo_gradient_moments(mdp, n)
    steps = n * mdp.horizon
    rows.append(dict(name=f"RLOO N={n}", leaves=n, env_steps=steps, variance=var,
                     per_step=var * steps))
  return rows


def format_variance_table(rows: list[dict], last: str = "ratio",
                          header: str = "BPO/RLOO") -> str:
  """`rows` as text: name, leaves, env steps, variance and the column `last` (`header`)."""
  lines = [f"{'estimator':<40} {'leaves':>7} {'steps':>7} {'Var total':>10} {header:>9}"]
  for r in rows:
    extra = f"{r[last]:.3f}" if last in r else ""
    lines.append(f"{r['name']:<40} {r['leaves']:>7.2f} {r['env_steps']:>7.2f} "
                 f"{r['variance']:>10.4f} {extra:>9}")
  return "\n".join(lines)
