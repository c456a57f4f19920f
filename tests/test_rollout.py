"""The rollout engine on the built-in rooms world with a tiny random policy.

Every tree is checked against independent recomputations: a full forward pass of each leaf path
(the forked KV caches must give the recorded logprobs and entropies), a replay of each path in a
fresh sandbox (restored siblings must see exactly what the backbone saw), an audit of every fork
decision against the rule, and exact token and step accounting.
"""

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bpo_jax import branching
from bpo_jax import estimators
from bpo_jax import packing
from bpo_jax import rollout
from bpo_jax import sampling
from bpo_jax import text
from bpo_jax import tree as tree_lib
from bpo_jax.models import Decoder
from bpo_jax.models import forward
from bpo_jax.models import ModelConfig
from bpo_jax.models import token_logprobs_and_entropy
from bpo_jax.sandboxes import base
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import rooms
from bpo_jax.testing.model_rounding import forward_roundings
from bpo_jax.testing.tolerance import assert_close, ulp_tol

SANDBOX_MAX_STEPS = 5
# One shape family for every test, so the decode loop and the appends compile once per bucket.
COMMON = dict(max_turns=6, max_action_tokens=6, max_length=384, batch_buckets=(4, 8, 16),
              temperature=1.0, k=4, group_size=8, entropy_threshold=1.0, fork_probability=0.25,
              max_leaves=16, max_env_steps=None, max_tree_tokens=None)
PATH_LENGTH = 384


@pytest.fixture(scope="module")
def fmt(tmp_path_factory):
  """The chat format of a BPE tokenizer trained on rooms' text (as a run trains it)."""
  tasks = rooms.make_tasks("train", num=16, seed=0, difficulty=1)
  return text.build_text("rooms", str(tmp_path_factory.mktemp("rooms_text")), tasks,
                         env_options={"difficulty": 1}, max_observation_tokens=40)[1]


@pytest.fixture(scope="module")
def policy(fmt):
  """A tiny random decoder whose next-token entropy depends on the context.

  The action cue's embedding is zero, so the distribution after it comes from attention over the
  observation rather than from the cue token alone, and the entropy varies from state to state.
  """
  config = ModelConfig.tiny(vocab_size=fmt.vocab_size, hidden_size=32,
                            intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16,
                            tie_word_embeddings=False)
  model = Decoder(config, rngs=nnx.Rngs(0))
  cue = fmt.prompt_tokens("x")[-1]  # the generation prompt's last token
  model.embed[...] = (model.embed[...] * 20.0).at[cue].set(0.0)
  model.lm_head[...] = model.lm_head[...] * 10.0
  graphdef, params = nnx.split(model)
  return config, graphdef, params


def in_process_pool():
  return pool_lib.SandboxPool.for_environment("rooms", num_workers=0,
                                              max_steps=SANDBOX_MAX_STEPS)


def grow(policy, fmt, pool, tasks, seed=0, threshold=None, task_ids=None, **overrides):
  config, graphdef, params = policy
  rollout_config = rollout.RolloutConfig(**{**COMMON, **overrides})
  engine = rollout.RolloutEngine(graphdef, config, fmt, pool, rollout_config)
  return engine.rollout(params, tasks, jax.random.key(seed), threshold=threshold,
                        task_ids=task_ids)


@functools.lru_cache(maxsize=None)
def _path_forward(graphdef):
  return jax.jit(functools.partial(token_logprobs_and_entropy, graphdef))


def check_against_full_forward(policy, result: rollout.TaskRollout):
  """Every leaf path, run from scratch without a cache, gives the recorded numbers."""
  _, graphdef, params = policy
  paths = [result.path(leaf) for leaf in result.leaves()]
  rows, action_at, state_at = [], [], []
  for path in paths:
    seq = list(result.tokens.prompt)
    actions, states = [], []
    for node in path:
      states.append((node, len(seq) - 1))  # the position whose logits choose the action
      for k in range(len(result.tokens.action_tokens[node])):
        actions.append((node, k, len(seq) + k - 1))
      seq += list(result.tokens.segment(node))
    rows.append(seq)
    action_at.append(actions)
    state_at.append(states)
  tokens = np.zeros((len(rows), PATH_LENGTH), np.int32)
  for b, seq in enumerate(rows):
    tokens[b, :len(seq)] = seq
  targets = np.concatenate([tokens[:, 1:], np.zeros((len(rows), 1), np.int32)], axis=1)
  logprobs, entropy = _path_forward(graphdef)(params, jnp.asarray(tokens), jnp.asarray(targets))
  logprobs, entropy = np.asarray(logprobs), np.asarray(entropy)
  # The cached forward and this one round differently along a forward, at the magnitude of
  # the logits the logprobs and entropies come from (this policy's are scaled up).
  logits = np.asarray(_logits_forward(graphdef)(params, jnp.asarray(tokens))[0])
  steps = forward_roundings(policy[0], PATH_LENGTH, logprobs=True)
  checked = 0
  for b, seq in enumerate(rows):
    tol = ulp_tol(np.float32, np.abs(logits[b, :len(seq)]).max(), steps)
    for node, position in state_at[b]:
      np.testing.assert_allclose(result.tree.entropy[node], entropy[b, position], atol=tol,
                                 rtol=0, err_msg=f"entropy at the state of node {node}")
    for node, k, position in action_at[b]:
      np.testing.assert_allclose(result.tokens.action_logprobs[node][k], logprobs[b, position],
                                 atol=tol, rtol=0, err_msg=f"logprob of token {k} of node {node}")
      checked += 1
  assert checked > 0


def replay_checks(result: rollout.TaskRollout, snapshot_state_ids=False):
  """Replays every valid node's path in a fresh sandbox: observations, rewards and flags match,
  and the state each fork was taken at (snapshot digest) is the state the path leads to."""
  tree = result.tree
  sandbox = rooms.make_sandbox(max_steps=SANDBOX_MAX_STEPS)
  digest_at = {rollout.ROOT: None}
  state_id_at = {}
  assert sandbox.reset(result.task) == result.first_observation
  digest_at[rollout.ROOT] = rollout.state_ids._digest(sandbox.snapshot().data)
  state_id_at[rollout.ROOT] = rollout.text_state_id(sandbox.snapshot().data)
  alive = result.tokens.alive()
  for node in range(result.num_nodes):
    if not alive[node]:
      continue
    path = result.path(node)
    steps = base.replay(sandbox, rooms_snapshot_after_reset(result.task),
                        [result.action_texts[i] for i in path])
    assert len(steps) == len(path)
    step = steps[-1]
    assert step.observation == result.observation_texts[node]
    assert step.reward == tree.reward[node]
    assert bool(step.done) == bool(tree.terminal[node])
    if step.truncated:
      assert tree.truncated[node]
    elif tree.truncated[node]:  # cut by the rollout: the turn limit (or the cache length)
      assert not step.done
    digest_at[node] = rollout.state_ids._digest(sandbox.snapshot().data)
    state_id_at[node] = rollout.text_state_id(sandbox.snapshot().data)
    if snapshot_state_ids:
      parent = int(tree.parent[node])
      assert tree.state_id[node] == state_id_at[parent]
  forks = 0
  for decision in result.decisions:
    if decision.snapshot_digest:
      assert decision.snapshot_digest == digest_at[decision.node], decision
      forks += 1
  return forks


def rooms_snapshot_after_reset(task):
  sandbox = rooms.make_sandbox(max_steps=SANDBOX_MAX_STEPS)
  sandbox.reset(task)
  return sandbox.snapshot()


def valid_children(result):
  kids = collections.defaultdict(list)
  alive = result.tokens.alive()
  for i in range(result.num_nodes):
    if alive[i]:
      kids[int(result.tokens.parent[i])].append(i)
  return kids


def check_token_accounting(result):
  tokens = result.tokens
  assert result.compute.tokens_decoded == sum(len(a) for a in tokens.action_tokens)
  assert result.compute.tokens_prefilled == tokens.prompt.size + sum(
      len(o) for o in tokens.observation_tokens)
  assert result.compute.tokens_processed == tokens.num_unique_tokens()
  assert result.compute.env_steps == result.num_nodes


@pytest.fixture(scope="module")
def tasks():
  return rooms.make_tasks("train", num=3, seed=0, difficulty=1)


@pytest.fixture(scope="module")
def bpo_batch(policy, fmt, tasks):
  """A BPO batch with the entropy rule at the median entropy of a forkless probe batch."""
  probe = grow(policy, fmt, in_process_pool(), tasks, seed=1, fork_rule="never",
               max_leaves=1)
  threshold = float(np.median(probe.state_entropies()))
  batch = grow(policy, fmt, in_process_pool(), tasks, seed=0, threshold=threshold,
               k=3, max_leaves=7, state_ids="snapshot")
  return threshold, batch


@pytest.mark.slow
def test_bpo_trees_are_valid_and_match_a_full_forward(policy, bpo_batch):
  _, batch = bpo_batch
  for result in batch.rollouts:
    tree_lib.validate(result.tree)
    assert result.tree.valid[:result.num_nodes].all()
    assert not result.tree.valid[result.num_nodes:].any()
    np.testing.assert_array_equal(result.tokens.parent, result.tree.parent[:result.num_nodes])
    check_against_full_forward(policy, result)
    check_token_accounting(result)
    assert not result.failures and result.compute.failed_branches == 0
    # Every leaf ended: the sandbox's step limit (5) comes before the rollout's turn limit (6).
    for leaf in result.leaves():
      assert result.tree.terminal[leaf] and result.tree.truncated[leaf]
      assert result.tokens.observation_tokens[leaf].size == 0
  assert batch.compute.tokens_processed == sum(r.tokens.num_unique_tokens()
                                               for r in batch.rollouts)


def test_trees_feed_the_estimator_and_the_packed_update(bpo_batch):
  # The rollout's output goes straight into the estimator and the packed layout: every valid
  # token once, the behaviour logprobs of the action tokens as recorded.
  _, batch = bpo_batch
  out = jax.vmap(estimators.bpo_advantages)(batch.stacked_trees())
  packed = packing.pack_trees(batch.tree_tokens(), np.asarray(out.advantages),
                              np.asarray(out.weights))
  for b, result in enumerate(batch.rollouts):
    real = packed.segment_start[b] >= 0
    assert real.sum() == result.tokens.num_unique_tokens()
    recorded = np.concatenate([result.tokens.action_logprobs[i]
                               for i in range(result.num_nodes)])
    np.testing.assert_allclose(np.sort(packed.old_logprob[b][packed.loss_mask[b]]),
                               np.sort(recorded))
    # Leaf path weights sum to one.
    # A sum of the leaves' weights (products of 1/k down each path): one rounding per factor
    # and per addition, at magnitude 1.
    leaves = result.leaves()
    np.testing.assert_allclose(np.asarray(out.weights[b])[leaves].sum(), 1.0, rtol=0,
                               atol=ulp_tol(np.float32, 1.0, 2 * len(leaves) + result.num_nodes))


def test_forks_happen_exactly_where_the_rule_says(bpo_batch):
  threshold, batch = bpo_batch
  config = rollout.RolloutConfig(**{**COMMON, "k": 3, "max_leaves": 7})
  fired = declined = 0
  for result in batch.rollouts:
    kids = valid_children(result)
    forks_before = 0
    eligible_nodes = []
    for d in result.decisions:
      # The entropy the rule read is the one recorded for every action taken at that state.
      for child in kids[d.node]:
        assert result.tree.entropy[child] == np.float32(d.entropy)
      assert len(kids[d.node]) == d.num_siblings
      if d.eligible:
        eligible_nodes.append(d.node)
        expected = bool(branching.online_fork_decision(np.float32(d.entropy),
                                                       np.float32(threshold), forks_before,
                                                       config.max_forks))
        assert d.rule == expected, d
        fired += expected
        declined += not expected
      else:
        assert not d.rule
      assert d.num_siblings == (3 if d.affordable else 1), d
      assert bool(d.snapshot_digest) == d.affordable
      forks_before += d.affordable
    # Only the backbone may fork (siblings_fork=False): the eligible states form one chain.
    for a, b in zip(eligible_nodes, eligible_nodes[1:]):
      assert result.tree.parent[b] == a
    assert result.compute.forks == forks_before <= config.max_forks
    assert result.compute.restores == 2 * forks_before
    assert result.leaves().size == 1 + 2 * forks_before <= 7
    # Each state decided once, at a fork or not; no state has children without a decision.
    assert sorted(d.node for d in result.decisions) == sorted(kids)
  assert fired and declined  # the threshold splits the states: the check is not vacuous
  assert batch.threshold == threshold
  # The running threshold for the next batch: one entropy per state, siblings not repeated.
  entropies = batch.state_entropies()
  assert entropies.size == sum(len(r.decisions) for r in batch.rollouts)
  running = batch.update_threshold(branching.init_quantile_threshold(1.0), quantile=0.5)
  np.testing.assert_allclose(float(running.threshold), np.quantile(entropies, 0.5), rtol=1e-6)


def test_restored_siblings_see_exactly_the_backbones_state(bpo_batch):
  _, batch = bpo_batch
  forks = sum(replay_checks(r, snapshot_state_ids=True) for r in batch.rollouts)
  assert forks == batch.compute.forks > 0
  # One snapshot per fork plus one per state for the snapshot state ids.
  states = sum(len(r.decisions) for r in batch.rollouts)
  assert batch.compute.snapshots == batch.compute.forks + states


@pytest.mark.slow
def test_group_topology_forks_n_at_the_root_only(policy, fmt, tasks):
  batch = grow(policy, fmt, in_process_pool(), tasks, seed=2, topology="group", group_size=4,
               state_ids="observation")
  trees = batch.stacked_trees()
  for result in batch.rollouts:
    tree_lib.validate(result.tree)
    kids = valid_children(result)
    assert len(kids[rollout.ROOT]) == 4
    assert all(len(c) == 1 for node, c in kids.items() if node != rollout.ROOT)
    assert result.compute.forks == 1 and result.compute.restores == 3
    assert result.compute.snapshots == 1
    check_token_accounting(result)  # the prompt is prefilled once and shared by the 4 rows
    check_against_full_forward(policy, result)
    replay_checks(result)
    for node in range(result.num_nodes):
      parent = int(result.tree.parent[node])
      text = result.first_observation if parent < 0 else result.observation_texts[parent]
      assert result.tree.state_id[node] == rollout.text_state_id(text)
    assert rollout.matched_group_size(result, "leaves") == 4
  # The baselines' estimators take these trees as they are: every step of episode j gets
  # G_j − mean_{k≠j} G_k, G_j its rewards' sum (returns of ≤ max_turns rewards, then the
  # leave-one-out mean of 4, a few roundings at the returns' magnitude). The untrained policy's
  # returns are all equal, so each step is given a reward of its own first.
  rewards = np.random.default_rng(0).normal(size=trees.reward.shape).astype(np.float32)
  trees = dataclasses.replace(trees, reward=np.where(trees.valid, rewards, 0.0))
  advantages = np.asarray(jax.vmap(estimators.rloo_advantages)(trees))
  assert np.abs(advantages).max() > 0.1
  for i, result in enumerate(batch.rollouts):
    valid = np.asarray(result.tree.valid, bool)
    parent = np.where(valid, np.asarray(result.tree.parent), -1)
    reward = np.where(valid, np.asarray(trees.reward[i], np.float64), 0.0)
    episode = np.arange(len(parent))
    while (parent[episode] >= 0).any():  # each node's root child: its episode
      episode = np.where(parent[episode] >= 0, parent[episode], episode)
    roots = np.flatnonzero(valid & (np.asarray(result.tree.parent) < 0))
    assert len(roots) == 4
    returns = {j: reward[episode == j].sum() for j in roots}
    total = sum(returns.values())
    want = np.where(valid, [returns[j] - (total - returns[j]) / 3 if j in returns else 0.0
                            for j in episode], 0.0)
    assert_close(advantages[i], want, steps=16,
                 magnitude=max(1.0, max(abs(g) for g in returns.values())))


class _Countdown:
  """A deterministic toy sandbox: the task is an episode length L; every action is a step, and
  the L-th ends the episode (reward 1), whatever the actions were."""

  def reset(self, task):
    self.length, self.steps = int(task), 0
    return f"{self.length} steps to go"

  def step(self, action):
    del action
    self.steps += 1
    done = self.steps >= self.length
    return base.Step(observation=f"{self.length - self.steps} steps to go",
                     reward=1.0 if done else 0.0, done=done, info={"success": done})

  def snapshot(self):
    return base.Snapshot(f"{self.length},{self.steps}".encode())

  def restore(self, snapshot):
    self.length, self.steps = map(int, snapshot.data.decode().split(","))

  def close(self):
    pass


def countdown_pool():
  return pool_lib.SandboxPool(_Countdown, num_workers=0)


@pytest.mark.parametrize("budget, max_turns, episodes", [(10, 5, 2), (12, 5, 2), (15, 5, 3),
                                                         (64, 5, 12), (20, 6, 3)])
def test_a_group_holds_as_many_whole_episodes_as_the_budget_at_the_worst_case(
    budget, max_turns, episodes):
  config = rollout.RolloutConfig(topology="group", group_size=0, max_env_steps=budget,
                                 max_turns=max_turns)
  assert config.episodes_per_group == episodes == budget // max_turns
  assert config.node_capacity == episodes * max_turns
  # A fixed size is the old behaviour: the budget is not read.
  assert rollout.RolloutConfig(topology="group", group_size=4, max_env_steps=budget,
                               max_turns=max_turns).episodes_per_group == 4


def test_a_budget_for_fewer_than_two_episodes_is_named():
  for budget in (None, 9):
    with pytest.raises(ValueError, match=f"two whole episodes of max_turns=5 steps, got "
                                         f"max_env_steps={budget}"):
      rollout.RolloutConfig(topology="group", group_size=0, max_env_steps=budget, max_turns=5)
  with pytest.raises(ValueError, match="group_size must be >= 0"):
    rollout.RolloutConfig(topology="group", group_size=-1)


def test_bpo_and_a_group_spend_the_same_env_step_budget_without_cutting_an_episode(
    policy, fmt):
  # Budget 20, max_turns 6, episodes of exactly 6 steps (task 6) and of 4 (task 4).
  common = dict(max_env_steps=20, max_turns=6, capacity=32)
  group = grow(policy, fmt, countdown_pool(), [6, 4], topology="group", group_size=0, **common)
  for result, length in zip(group.rollouts, (6, 4)):
    tree_lib.validate(result.tree)
    kids = valid_children(result)
    assert len(kids[rollout.ROOT]) == 3  # 20 // 6 whole episodes
    assert result.leaves().size == 3
    assert result.compute.env_steps == 3 * length <= 20
    assert result.tree.terminal[result.leaves()].all()   # every episode ran to its end
    assert not result.tree.truncated[:result.num_nodes].any()
  # BPO, every state above the threshold, K = 2, worst-case accounting. Task 6: the fork at
  # depth d adds 6 - d worst-case steps; at depth 0: 0 + 6 + 6 = 12 <= 20; depth 1: 2 + 10 + 5
  # = 17; depth 2: 5 + 12 + 4 = 21 refused; depth 3: 8 + 9 + 3 = 20; depth 4: 12 + 8 + 2 = 22
  # and depth 5: 16 + 4 + 1 = 21 refused. Leaves of 6, 6, 5 and 3 steps: 20 env steps.
  tree = grow(policy, fmt, countdown_pool(), [6], threshold=-1.0, k=2,
              max_leaves=None, **common).rollouts[0]
  tree_lib.validate(tree.tree)
  forked = sorted(d.depth for d in tree.decisions if d.num_siblings > 1)
  refused = sorted(d.depth for d in tree.decisions if d.rule and not d.affordable)
  assert forked == [0, 1, 3]
  assert 2 in refused and 4 in refused and 5 in refused
  assert tree.leaves().size == 4 and tree.compute.env_steps == 20
  assert tree.tree.terminal[tree.leaves()].all()
  assert not tree.tree.truncated[:tree.num_nodes].any()
  check_token_accounting(tree)


class _FaultyRooms:
  """Rooms that raises on chosen step and restore calls, counted over all sandboxes."""

  def __init__(self, counter, fail_steps, fail_restores, fail_snapshots=(), fail_resets=()):
    self.inner = rooms.make_sandbox(max_steps=SANDBOX_MAX_STEPS)
    self.counter, self.fail_steps, self.fail_restores = counter, fail_steps, fail_restores
    self.fail_snapshots, self.fail_resets = fail_snapshots, fail_resets

  def reset(self, task):
    self.counter["reset"] += 1
    if self.counter["reset"] in self.fail_resets:
      raise RuntimeError(f"injected reset fault {self.counter['reset']}")
    return self.inner.reset(task)

  def step(self, action):
    self.counter["step"] += 1
    if self.counter["step"] in self.fail_steps:
      raise RuntimeError(f"injected step fault {self.counter['step']}")
    return self.inner.step(action)

  def snapshot(self):
    self.counter["snapshot"] += 1
    if self.counter["snapshot"] in self.fail_snapshots:
      raise RuntimeError(f"injected snapshot fault {self.counter['snapshot']}")
    return self.inner.snapshot()

  def restore(self, snapshot):
    self.counter["restore"] += 1
    if self.counter["restore"] in self.fail_restores:
      raise RuntimeError(f"injected restore fault {self.counter['restore']}")
    self.inner.restore(snapshot)

  def close(self):
    self.inner.close()


def test_failed_branches_are_invalid_and_accounted_for(policy, fmt, tasks):
  counter = collections.Counter()
  # One tree; every state forks (threshold -1) until 5 leaves: 3 at the root, 2 more at the
  # backbone's second state. Step calls: turn 1 = 1..3, turn 2 = 4..6; restores: 1-2, then 3-4.
  pool = pool_lib.SandboxPool(functools.partial(_FaultyRooms, counter, {2, 6}, {4}),
                              num_workers=0)
  batch = grow(policy, fmt, pool, tasks[:1], seed=3, threshold=-1.0, k=3,
               max_leaves=5)
  result = batch.rollouts[0]
  tree_lib.validate(result.tree)
  assert sorted(f.op for f in result.failures) == ["restore", "step", "step"]
  assert all("injected" in f.reason for f in result.failures)
  assert result.compute.failed_branches == 3 == batch.compute.failed_branches
  # Reference: invalid = failed steps with their subtrees, then ancestors left childless.
  parent = result.tokens.parent
  invalid = set()
  for f in result.failures:
    if f.node >= 0:
      invalid.add(f.node)
  changed = True
  while changed:
    changed = False
    for i in range(result.num_nodes):
      if i not in invalid and parent[i] in invalid:
        invalid.add(i)
        changed = True
    for i in range(result.num_nodes):
      children = [c for c in range(result.num_nodes) if parent[c] == i]
      if i not in invalid and children and all(c in invalid for c in children):
        invalid.add(i)
        changed = True
  assert set(np.nonzero(~result.tree.valid[:result.num_nodes])[0].tolist()) == invalid
  np.testing.assert_array_equal(result.tokens.valid, result.tree.valid[:result.num_nodes])
  # Both root-level siblings failed (one directly, one by its second step); the backbone's
  # subtree goes on: two valid leaves below its second state (one restore failed).
  kids = valid_children(result)
  assert kids[rollout.ROOT] == [0]
  assert result.leaves().size == 2
  replay_checks(result)
  check_against_full_forward(policy, result)
  # Failed work was still done, so the policy processed more than the valid tree holds.
  assert result.compute.tokens_processed > result.tokens.num_unique_tokens()
  assert pool.branches() == []  # every branch, failed or finished, was closed


def test_a_failed_snapshot_ends_the_branch_at_its_state(policy, fmt, tasks):
  # The root fork's snapshot works; the backbone's second one (at its next state) fails, so the
  # backbone's first step is invalid and the two root siblings go on alone.
  counter = collections.Counter()
  pool = pool_lib.SandboxPool(functools.partial(_FaultyRooms, counter, (), (), {2}),
                              num_workers=0)
  batch = grow(policy, fmt, pool, tasks[:1], seed=3, threshold=-1.0, k=3,
               max_leaves=5)
  result = batch.rollouts[0]
  tree_lib.validate(result.tree)
  assert [(f.node, f.parent, f.op) for f in result.failures] == [(0, -1, "snapshot")]
  assert "injected snapshot fault" in result.failures[0].reason
  assert result.decisions[1].node == 0 and result.decisions[1].num_siblings == 0
  assert result.compute.forks == 1 and result.compute.failed_branches == 1
  kids = valid_children(result)
  assert kids[rollout.ROOT] == [1, 2]
  assert not result.tree.valid[0] and result.leaves().size == 2
  replay_checks(result)
  assert pool.branches() == []


def test_a_failed_reset_leaves_an_empty_tree_and_the_others_go_on(policy, fmt, tasks):
  counter = collections.Counter()
  pool = pool_lib.SandboxPool(functools.partial(_FaultyRooms, counter, (), (), (), {1}),
                              num_workers=0)
  batch = grow(policy, fmt, pool, tasks[:2], seed=9, threshold=-1.0, k=2,
               max_leaves=2)
  empty, other = batch.rollouts
  assert [(f.node, f.op) for f in empty.failures] == [(-1, "reset")]
  assert empty.num_nodes == 0 and not empty.tree.valid.any() and empty.leaves().size == 0
  assert empty.compute.tokens_processed == 0 and empty.compute.failed_branches == 1
  tree_lib.validate(other.tree)
  assert other.leaves().size == 2 and not other.failures
  replay_checks(other)


def test_worst_case_budgets_are_hard_limits(policy, fmt, tasks):
  # Every state is above the threshold, so only the budgets stop the forks; whatever the policy
  # samples, no tree may exceed its env-step or token budget.
  for budget in (dict(max_env_steps=20), dict(max_tree_tokens=1000)):
    batch = grow(policy, fmt, in_process_pool(), tasks, seed=4, threshold=-1.0,
                 k=2, max_leaves=None, capacity=64, **budget)
    for result in batch.rollouts:
      tree_lib.validate(result.tree)
      assert result.compute.env_steps <= budget.get("max_env_steps", 10**9)
      assert result.compute.tokens_processed <= budget.get("max_tree_tokens", 10**9)
      assert result.compute.forks >= 1
      refused = [d for d in result.decisions if d.rule and not d.affordable]
      assert refused  # the budget, not the rule, stopped the forks
      assert all(d.num_siblings == 1 for d in refused)


def test_used_budget_and_sibling_forks_follow_the_audit(policy, fmt, tasks):
  # "used" accounting: a fork needs only the counters so far to leave room for K-1 more leaves
  # and steps. Siblings may fork too.
  batch = grow(policy, fmt, in_process_pool(), tasks[:1], seed=7, threshold=-1.0,
               k=2, max_leaves=6, max_env_steps=14, budget_accounting="used",
               siblings_fork=True)
  result = batch.rollouts[0]
  tree_lib.validate(result.tree)
  assert all(d.eligible for d in result.decisions)
  forks_seen = 0
  for d in result.decisions:
    assert d.forks_used == forks_seen
    assert d.rule == (d.forks_used < 5)  # max_forks = (6 - 1) // (2 - 1)
    if d.rule:
      assert d.affordable == (d.leaves_started + 1 <= 6 and d.env_steps_used + 1 <= 14), d
    forks_seen += d.affordable
  assert result.leaves().size == 1 + forks_seen <= 6
  backbone = set()
  node = 0
  while node is not None:
    backbone.add(node)
    node = next((c for c in range(result.num_nodes) if result.tree.parent[c] == node), None)
  forked_states = {d.node for d in result.decisions if d.num_siblings > 1}
  assert forked_states - backbone - {rollout.ROOT}  # a sibling branch forked too
  replay_checks(result)
  check_token_accounting(result)


def test_root_fork_takes_root_siblings_and_later_forks_take_k(policy, fmt, tasks):
  # K = 4 at the root state (as a group of 4 episodes forks there), K = 2 below; every state
  # forks while the worst-case env-step budget allows: 4 branches x 6 turns = 24 at the root,
  # then a fork below only while the live branches' remaining turns leave room in 30.
  batch = grow(policy, fmt, in_process_pool(), tasks[:2], seed=7, threshold=-1.0,
               k=2, root_k=4, max_leaves=8, max_env_steps=30,
               siblings_fork=True)
  for result in batch.rollouts:
    tree_lib.validate(result.tree)
    kids = valid_children(result)
    root = [d for d in result.decisions if d.depth == 0]
    assert len(root) == 1 and root[0].node == rollout.ROOT and root[0].num_siblings == 4
    assert len(kids[rollout.ROOT]) == 4
    below = [d for d in result.decisions if d.depth > 0 and d.affordable]
    assert all(d.num_siblings == 2 and len(kids[d.node]) == 2 for d in below)
    assert result.compute.env_steps <= 30
    assert result.leaves().size == 4 + len(below)
    replay_checks(result)
    check_token_accounting(result)
  assert any(d.depth > 0 and d.affordable for r in batch.rollouts for d in r.decisions)
  with pytest.raises(ValueError, match="root_k must be >= 2"):
    rollout.RolloutConfig(root_k=1)
  with pytest.raises(ValueError, match="root_k: only a tree grown by an online"):
    rollout.RolloutConfig(topology="group", root_k=4)


def test_turn_limit_cuts_a_branch(policy, fmt, tasks):
  # Truncated, not terminal, and no observation tokens kept for the cut step.
  batch = grow(policy, fmt, in_process_pool(), tasks[:1], seed=5, fork_rule="never",
               max_leaves=1, max_turns=3)
  result = batch.rollouts[0]
  assert result.num_nodes == 3
  assert result.tree.truncated[2] and not result.tree.terminal[2]
  assert not result.tree.truncated[:2].any()
  assert result.tokens.observation_tokens[2].size == 0
  assert result.observation_texts[2]  # the text is kept for display
  # The cache length cuts a branch too: after a step, the next observation and a full action
  # must fit, else the branch ends there (truncated) instead of overflowing the cache.
  prompt = len(fmt.prompt_tokens(result.first_observation))
  batch = grow(policy, fmt, in_process_pool(), tasks[:1], seed=5, fork_rule="never",
               max_leaves=1, max_length=prompt + 6 + 20, batch_buckets=(4,))
  result = batch.rollouts[0]
  first_observation = len(fmt.observation_tokens(result.observation_texts[0]))
  assert prompt + len(result.tokens.action_tokens[0]) + first_observation + 6 > prompt + 6 + 20
  assert result.num_nodes == 1
  assert result.tree.truncated[0] and not result.tree.terminal[0]
  check_token_accounting(result)


def test_top_k_after_the_fact_forks_at_the_backbones_highest_entropies(policy, fmt, tasks):
  # The biased comparison rule: the backbone runs to the end, then forks at its 2 highest-
  # entropy states; the siblings start from its cache row cut back to each state.
  batch = grow(policy, fmt, in_process_pool(), tasks[:2], seed=8, fork_rule="top_k_after",
               k=3, max_leaves=5)
  for result in batch.rollouts:
    tree_lib.validate(result.tree)
    kids = valid_children(result)
    backbone = [d for d in result.decisions if d.eligible]
    assert backbone[0].node == rollout.ROOT  # the root state first, then down the backbone
    for a, b in zip(backbone, backbone[1:]):
      assert result.tree.parent[b.node] == a.node and b.depth == a.depth + 1
    entropy = np.asarray([d.entropy for d in backbone], np.float32)
    top = sorted(np.argsort(-entropy, kind="stable")[:2].tolist())
    assert [i for i, d in enumerate(backbone) if d.rule] == top
    for d in backbone:
      assert len(kids[d.node]) == (3 if d.rule else 1)
      for child in kids[d.node]:
        assert result.tree.entropy[child] == np.float32(d.entropy)
    assert result.leaves().size == 5 and result.compute.forks == 2
    check_against_full_forward(policy, result)  # the cut-back rows are the states' caches
    assert replay_checks(result) == 2
    # Each sibling re-ran one token (the cue) to recover the state's next-token logits.
    tokens = result.tokens
    assert result.compute.tokens_prefilled == 4 + tokens.prompt.size + sum(
        len(o) for o in tokens.observation_tokens)
    assert result.compute.tokens_processed == tokens.num_unique_tokens() + 4
  with pytest.raises(ValueError, match="top_k_after"):
    rollout.RolloutConfig(fork_rule="top_k_after", max_env_steps=10)


def test_worker_pool_gives_the_same_trees(policy, fmt, tasks):
  config = dict(seed=6, threshold=-1.0, k=2, max_leaves=3)
  local = grow(policy, fmt, in_process_pool(), tasks[:2], **config)
  with pool_lib.SandboxPool.for_environment("rooms", num_workers=2, timeout_s=30.0,
                                            max_steps=SANDBOX_MAX_STEPS) as pool:
    workers = grow(policy, fmt, pool, tasks[:2], **config)
    assert pool.branches() == []
  for a, b in zip(local.rollouts, workers.rollouts):
    for field in ("parent", "reward", "terminal", "truncated", "valid", "entropy"):
      np.testing.assert_array_equal(getattr(a.tree, field), getattr(b.tree, field))
    assert a.action_texts == b.action_texts
    assert a.observation_texts == b.observation_texts
  assert workers.compute.restores == local.compute.restores > 0


def _same_tree(a: rollout.TaskRollout, b: rollout.TaskRollout):
  for field in ("parent", "reward", "terminal", "truncated", "valid"):
    np.testing.assert_array_equal(getattr(a.tree, field), getattr(b.tree, field), err_msg=field)
  # The same compiled policy on the same inputs: any difference is the order of a few sums
  # (8 float32 roundings at the largest entropy, log of the vocabulary).
  entropy_tol = ulp_tol(np.float32, max(np.abs(a.tree.entropy).max(), 1.0), 8)
  np.testing.assert_allclose(a.tree.entropy, b.tree.entropy, rtol=0, atol=entropy_tol)
  assert a.action_texts == b.action_texts and a.observation_texts == b.observation_texts
  for x, y in zip(a.tokens.action_tokens, b.tokens.action_tokens):
    np.testing.assert_array_equal(x, y)
  for x, y in zip(a.tokens.action_logprobs, b.tokens.action_logprobs):
    np.testing.assert_allclose(x, y, rtol=0,
                               atol=ulp_tol(np.float32, max(np.abs(y).max(initial=0), 1.0), 8))
  assert [d.entropy for d in a.decisions] == pytest.approx([d.entropy for d in b.decisions],
                                                           abs=entropy_tol)
  assert a.compute == b.compute


@pytest.mark.parametrize("rule", [dict(fork_rule="entropy", threshold=-1.0, k=2,
                                       max_leaves=4, siblings_fork=True),
                                  dict(fork_rule="random", fork_probability=0.5, k=3,
                                       max_leaves=5),
                                  dict(topology="group", group_size=3)])
def test_a_tasks_tree_does_not_depend_on_its_batch_mates(policy, fmt, tasks, rule):
  # Every branch samples with its own key (from the task's global index), so task 1 grown
  # alone, under its index, is the tree it grows among tasks 0 and 2; under another index it
  # is a different draw.
  together = grow(policy, fmt, in_process_pool(), tasks, seed=4, **rule)
  alone = grow(policy, fmt, in_process_pool(), tasks[1:2], seed=4, task_ids=[1], **rule)
  _same_tree(alone.rollouts[0], together.rollouts[1])
  assert together.rollouts[1].num_nodes > together.rollouts[1].leaves().size > 1  # it forked
  pair = grow(policy, fmt, in_process_pool(), [tasks[2], tasks[0]], seed=4, task_ids=[2, 0],
              **rule)
  _same_tree(pair.rollouts[0], together.rollouts[2])
  _same_tree(pair.rollouts[1], together.rollouts[0])
  moved = grow(policy, fmt, in_process_pool(), tasks[1:2], seed=4, task_ids=[7], **rule)
  assert (moved.rollouts[0].action_texts != alone.rollouts[0].action_texts
          or moved.rollouts[0].num_nodes != alone.rollouts[0].num_nodes)


@pytest.mark.slow
def test_branch_keys_follow_the_documented_derivation(policy, fmt, tasks):
  # Task t's key is fold_in(key, t); the action at depth d of a branch keyed k is drawn with
  # child_key(k, d, 0), and sibling j of a fork there is keyed child_key(k, d, j). Redrawn
  # here one row at a time with the sampler, the actions are the tree's.
  config, graphdef, params = policy
  batch = grow(policy, fmt, in_process_pool(), tasks[:2], seed=5, task_ids=[3, 8],
               threshold=-1.0, k=2, max_leaves=2)
  sampler = sampling.Sampler(graphdef, config, COMMON["max_length"])
  params_of_sampling = rollout.RolloutConfig(**COMMON).sampling_params(fmt.stop_token_ids)

  def redraw(tokens, key):
    # Four copies of the row: the batch size of the engine's smallest bucket (no new compile).
    decode_state = sampler.prefill(params, [list(tokens)] * 4)
    _, out = sampler.generate(params, decode_state, jnp.stack([key] * 4), params_of_sampling)
    return np.asarray(out.tokens[0, :int(out.num_tokens[0])])

  for result, task_id in zip(batch.rollouts, [3, 8]):
    task_key = jax.random.fold_in(jax.random.key(5), task_id)
    prompt = result.tokens.prompt.tolist()
    backbone, sibling = [int(i) for i in np.nonzero(result.tokens.parent == -1)[0]]
    np.testing.assert_array_equal(redraw(prompt, rollout.child_key(task_key, 0, 0)),
                                  result.tokens.action_tokens[backbone])
    sibling_key = rollout.child_key(task_key, 0, 1)
    np.testing.assert_array_equal(redraw(prompt, rollout.child_key(sibling_key, 0, 0)),
                                  result.tokens.action_tokens[sibling])
    second = int(np.nonzero(result.tokens.parent == backbone)[0][0])
    after_first = prompt + result.tokens.segment(backbone).tolist()
    np.testing.assert_array_equal(redraw(after_first, rollout.child_key(task_key, 1, 0)),
                                  result.tokens.action_tokens[second])


def test_first_token_entropy_by_hand():
  logits = jnp.asarray([[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9]])
  np.testing.assert_allclose(rollout.first_token_entropy(logits, 1.0), [np.log(4), 0.0],
                             atol=1e-6)
  # Temperature 2 flattens [log 1, log 3] ... here [0, log 3·2] -> softmax([0, log 3]).
  logits = jnp.asarray([[0.0, 2 * np.log(3.0)]])
  p = np.asarray([0.25, 0.75])
  np.testing.assert_allclose(rollout.first_token_entropy(logits, 2.0), [-(p * np.log(p)).sum()],
                             atol=1e-6)


def test_matched_group_size_by_hand():
  # A root fork of 2, the first child goes on for two more steps: leaves at depth 3 and 1.
  result = rollout.TaskRollout(
      task=None, tree=tree_lib.from_parents([-1, -1, 0, 2], [0, 0, 0, 1]),
      tokens=packing.TreeTokens(
          prompt=[1, 2], parent=[-1, -1, 0, 2], action_tokens=[[3], [3], [3], [3]],
          action_logprobs=[[0.0]] * 4, observation_tokens=[[4, 4], [], [4, 4], []]),
      first_observation="", action_texts=[""] * 4, observation_texts=[""] * 4,
      node_success=np.zeros(4, bool), decisions=[], failures=[],
      compute=rollout.Compute(tokens_prefilled=6, tokens_decoded=4, env_steps=4))
  assert result.leaves().tolist() == [1, 3]
  assert result.path_tokens() == (2 + 3 + 3 + 1) + (2 + 1)
  assert rollout.matched_group_size(result, "leaves") == 2
  assert rollout.matched_group_size(result, "env_steps") == 2      # 4 steps / 2 per leaf
  assert rollout.matched_group_size(result, "tokens") == 2         # 10 / 6
  with pytest.raises(ValueError, match="by must be"):
    rollout.matched_group_size(result, "time")


def test_bad_configs_and_inputs_are_named(policy, fmt, tasks):
  with pytest.raises(ValueError, match="topology"):
    rollout.RolloutConfig(topology="forest")
  with pytest.raises(ValueError, match="RolloutConfig.k must be"):
    rollout.RolloutConfig(k=1)
  with pytest.raises(ValueError, match="max_leaves or an explicit capacity"):
    rollout.RolloutConfig(max_leaves=None)
  with pytest.raises(ValueError, match="group_size=8"):
    rollout.RolloutConfig(topology="group", group_size=8, capacity=10, max_turns=4)
  with pytest.raises(ValueError, match="batch_buckets"):
    rollout.RolloutConfig(batch_buckets=(8, 4))
  with pytest.raises(ValueError, match="does not fit max_length=40"):
    grow(policy, fmt, in_process_pool(), tasks[:1], max_length=40)
  with pytest.raises(ValueError, match="at least one task"):
    grow(policy, fmt, in_process_pool(), [])
  with pytest.raises(ValueError, match="one index per task: 1 ids for 2 tasks"):
    grow(policy, fmt, in_process_pool(), tasks[:2], task_ids=[0])
  with pytest.raises(ValueError, match=r"distinct non-negative integers, got \[3, 3\]"):
    grow(policy, fmt, in_process_pool(), tasks[:2], task_ids=[3, 3])


@functools.lru_cache(maxsize=None)
def _logits_forward(graphdef):
  return jax.jit(functools.partial(forward, graphdef))


def _greedy_action_entropy(policy, fmt, sequence, max_new_tokens, temperature):
  """Σ of the token entropies of softmax(logits / T) along the greedy action after `sequence`,
  by full forward passes without a cache (the reference for the "greedy_action" measure), the
  number of tokens and the largest |logit / T| they came from."""
  _, graphdef, params = policy
  seq, total, length, magnitude = list(sequence), 0.0, 0, 0.0
  for length in range(1, max_new_tokens + 1):
    padded = np.zeros((1, PATH_LENGTH), np.int32)
    padded[0, :len(seq)] = seq
    last = _logits_forward(graphdef)(params, jnp.asarray(padded))[0][0, len(seq) - 1]
    token = int(jnp.argmax(last))
    total += float(rollout.first_token_entropy(last[None], temperature)[0])
    magnitude = max(magnitude, float(jnp.abs(last).max()) / temperature)
    seq.append(token)
    if token in fmt.stop_token_ids:
      break
  return total, length, magnitude


@pytest.mark.slow
def test_greedy_action_entropy_is_the_greedy_paths_entropy_and_drives_the_forks(policy, fmt,
                                                                                tasks):
  probe = grow(policy, fmt, in_process_pool(), tasks[:2], seed=1, fork_rule="never",
               max_leaves=1, entropy_measure="greedy_action")
  threshold = float(np.median(probe.state_entropies()))
  batch = grow(policy, fmt, in_process_pool(), tasks[:2], seed=0, threshold=threshold,
               max_leaves=5, entropy_measure="greedy_action")
  first = grow(policy, fmt, in_process_pool(), tasks[:2], seed=0, threshold=threshold,
               max_leaves=5)
  fired = declined = 0
  for result, plain in zip(batch.rollouts, first.rollouts):
    probed = 0
    for d in result.decisions:
      sequence = list(result.tokens.prompt)
      if d.node != rollout.ROOT:
        for node in result.path(d.node):
          sequence += list(result.tokens.segment(node))
      expected, length, magnitude = _greedy_action_entropy(
          policy, fmt, sequence, COMMON["max_action_tokens"], COMMON["temperature"])
      # Each token's entropy to a forward's roundings (cached against full), then their sum.
      steps = length * forward_roundings(policy[0], PATH_LENGTH, logprobs=True) + length
      np.testing.assert_allclose(d.entropy, expected, rtol=0, err_msg=str(d),
                                 atol=ulp_tol(np.float32, magnitude, steps))
      probed += length
      if d.eligible:
        fired += d.rule
        declined += not d.rule
    # One greedy probe per decided state, as long as the greedy action it decoded.
    assert result.compute.tokens_probed == probed > 0
    assert plain.compute.tokens_probed == 0
    check_token_accounting(result)
  assert fired and declined


@pytest.mark.parametrize("rule", [
    dict(fork_rule="random", fork_probability=0.5, k=3, max_leaves=5),
    pytest.param(dict(fork_rule="top_k_after", k=3, max_leaves=5), marks=pytest.mark.slow)])
def test_a_paged_cache_grows_the_dense_caches_trees(policy, fmt, tasks, rule, monkeypatch):
  # Pages of 16 slots: forks place new branches in free slots of the batch, sharing pages
  # (top-k-after's cut-back rows copy a shared last page); the batch is gathered only when its
  # size bucket changes. The same actions and observations as the dense cache, and each leaf
  # path's numbers those of a full forward.
  dense = grow(policy, fmt, in_process_pool(), tasks[:2], seed=3, **rule)
  calls = collections.Counter()
  for name in ("take_rows", "place"):
    method = getattr(sampling.Sampler, name)
    monkeypatch.setattr(sampling.Sampler, name,
                        lambda self, *a, _m=method, _n=name, **k: calls.update([_n]) or _m(
                            self, *a, **k))
  paged_batch = grow(policy, fmt, in_process_pool(), tasks[:2], seed=3, kv_page_size=16,
                     **rule)
  assert calls["place"] > 0 and calls["take_rows"] < paged_batch.turns
  for a, b in zip(dense.rollouts, paged_batch.rollouts):
    for field in ("parent", "reward", "terminal", "truncated", "valid"):
      np.testing.assert_array_equal(getattr(a.tree, field), getattr(b.tree, field))
    assert a.action_texts == b.action_texts and a.observation_texts == b.observation_texts
    assert a.compute == b.compute
    check_against_full_forward(policy, b)
  assert sum(r.compute.forks for r in paged_batch.rollouts) > 0
