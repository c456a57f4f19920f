"""`RolloutEngine`: the host loop that grows every task's tree at once.

Before the first turn every task's backbone is reset and its prompt prefilled. Each turn then
runs these phases for all live branches of all tasks together:

1. decide: the entropy at each branch's state (`entropy`), and the fork policy's verdict there
   (`policies`, `top_k_after`), forks charged to the budgets as they are decided (`budget`);
2. fork: each forking state is snapshotted once and restored into the new branches, and the
   cache rows are gathered on the batch axis so that a new branch starts from a copy of its
   source's row (`Sampler.take_rows`): the prefix is never replayed. With `kv_page_size` the
   rows are slots of one persistent batch: a new branch takes a free slot, sharing its
   source's pages and copying at most the last one (`Sampler.place`), and rows no branch holds
   are released; the batch is gathered only when its size bucket changes;
3. decode: one jitted `generate` call samples an action for every row (the batch padded to a
   size from `batch_buckets`, so compiles stay bounded); each action becomes a node;
4. step: every branch's action goes to the sandbox pool in one `step_many` call;
5. record: outcomes, cuts (the turn limit; a cache with no room for the next observation and
   action) and failures go on the nodes; the observations of the branches that go on are
   prefilled in one `append` call.

Parameters laid out on a mesh (`sampling.params_mesh`) decode there: the rows' KV cache is made
and forked in the layout of `sharding.cache_shardings` (rows over "data" and "fsdp").
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from typing import Any, Callable, Hashable, Sequence

import jax
import numpy as np

from bpo_jax import sampling
from bpo_jax import sampling_shapes
from bpo_jax import text
from bpo_jax.rollout import entropy as entropy_lib
from bpo_jax.rollout import keys as keys_lib
from bpo_jax.rollout import policies
from bpo_jax.rollout import top_k_after
from bpo_jax.rollout.branches import Branch, Sibling, start_siblings
from bpo_jax.rollout.budget import TurnBudget
from bpo_jax.rollout.config import RolloutConfig
from bpo_jax.rollout.records import PHASES, ROOT, Compute, Decision, Failure, RolloutBatch
from bpo_jax.rollout.state_ids import _digest, text_state_id
from bpo_jax.rollout.tree_state import TreeState
from bpo_jax.sandboxes import pool as pool_lib


class _Clock:
  """Wall time per phase (`PHASES`), lap by lap."""

  def __init__(self):
    self.seconds = dict.fromkeys(PHASES, 0.0)
    self._last = time.perf_counter()

  def lap(self, phase: str) -> None:
    now = time.perf_counter()
    self.seconds[phase] += now - self._last
    self._last = now


@dataclasses.dataclass
class _Call:
  """The state of one `rollout` call."""

  trees: list[TreeState]
  task_keys: np.ndarray          # raw words of each task's key
  keys: keys_lib.BranchKeys
  policy: policies.ForkPolicy
  new_branch_id: Callable[[int], Hashable]
  threshold: float
  clock: _Clock
  mesh: Any = None               # the parameters' mesh, where the rows' cache lives
  turns: int = 0
  device_row_tokens: int = 0     # rows x decode steps the device ran, padding included
  decode_steps: int = 0          # decode steps the device ran


def _checked_task_ids(task_ids: Sequence[int] | None, num_tasks: int) -> list[int]:
  task_ids = [int(t) for t in (range(num_tasks) if task_ids is None else task_ids)]
  if len(task_ids) != num_tasks:
    raise ValueError(f"task_ids must give one index per task: {len(task_ids)} ids for "
                     f"{num_tasks} tasks")
  if len(set(task_ids)) != len(task_ids) or min(task_ids) < 0:
    raise ValueError(f"task_ids must be distinct non-negative integers, got {task_ids}")
  return task_ids


class RolloutEngine:
  """Grows trees (or groups) for a batch of tasks with one policy and one sandbox pool.

  Args:
    graphdef: the policy's `nnx.split` graph definition.
    model_config: its `ModelConfig`.
    fmt: the conversation format (`text.ChatFormat`).
    pool: a `SandboxPool` whose sandboxes play the tasks.
    config: a `RolloutConfig`.
    programs: a `precompiled.ProgramSet` the sampler runs its compiled programs from (see
      `program_keys`), or None (each compiled on its first call).
  """

  def __init__(self, graphdef, model_config, fmt: text.ChatFormat,
               pool: pool_lib.SandboxPool, config: RolloutConfig, programs=None):
    self.config = config
    self.fmt = fmt
    self.pool = pool
    # Each call's decode state replaces the last: the sampler reuses its buffers.
    self.sampler = sampling.Sampler(graphdef, model_config, config.max_length, donate=True,
                                    page_size=config.kv_page_size,
                                    pool_pages=config.kv_pool_pages, programs=programs)
    self.sampling_params = config.sampling_params(fmt.stop_token_ids)
    self._calls = itertools.count()

  def program_keys(self, max_rows: int, prompts: int, longest_prompt: int | None = None,
                   longest_observation: int | None = None) -> list[sampling_shapes.ProgramKey]:
    """The sampler programs calls with at most `max_rows` live rows and `prompts` trees can
    run: every batch size up to `max_rows` rows (`batch_buckets`), the prompts' prefill on the
    batch sizes up to `prompts` rows, with the greedy-action probe's decode loops when the
    entropy measure takes them (`sampling_shapes.sampler_program_keys`). The appends are
    bounded by the longest prompt and observation (`fmt`'s token counts; None: the cache).
    A rewound branch (`top_k_after`) appends one token."""
    cfg = self.config
    bounds = sampling_shapes.AppendBounds(
        prefill_batches=tuple(sampling_shapes.batch_sizes(cfg.batch_buckets, prompts)),
        longest_prompt=longest_prompt or cfg.max_length,
        longest_append=longest_observation or cfg.max_length)
    return sampling_shapes.sampler_program_keys(
        sampling_shapes.batch_sizes(cfg.batch_buckets, max_rows), cfg.max_length,
        probe=cfg.entropy_measure == "greedy_action", bounds=bounds)

  def rollout(self, params, tasks: Sequence[Any], key: jax.Array,
              threshold: float | None = None,
              task_ids: Sequence[int] | None = None) -> RolloutBatch:
    """Grows one tree (or group) per task; see the module docstring and `bpo_jax.rollout`.

    Args:
      params: the policy's `nnx.split` state.
      tasks: the tasks, one tree each.
      key: a JAX PRNG key (typed, or raw uint32 words) for sampling and the random fork rule.
      threshold: the entropy threshold for this call (default `config.entropy_threshold`).
      task_ids: the tasks' global indices (default `0..len(tasks)-1`): task t's tree depends
        only on `fold_in(key, task_ids[t])`, so a batch split into parts, each rolled out with
        its own tasks' global indices, grows the trees of the whole batch.

    Returns:
      A `RolloutBatch` with one `TaskRollout` per task, in order.
    """
    call = self._start(tasks, key, threshold, task_ids)
    call.mesh = sampling.params_mesh(params)
    live = self._reset(call, tasks)
    decode_state = self._prefill(call, params, live)
    while live:
      call.turns += 1
      verdicts = self._decide(call, params, decode_state, live)
      live, sources, entropy = self._fork(call, live, verdicts)
      if not live:
        call.clock.lap("fork")
        break
      decode_state = self._gather_rows(call, params, decode_state, live, sources)
      decode_state, nodes = self._decode(call, params, decode_state, live, entropy)
      steps = self._step(call, live, nodes)
      live, appends = self._record(call, live, nodes, steps)
      decode_state = self._append(call, params, decode_state, appends)
    total = Compute()
    for tree in call.trees:
      total.add(tree.compute)
    return RolloutBatch(rollouts=[tree.result() for tree in call.trees], compute=total,
                        phase_seconds=call.clock.seconds,
                        device_row_tokens=call.device_row_tokens, turns=call.turns,
                        decode_steps=call.decode_steps,
                        threshold=call.threshold,
                        decode_devices=1 if call.mesh is None else call.mesh.size)

  # --------------------------------------------------------------------------- the phases

  def _start(self, tasks, key, threshold, task_ids) -> _Call:
    """Checks the arguments; the call's keys, trees and fork policy."""
    cfg = self.config
    if not tasks:
      raise ValueError("rollout needs at least one task")
    threshold = cfg.entropy_threshold if threshold is None else float(threshold)
    task_ids = _checked_task_ids(task_ids, len(tasks))
    keys = keys_lib.BranchKeys(key, cfg.batch_size)
    task_keys = keys.task_keys(task_ids)
    number = next(self._calls)
    branch_numbers = itertools.count()

    def new_branch_id(task_index):
      return ("rollout", number, task_index, next(branch_numbers))

    # The random fork rule draws from a generator seeded with the task key's words.
    trees = [TreeState(task, cfg.node_capacity, np.random.default_rng(words.tolist()))
             for task, words in zip(tasks, task_keys)]
    return _Call(trees=trees, task_keys=task_keys, keys=keys,
                 policy=self._policy(threshold, keys, new_branch_id),
                 new_branch_id=new_branch_id, threshold=threshold, clock=_Clock())

  def _policy(self, threshold: float, keys: keys_lib.BranchKeys,
              new_branch_id: Callable[[int], Hashable]) -> policies.ForkPolicy:
    cfg = self.config
    if cfg.topology == "group":
      return policies.GroupAtRoot(cfg)
    if cfg.fork_rule == "top_k_after":
      return top_k_after.TopKAfter(cfg, self.pool, keys, self.sampler, new_branch_id)
    if cfg.fork_rule == "random":
      return policies.RandomRule(cfg)
    if cfg.fork_rule == "never":
      return policies.Never(cfg)
    return policies.EntropyRule(cfg, threshold)

  def _reset(self, call: _Call, tasks: Sequence[Any]) -> list[Branch]:
    """Resets every task's backbone; a failed reset leaves its tree empty."""
    cfg = self.config
    backbone_ids = {i: call.new_branch_id(i) for i in range(len(tasks))}
    observations = self.pool.reset_many({backbone_ids[i]: t for i, t in enumerate(tasks)})
    live = []
    for i, tree in enumerate(call.trees):
      tree.branches_started = 1
      first = observations[backbone_ids[i]]
      if isinstance(first, pool_lib.BranchFailure):
        tree.failures.append(Failure(node=ROOT, parent=ROOT, op=first.op, reason=first.reason))
        tree.compute.failed_branches += 1
        self.pool.close(backbone_ids[i])
        continue
      tree.first_observation = first
      tree.prompt = self.fmt.prompt_tokens(first)
      if len(tree.prompt) + cfg.max_action_tokens > cfg.max_length:
        self.pool.close_many(list(backbone_ids.values()))
        raise ValueError(f"task {i}: the prompt has {len(tree.prompt)} tokens; with "
                         f"max_action_tokens={cfg.max_action_tokens} it does not fit "
                         f"max_length={cfg.max_length}")
      state_id = text_state_id(first) if cfg.state_ids == "observation" else -1
      live.append(Branch(task=i, branch_id=backbone_ids[i], node=ROOT, depth=0,
                         length=len(tree.prompt), can_fork=True, state_id=state_id,
                         key=call.task_keys[i]))
    if cfg.state_ids == "snapshot":
      self._snapshot_state_ids(live, call.trees)
    call.clock.lap("reset")
    return live

  def _prefill(self, call: _Call, params, live: list[Branch]) -> sampling.DecodeState | None:
    """The backbones' prompts in one call, row i for `live[i]`."""
    decode_state = None
    if live:
      decode_state = self.sampler.init_state(self.config.batch_size(len(live)), call.mesh)
      rows = {}
      for row, branch in enumerate(live):
        branch.row = row
        rows[row] = call.trees[branch.task].prompt
        call.trees[branch.task].compute.tokens_prefilled += len(rows[row])
      decode_state = self.sampler.append(params, decode_state, rows)
      jax.block_until_ready(decode_state.next_logits)
    call.clock.lap("prefill")
    return decode_state

  def _decide(self, call: _Call, params, decode_state: sampling.DecodeState,
              live: list[Branch]) -> list[policies.Verdict]:
    """The policy's verdict at every live branch's state, in order. A fork is charged to the
    budgets as soon as it is decided, so later decisions of the turn see it."""
    entropies = self._state_entropies(call, params, decode_state, live)
    budget = TurnBudget(self.config, live)
    verdicts = []
    for branch in live:
      tree = call.trees[branch.task]
      verdict = call.policy.decide(branch, tree, float(entropies[branch.row]), budget)
      if verdict.siblings:
        budget.charge(tree, branch, verdict.siblings)
      verdicts.append(verdict)
    return verdicts

  def _fork(self, call: _Call, live: list[Branch], verdicts: Sequence[policies.Verdict]
            ) -> tuple[list[Branch], list[int], np.ndarray]:
    """Snapshots the states that fork (or that the policy keeps), starts the new branches and
    logs the decisions.

    Returns the branches in their new row order, the source row of each, and the entropy at
    each one's state.
    """
    forking = [i for i, v in enumerate(verdicts) if v.siblings]
    kept = [i for i, v in enumerate(verdicts) if v.keep_snapshot]
    snapshots = {}
    if forking or kept:
      snapshots = self.pool.snapshot_many([live[i].branch_id for i in forking + kept])
      for i in forking + kept:
        call.trees[live[i].task].compute.snapshots += 1
    siblings_of = self._start_siblings(call, live, verdicts, forking, snapshots)
    new_live, sources, entropy = [], [], []
    for index, (branch, verdict) in enumerate(zip(live, verdicts)):
      group = [branch]
      if verdict.counters is not None:  # a decision taken now
        snapshot = snapshots.get(branch.branch_id)
        if isinstance(snapshot, pool_lib.BranchFailure):
          self._end_at_failed_snapshot(call, branch, verdict, snapshot)
          continue
        group += siblings_of[index]
        decision = Decision(
            node=branch.node, depth=branch.depth, entropy=verdict.entropy,
            eligible=verdict.eligible, rule=verdict.rule, affordable=verdict.affordable,
            num_siblings=len(group), **verdict.counters,
            snapshot_digest=_digest(snapshot.data) if verdict.siblings else "")
        call.policy.record(call.trees[branch.task], branch, verdict, decision, snapshot)
      for member in group:
        new_live.append(member)
        sources.append(branch.row)
        entropy.append(verdict.entropy)
    return new_live, sources, np.asarray(entropy, np.float32)

  def _gather_rows(self, call: _Call, params, decode_state: sampling.DecodeState,
                   live: list[Branch], sources: list[int]) -> sampling.DecodeState:
    """Each branch of `live` in a row holding a copy of row `sources[i]`.

    A paged cache keeps its batch while the live branches fit its bucket (`_place_in_slots`);
    otherwise row i is `live[i]`'s, the batch gathered and padded to a batch size.
    """
    placed = None
    if self.config.kv_page_size and decode_state.batch_size == self.config.batch_size(len(live)):
      placed = self._place_in_slots(decode_state, live, sources)
    if placed is not None:
      decode_state = placed
    else:
      batch = self.config.batch_size(len(live))
      sources = sources + [sources[0]] * (batch - len(sources))
      if batch != decode_state.batch_size or sources[:len(live)] != list(range(len(live))):
        decode_state = self.sampler.take_rows(decode_state, sources, call.mesh)
      for row, branch in enumerate(live):
        branch.row = row
    decode_state = call.policy.before_decode(params, decode_state, live, call.trees)
    jax.block_until_ready(decode_state.next_logits)
    call.clock.lap("fork")
    return decode_state

  def _place_in_slots(self, decode_state: sampling.DecodeState, live: list[Branch],
                      sources: list[int]) -> sampling.DecodeState | None:
    """Rows as slots of one persistent batch: a branch still in its row keeps it, a new one
    takes a free slot (a copy of its source's row, sharing pages), rows no branch holds are
    released. None when the free slots do not suffice (the caller gathers instead)."""
    kept, new = set(), []
    for branch, source in zip(live, sources):
      if branch.row == source and source not in kept:
        kept.add(source)
      else:
        new.append((branch, source))
    free = [r for r in range(decode_state.batch_size) if r not in kept and r not in sources]
    if len(new) > len(free):
      return None
    decode_state = self.sampler.release(decode_state, free)
    decode_state = self.sampler.place(decode_state,
                                      [(source, slot) for (_, source), slot in zip(new, free)])
    for (branch, _), slot in zip(new, free):
      branch.row = slot
    unused = set(range(decode_state.batch_size)) - {b.row for b in live}
    return self.sampler.release(decode_state, sorted(unused - set(free)))

  def _decode(self, call: _Call, params, decode_state: sampling.DecodeState,
              live: list[Branch], state_entropy: np.ndarray
              ) -> tuple[sampling.DecodeState, dict[Hashable, int]]:
    """Samples an action for every row; each becomes a node of its tree. Returns the decode
    state and each branch's new node (by branch id)."""
    batch = decode_state.batch_size
    active = np.zeros((batch,), bool)
    active[[branch.row for branch in live]] = True
    decode_state, out = self.sampler.generate(params, decode_state,
                                              call.keys.action_keys(live, batch),
                                              self.sampling_params, active)
    tokens = np.asarray(out.tokens)
    logprobs = np.asarray(out.logprobs)
    num_tokens = np.asarray(out.num_tokens)
    call.decode_steps += int(num_tokens.max(initial=0))
    call.device_row_tokens += batch * int(num_tokens.max(initial=0))
    call.clock.lap("decode")
    nodes = {}
    for index, branch in enumerate(live):  # state_entropy is in live's order, tokens by row
      tree = call.trees[branch.task]
      n = int(num_tokens[branch.row])
      node = tree.add_node(branch.node, float(state_entropy[index]), branch.state_id)
      tree.action_tokens[node] = tokens[branch.row, :n].astype(np.int32)
      tree.action_logprobs[node] = logprobs[branch.row, :n].astype(np.float32)
      tree.action_texts[node] = self.fmt.decode_action(tokens[branch.row, :n])
      tree.compute.tokens_decoded += n
      branch.length += n
      nodes[branch.branch_id] = node
    call.clock.lap("host")
    return decode_state, nodes

  def _step(self, call: _Call, live: list[Branch], nodes: dict[Hashable, int]) -> dict:
    """Every branch's action in one pool call; the results by branch id."""
    steps = self.pool.step_many({b.branch_id: call.trees[b.task].action_texts[nodes[b.branch_id]]
                                 for b in live})
    call.clock.lap("env")
    return steps

  def _record(self, call: _Call, live: list[Branch], nodes: dict[Hashable, int], steps: dict
              ) -> tuple[list[Branch], dict[int, list[int]]]:
    """Records each step's outcome on its node.

    Returns the branches that go on (with those the policy starts once the others ended) and
    the observation tokens to append, by row.
    """
    cfg = self.config
    appends, going_on, finished, ended = {}, [], [], []
    for branch in live:
      tree = call.trees[branch.task]
      node, step = nodes[branch.branch_id], steps[branch.branch_id]
      tree.compute.env_steps += 1
      if isinstance(step, pool_lib.BranchFailure):
        tree.failures.append(Failure(node=node, parent=branch.node, op=step.op,
                                     reason=step.reason))
        tree.compute.failed_branches += 1
        tree.fail_node(node)
        finished.append(branch.branch_id)
        call.policy.branch_ended(tree, branch)
        continue
      observation = self._outcome(tree, branch, node, step)
      if observation is None:
        finished.append(branch.branch_id)
        ended.append(branch)
        continue
      branch.node = node
      branch.depth += 1
      branch.length += len(observation)
      if cfg.state_ids == "observation":
        branch.state_id = text_state_id(step.observation)
      appends[branch.row] = observation
      tree.compute.tokens_prefilled += len(observation)
      going_on.append(branch)
    if cfg.state_ids == "snapshot":
      self._snapshot_state_ids(going_on, call.trees)
    going_on += call.policy.after_steps(ended, call.trees)
    if finished:
      self.pool.close_many(finished)
    call.clock.lap("host")
    return going_on, appends

  def _append(self, call: _Call, params, decode_state: sampling.DecodeState,
              appends: dict[int, list[int]]) -> sampling.DecodeState:
    """The new observations, prefilled in one call."""
    if appends:
      decode_state = self.sampler.append(params, decode_state, appends)
      jax.block_until_ready(decode_state.next_logits)
    call.clock.lap("append")
    return decode_state

  # --------------------------------------------------------------------------- pieces

  def _state_entropies(self, call: _Call, params, decode_state: sampling.DecodeState,
                       live: Sequence[Branch]) -> np.ndarray:
    """float32[batch]: the entropy at each live row's state (`RolloutConfig.entropy_measure`);
    "greedy_action" probes count their tokens in `Compute.tokens_probed`."""
    cfg = self.config
    if cfg.entropy_measure == "first_token":
      return np.asarray(entropy_lib.first_token_entropy(decode_state.next_logits,
                                                        cfg.temperature))
    active = np.zeros((decode_state.batch_size,), bool)
    active[[b.row for b in live]] = True
    entropies, num_tokens = entropy_lib.greedy_action_entropy(
        self.sampler, params, decode_state, call.keys.action_keys(live, decode_state.batch_size),
        active, self.sampling_params, cfg.temperature)
    for branch in live:
      call.trees[branch.task].compute.tokens_probed += int(num_tokens[branch.row])
    return entropies

  def _start_siblings(self, call: _Call, live: list[Branch],
                      verdicts: Sequence[policies.Verdict], forking: Sequence[int],
                      snapshots: dict) -> dict[int, list[Branch]]:
    """The new branches of each forking state whose snapshot worked, by index into `live`."""
    siblings, owners = [], []
    for index in forking:
      source = live[index]
      snapshot = snapshots[source.branch_id]
      if isinstance(snapshot, pool_lib.BranchFailure):
        continue
      for child in range(1, verdicts[index].siblings + 1):
        branch = Branch(task=source.task, branch_id=call.new_branch_id(source.task),
                        node=source.node, depth=source.depth, length=source.length,
                        can_fork=call.policy.siblings_fork, state_id=source.state_id)
        siblings.append(Sibling(branch, snapshot, source.key, child))
        owners.append(index)
    siblings_of = collections.defaultdict(list)
    for index, branch in zip(owners, start_siblings(self.pool, call.keys, call.trees, siblings)):
      if branch is not None:
        siblings_of[index].append(branch)
    return siblings_of

  def _end_at_failed_snapshot(self, call: _Call, branch: Branch, verdict: policies.Verdict,
                              failure: pool_lib.BranchFailure) -> None:
    """The branch's sandbox failed at its current state: the branch ends there, its fork (if
    any) is uncharged and its decision logged with no siblings."""
    tree = call.trees[branch.task]
    parent = tree.builder.parent_of(branch.node) if branch.node != ROOT else ROOT
    tree.failures.append(Failure(node=branch.node, parent=parent, op=failure.op,
                                 reason=failure.reason))
    tree.compute.failed_branches += 1
    if verdict.siblings:
      tree.branches_started -= verdict.siblings
      tree.compute.forks -= 1
    call.policy.branch_ended(tree, branch)
    tree.decisions.append(Decision(
        node=branch.node, depth=branch.depth, entropy=verdict.entropy, eligible=verdict.eligible,
        rule=verdict.rule, affordable=verdict.affordable, num_siblings=0, **verdict.counters))
    if branch.node != ROOT:
      tree.fail_node(branch.node)
    self.pool.close(branch.branch_id)

  def _outcome(self, tree: TreeState, branch: Branch, node: int, step) -> list[int] | None:
    """Puts a step's outcome on its node; the observation tokens to append, or None if the
    branch ends here (done, or cut: the turn limit, or no room for the next action)."""
    cfg = self.config
    done = bool(step.done)
    truncated = bool(step.truncated)
    tree.observation_texts[node] = step.observation
    tree.success[node] = bool(step.info.get("success", False)) if done else False
    cut = not done and branch.depth + 1 >= cfg.max_turns
    # A reply cut by the token limit lacks its end-of-turn token; the observation supplies it.
    action = tree.action_tokens[node]
    reply_ended = len(action) > 0 and int(action[-1]) in self.fmt.stop_token_ids
    observation = ([] if done or cut else
                   self.fmt.observation_tokens(step.observation, reply_ended=reply_ended))
    if not (done or cut) and (branch.length + len(observation) + cfg.max_action_tokens
                              > cfg.max_length):
      cut, observation = True, []  # no room for the next action: a token-limit cut
    tree.builder.set_outcome(node, float(step.reward), terminal=done,
                             truncated=truncated or cut)
    tree.observation_tokens[node] = np.asarray(observation, np.int32)
    return None if done or cut else observation

  def _snapshot_state_ids(self, branches: Sequence[Branch], trees: Sequence[TreeState]) -> None:
    """Fills `state_id` from a snapshot of each branch; a failed snapshot leaves -1 (the
    branch's next step then reports the failure)."""
    if not branches:
      return
    snaps = self.pool.snapshot_many([b.branch_id for b in branches])
    for branch in branches:
      snap = snaps[branch.branch_id]
      trees[branch.task].compute.snapshots += 1
      branch.state_id = (-1 if isinstance(snap, pool_lib.BranchFailure)
                         else text_state_id(snap.data))
