"""Growing rollout trees (BPO) and independent groups (baselines) with a policy and sandboxes.

One call to `RolloutEngine.rollout(params, tasks, key)` plays every task at once. Each task gets
a *backbone*: a branch (a live sandbox plus a row of the policy's KV cache) that starts at the
task's first observation. The host loop then repeats, for all live branches of all tasks together:

1. **Fork decision** at each branch's current state s_t, from what is known at s_t only: the
   policy's entropy there and the budget used so far (`bpo_jax.branching.online_fork_decision`).
   The entropy is that of the *first-token* distribution (the decode state's next logits once
   the observation is prefilled, before any action token is sampled) or, with
   `entropy_measure="greedy_action"`, the token entropies summed along the greedy action from
   s_t (a deterministic probe decode whose cache is dropped): both are functions of s_t. The
   entropy of the sampled action would make the decision depend on the action and bias the
   estimator (DESIGN.md §3), so it is never used.
2. **Fork**: the sandbox is snapshotted once and restored into K-1 new branches, and the branch's
   cache row is copied into K rows (a gather on the batch axis, `sampling.fork`): the prefix is
   never replayed. The backbone keeps its sandbox and keeps forking (budget permitting); the new
   siblings roll to termination (and fork too with `siblings_fork=True`).
3. **Decode**: one jitted `generate` call samples an action for every row (the batch is padded
   to a size from `batch_buckets`, so compiles stay bounded).
4. **Step**: every branch's action goes to the sandbox pool in one `step_many` call.
5. **Append**: the observations of the branches that go on are prefilled in one `append` call.

The group topology of the baselines (RLOO, GRPO, GiGPO) is the same loop with the decision
"fork N at the root state, never after": N independent rollouts sharing only the prompt prefill.

For comparison only, `fork_rule="top_k_after"` forks after the fact: the backbone runs to the
end (its states snapshotted), then forks at its highest-entropy states; the new siblings start
from a copy of its cache row cut back to the state (one token re-run to recover the logits
there). Where those forks go depends on the backbone's own later actions, which biases the
estimator (DESIGN.md §3).

Randomness is per branch, so a task's tree does not depend on the other tasks of the call (a
batch split across processes grows the same trees as one process). The task with global index
t (`task_ids`, default its position) has the key `fold_in(key, t)`; its backbone carries that
key. The action a branch with key k takes at depth d (the d-th state on its path) is drawn with
`child_key(k, d, 0) = fold_in(fold_in(k, d), 0)` (token s of it with `fold_in(·, s)`, see
`sampling.generate`), and sibling j = 1..K-1 of a fork there carries the key `child_key(k, d,
j)`. The random fork rule draws from a NumPy generator seeded with the task key's words.

Budgets (per tree): leaves, env steps and tokens, plus `max_turns` per branch (a branch that
reaches it is cut and marked truncated) and the cache length (a branch whose next observation
would leave no room for an action is cut too). A fork happens only if the budgets can afford
K-1 more branches. With `budget_accounting="worst_case"` every live branch is charged its most
possible remaining cost (`max_turns - depth` steps, `max_length - row length` tokens), so the
budgets are hard limits; with `"used"` only what was spent so far counts (cheaper trees may fork
more, and the budgets can be overshot by the branches' remaining lengths). Either way the
decision depends only on the state's entropy and on cost already committed, never on actions
sampled at or below s_t.

Failed branches (the pool returns a `BranchFailure` for a step, snapshot or restore) are
recorded with their reason and the rest goes on: a failed step invalidates its node and, walking
up, every ancestor left without a valid child (so an unfinished path never stands in for a
finished one); a failed restore means the sibling never started.

Output per task, `TaskRollout`: the `RolloutTree` (built with `tree.TreeBuilder`), the
`packing.TreeTokens` (prompt; per node the action tokens, their sampled logprobs and the
observation tokens), per-node action and observation texts, success, the fork decisions and the
compute counters. Every token the policy processed is counted: for a tree without failures,
tokens prefilled + tokens decoded equals `TreeTokens.num_unique_tokens()` exactly.

Example:

  engine = RolloutEngine(graphdef, model_config, fmt, pool,
                         RolloutConfig(num_siblings=4, entropy_threshold=2.0, max_leaves=8))
  batch = engine.rollout(params, tasks, jax.random.key(0))
  trees = batch.stacked_trees()              # RolloutTree with a leading task axis
  tokens = batch.tree_tokens()               # for packing.pack_trees
  batch.summary()                            # compute counters, seconds per phase
"""


from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from typing import Any, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import agent_format
from bpo_jax import branching
from bpo_jax import sampling
from bpo_jax.rollout import entropy as entropy_lib
from bpo_jax.rollout import keys as keys_lib
from bpo_jax.rollout.config import RolloutConfig
from bpo_jax.rollout.records import PHASES, ROOT, Compute, Decision, Failure, RolloutBatch
from bpo_jax.rollout.state_ids import _digest, text_state_id
from bpo_jax.rollout.tree_state import TreeState
from bpo_jax.sandboxes import pool as pool_lib

# ----------------------------------------------------------------------------- host state


@dataclasses.dataclass(frozen=True)
class _PastState:
  """A backbone state kept for forking after the fact ("top_k_after")."""

  decision: Decision   # as it would be logged without a fork
  snapshot: Any        # the sandbox at the state
  state_id: int
  cue_token: int       # the last token before the action there
  length: int          # the row's length at the state


@dataclasses.dataclass
class _Branch:
  """A live branch: a sandbox in the pool and a row of the decode state."""

  task: int
  branch_id: Hashable
  node: int             # the last step on this branch (-1: at the root state)
  depth: int            # steps taken so far
  length: int           # tokens in its cache row
  can_fork: bool
  state_id: int = -1
  row: int = -1
  key: np.ndarray | None = None  # raw words of the branch's PRNG key (see "Randomness")
  # "top_k_after": the backbone's states so far (`_PastState`), forked once it finishes.
  history: list = dataclasses.field(default_factory=list)
  # A branch started after the fact at an earlier state of a finished backbone: its row is a
  # copy of the backbone's row, to be cut back to `length` (the state's entropy is known).
  rewind_token: int | None = None
  state_entropy: float | None = None


# ----------------------------------------------------------------------------- the engine


class RolloutEngine:
  """Grows trees (or groups) for a batch of tasks with one policy and one sandbox pool.

  Args:
    graphdef: the policy's `nnx.split` graph definition.
    model_config: its `ModelConfig`.
    fmt: the conversation format (`agent_format.AgentFormat`).
    pool: a `SandboxPool` whose sandboxes play the tasks.
    config: a `RolloutConfig`.
  """

  def __init__(self, graphdef, model_config, fmt: agent_format.AgentFormat,
               pool: pool_lib.SandboxPool, config: RolloutConfig):
    self.config = config
    self.fmt = fmt
    self.pool = pool
    self.sampler = sampling.Sampler(graphdef, model_config, config.max_length)
    self.sampling_params = config.sampling_params(fmt.stop_token_ids)
    self._calls = itertools.count()
    self._keys = None  # the current call's `keys.BranchKeys`

  # --------------------------------------------------------------------------- entropy

  def _state_entropies(self, params, decode_state: sampling.DecodeState,
                       live: Sequence[_Branch], states: list[TreeState]) -> np.ndarray:
    """float32[batch]: the entropy at each live row's state (`RolloutConfig.entropy_measure`)."""
    cfg = self.config
    if cfg.entropy_measure == "first_token":
      return np.asarray(entropy_lib.first_token_entropy(decode_state.next_logits,
                                                        cfg.temperature))
    active = np.zeros((decode_state.batch_size,), bool)
    active[[b.row for b in live]] = True
    entropies, num_tokens = entropy_lib.greedy_action_entropy(
        self.sampler, params, decode_state,
        self._keys.action_keys(live, decode_state.batch_size), active, self.sampling_params,
        cfg.temperature)
    for branch in live:
      states[branch.task].compute.tokens_probed += int(num_tokens[branch.row])
    return entropies

  # --------------------------------------------------------------------------- budgets

  def _affordable(self, state: TreeState, live: Sequence[_Branch], branch: _Branch,
                  pending: tuple[int, int]) -> bool:
    """Whether the tree's budgets allow K-1 more branches from `branch`'s state.

    `pending` is the worst-case (steps, tokens) of the branches this turn's earlier decisions
    of the same tree added.
    """
    cfg = self.config
    extra = cfg.num_siblings - 1
    if cfg.max_leaves is not None and state.branches_started + extra > cfg.max_leaves:
      return False
    mine = [b for b in live if b.task == branch.task]
    worst_steps = sum(cfg.max_turns - b.depth for b in mine) + pending[0]
    worst_tokens = sum(cfg.max_length - b.length for b in mine) + pending[1]
    new_steps = extra * (cfg.max_turns - branch.depth)
    new_tokens = extra * (cfg.max_length - branch.length)
    # Every step is a node, so the node capacity is an env-step limit that always holds.
    if state.num_nodes + worst_steps + new_steps > cfg.node_capacity:
      return False
    if cfg.budget_accounting == "worst_case":
      steps_needed = state.compute.env_steps + worst_steps + new_steps
      tokens_needed = state.compute.tokens_processed + worst_tokens + new_tokens
    else:
      steps_needed = state.compute.env_steps + extra
      tokens_needed = state.compute.tokens_processed + extra
    if cfg.max_env_steps is not None and steps_needed > cfg.max_env_steps:
      return False
    if cfg.max_tokens is not None and tokens_needed > cfg.max_tokens:
      return False
    return True

  def _rule(self, entropy: float, state: TreeState, threshold: float,
            rng: np.random.Generator) -> bool:
    cfg = self.config
    max_forks = cfg.max_forks if cfg.max_forks is not None else np.iinfo(np.int32).max
    if cfg.fork_rule == "never":
      return False
    if cfg.fork_rule == "entropy":
      return bool(branching.online_fork_decision(np.float32(entropy), np.float32(threshold),
                                                 state.compute.forks, max_forks))
    return bool(rng.random() < cfg.fork_prob) and state.compute.forks < max_forks

  # --------------------------------------------------------------------------- the loop

  def rollout(self, params, tasks: Sequence[Any], key: jax.Array,
              threshold: float | None = None,
              task_ids: Sequence[int] | None = None) -> RolloutBatch:
    """Grows one tree (or group) per task; see the module docstring.

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
    cfg = self.config
    if not tasks:
      raise ValueError("rollout needs at least one task")
    threshold = cfg.entropy_threshold if threshold is None else float(threshold)
    if task_ids is None:
      task_ids = range(len(tasks))
    task_ids = [int(t) for t in task_ids]
    if len(task_ids) != len(tasks):
      raise ValueError(f"task_ids must give one index per task: {len(task_ids)} ids for "
                       f"{len(tasks)} tasks")
    if len(set(task_ids)) != len(task_ids) or min(task_ids) < 0:
      raise ValueError(f"task_ids must be distinct non-negative integers, got {task_ids}")
    self._keys = keys_lib.BranchKeys(key, cfg.batch_size)
    task_keys = self._keys.task_keys(task_ids)
    call = next(self._calls)
    seconds = dict.fromkeys(PHASES, 0.0)
    clock = [time.perf_counter()]

    def lap(phase):
      now = time.perf_counter()
      seconds[phase] += now - clock[0]
      clock[0] = now

    states = [TreeState(task, cfg.node_capacity, np.random.default_rng(words.tolist()))
              for task, words in zip(tasks, task_keys)]
    branch_numbers = itertools.count()

    def new_branch_id(task_index):
      return ("rollout", call, task_index, next(branch_numbers))

    # Reset every task's backbone.
    backbone_ids = {i: new_branch_id(i) for i in range(len(tasks))}
    observations = self.pool.reset_many({backbone_ids[i]: t for i, t in enumerate(tasks)})
    live: list[_Branch] = []
    for i, state in enumerate(states):
      state.branches_started = 1
      first = observations[backbone_ids[i]]
      if isinstance(first, pool_lib.BranchFailure):
        state.failures.append(Failure(ROOT, ROOT, first.op, first.reason))
        state.compute.failed_branches += 1
        self.pool.close(backbone_ids[i])
        continue
      state.first_observation = first
      state.prompt = self.fmt.prompt_tokens(first)
      if len(state.prompt) + cfg.max_new_tokens > cfg.max_length:
        self.pool.close_many(list(backbone_ids.values()))
        raise ValueError(f"task {i}: the prompt has {len(state.prompt)} tokens; with "
                         f"max_new_tokens={cfg.max_new_tokens} it does not fit "
                         f"max_length={cfg.max_length}")
      live.append(_Branch(task=i, branch_id=backbone_ids[i], node=ROOT, depth=0,
                          length=len(state.prompt), can_fork=True,
                          state_id=self._initial_state_id(first), key=task_keys[i]))
    if cfg.state_ids == "snapshot":
      self._snapshot_state_ids(live, states)
    lap("reset")

    device_row_tokens = 0
    turns = 0
    decode_state = None
    if live:
      decode_state = self.sampler.init_state(cfg.batch_size(len(live)))
      rows = {}
      for row, branch in enumerate(live):
        branch.row = row
        rows[row] = states[branch.task].prompt
        states[branch.task].compute.tokens_prefilled += len(rows[row])
      decode_state = self.sampler.append(params, decode_state, rows)
      jax.block_until_ready(decode_state.next_logits)
    lap("prefill")

    while live:
      turns += 1
      # 1-2. Fork decisions at every live state, then snapshots, restores and the row gather.
      entropies = self._state_entropies(params, decode_state, live, states)
      live, sources, state_entropy = self._fork(live, states, entropies, threshold,
                                                new_branch_id)
      if not live:
        lap("fork")
        break
      batch = cfg.batch_size(len(live))
      sources = sources + [sources[0]] * (batch - len(sources))
      if (batch != decode_state.batch_size
          or sources[:len(live)] != list(range(len(live)))):
        decode_state = sampling.take_rows(decode_state, sources)
      for row, branch in enumerate(live):
        branch.row = row
      decode_state = self._rewind(params, decode_state, live, states)
      active = np.zeros((batch,), bool)
      active[:len(live)] = True
      jax.block_until_ready(decode_state.next_logits)
      lap("fork")

      # 3. One decode call for every row of every tree.
      decode_state, out = self.sampler.generate(params, decode_state,
                                                self._keys.action_keys(live, batch),
                                                self.sampling_params, active)
      tokens = np.asarray(out.tokens)
      logprobs = np.asarray(out.logprobs)
      num_tokens = np.asarray(out.num_tokens)
      device_row_tokens += batch * int(num_tokens.max(initial=0))
      lap("decode")

      # Host: a node per branch, its action text.
      actions = {}
      nodes = {}
      for branch in live:
        state = states[branch.task]
        n = int(num_tokens[branch.row])
        node = state.add_node(branch.node, float(state_entropy[branch.row]), branch.state_id)
        state.action_tokens[node] = tokens[branch.row, :n].astype(np.int32)
        state.action_logprobs[node] = logprobs[branch.row, :n].astype(np.float32)
        state.action_texts[node] = self.fmt.decode_action(tokens[branch.row, :n])
        state.compute.tokens_decoded += n
        branch.length += n
        nodes[branch.branch_id] = node
        actions[branch.branch_id] = state.action_texts[node]
      lap("host")

      # 4. One pool call steps every branch.
      steps = self.pool.step_many(actions)
      lap("env")

      # Outcomes; the observations of branches that go on are appended in one call.
      appends = {}
      going_on = []
      finished = []
      after_the_fact = []  # "top_k_after": backbones that just finished
      for branch in live:
        state = states[branch.task]
        node = nodes[branch.branch_id]
        step = steps[branch.branch_id]
        state.compute.env_steps += 1
        if isinstance(step, pool_lib.BranchFailure):
          state.failures.append(Failure(node, branch.node, step.op, step.reason))
          state.compute.failed_branches += 1
          state.fail_node(node)
          finished.append(branch.branch_id)
          # A failed backbone leaves no valid state to fork after the fact.
          state.decisions.extend(past.decision for past in branch.history)
          continue
        done = bool(step.done)
        truncated = bool(step.truncated)
        state.observation_texts[node] = step.observation
        state.success[node] = bool(step.info.get("success", False)) if done else False
        cut = not done and branch.depth + 1 >= cfg.max_turns
        observation = [] if done or cut else self.fmt.observation_tokens(step.observation)
        if not (done or cut) and (branch.length + len(observation) + cfg.max_new_tokens
                                  > cfg.max_length):
          cut, observation = True, []  # no room for the next action: a token-limit cut
        state.builder.set_outcome(node, float(step.reward), terminal=done,
                                  truncated=truncated or cut)
        state.observation_tokens[node] = np.asarray(observation, np.int32)
        if done or cut:
          finished.append(branch.branch_id)
          if branch.history:
            after_the_fact.append(branch)
          continue
        branch.node = node
        branch.depth += 1
        branch.length += len(observation)
        if cfg.state_ids == "observation":
          branch.state_id = text_state_id(step.observation)
        appends[branch.row] = observation
        state.compute.tokens_prefilled += len(observation)
        going_on.append(branch)
      if cfg.state_ids == "snapshot":
        self._snapshot_state_ids(going_on, states)
      going_on += self._fork_after_the_fact(after_the_fact, states, new_branch_id)
      if finished:
        self.pool.close_many(finished)
      lap("host")

      # 5. Continued prefill of the new observations.
      live = going_on
      if appends:
        decode_state = self.sampler.append(params, decode_state, appends)
        jax.block_until_ready(decode_state.next_logits)
      lap("append")

    total = Compute()
    for state in states:
      total.add(state.compute)
    return RolloutBatch(rollouts=[s.result() for s in states], compute=total,
                        phase_seconds=seconds, device_row_tokens=device_row_tokens,
                        turns=turns, threshold=threshold)

  # --------------------------------------------------------------------------- pieces

  def _fork_after_the_fact(self, backbones: Sequence[_Branch], states: list[TreeState],
                           new_branch_id) -> list[_Branch]:
    """With "top_k_after": forks each finished backbone at its highest-entropy states.

    The new branches restore the state's snapshot and start from a copy of the backbone's cache
    row, cut back to the state by `_rewind`. Logs the backbone's decisions; returns the new
    branches.
    """
    cfg = self.config
    requests = {}  # new branch id -> (backbone, index into its history, the new branch)
    children = []  # each new branch's place among the actions tried at its state (1..K-1)
    for backbone in backbones:
      state = states[backbone.task]
      history = backbone.history
      k = min(cfg.max_forks, len(history))
      if not k:
        continue
      entropy = jnp.asarray([past.decision.entropy for past in history], jnp.float32)
      picked = branching.top_k_fork_steps(entropy, jnp.ones(len(history), bool), k)
      for index in sorted(int(i) for i in np.asarray(picked) if i >= 0):
        past = history[index]
        state.compute.forks += 1
        state.branches_started += cfg.num_siblings - 1
        for child in range(1, cfg.num_siblings):
          branch_id = new_branch_id(backbone.task)
          children.append(child)
          requests[branch_id] = (backbone, index, _Branch(
              task=backbone.task, branch_id=branch_id, node=past.decision.node,
              depth=past.decision.depth, length=past.length, can_fork=False,
              state_id=past.state_id, row=backbone.row, rewind_token=past.cue_token,
              state_entropy=past.decision.entropy))
    # Each new branch's key: `child_key(backbone key, depth of the state, child)`.
    keys = self._keys.child_key_data([backbone.key for backbone, _, _ in requests.values()],
                                [branch.depth for _, _, branch in requests.values()],
                                children)
    for n, (_, _, branch) in enumerate(requests.values()):
      branch.key = keys[n]
    restored = self.pool.restore_many(
        {b: backbone.history[index].snapshot for b, (backbone, index, _) in requests.items()})
    siblings = collections.Counter()
    out = []
    for branch_id, (backbone, index, branch) in requests.items():
      if not self._restored(states[backbone.task], branch.node, branch_id, restored[branch_id]):
        continue
      siblings[(backbone.branch_id, index)] += 1
      out.append(branch)
    forked = {(backbone.branch_id, index) for backbone, index, _ in requests.values()}
    for backbone in backbones:
      for index, past in enumerate(backbone.history):
        decision = past.decision
        if (backbone.branch_id, index) in forked:
          decision = dataclasses.replace(
              decision, rule=True, affordable=True,
              num_siblings=1 + siblings[(backbone.branch_id, index)],
              snapshot_digest=_digest(past.snapshot.data))
        states[backbone.task].decisions.append(decision)
      backbone.history = []
    return out

  def _rewind(self, params, decode_state: sampling.DecodeState, live: Sequence[_Branch],
              states: list[TreeState]) -> sampling.DecodeState:
    """Cuts the rows of branches started after the fact back to their state.

    Such a row is a copy of the finished backbone's row, whose first `length` slots hold the
    path to the state. Its length is set to `length - 1` and the state's last token (the action
    cue) is appended again, which recomputes the next-token logits there; later appends
    overwrite the stale slots, which no query attends before then.
    """
    rewinds = {b.row: b for b in live if b.rewind_token is not None}
    if not rewinds:
      return decode_state
    lengths = np.asarray(decode_state.cache.lengths).copy()
    for row, branch in rewinds.items():
      lengths[row] = branch.length - 1
    cache = decode_state.cache.replace(lengths=jnp.asarray(lengths, jnp.int32))
    decode_state = decode_state.replace(cache=cache)
    decode_state = self.sampler.append(params, decode_state,
                                       {row: [b.rewind_token] for row, b in rewinds.items()})
    for branch in rewinds.values():
      states[branch.task].compute.tokens_prefilled += 1
      branch.rewind_token = None
    return decode_state

  def _restored(self, state: TreeState, node: int, branch_id, result) -> bool:
    """Counts one restore into `branch_id`; a failed one is recorded against `node` (the step
    whose sibling it was to start), its branch closed, and False returned."""
    state.compute.restores += 1
    if not isinstance(result, pool_lib.BranchFailure):
      return True
    state.failures.append(Failure(ROOT, node, "restore", result.reason))
    state.compute.failed_branches += 1
    self.pool.close(branch_id)
    return False

  def _initial_state_id(self, observation: str) -> int:
    return text_state_id(observation) if self.config.state_ids == "observation" else -1

  def _snapshot_state_ids(self, branches: Sequence[_Branch], states: list[TreeState]) -> None:
    """Fills `state_id` from a snapshot of each branch; a failed snapshot leaves -1 (the
    branch's next step then reports the failure)."""
    if not branches:
      return
    snaps = self.pool.snapshot_many([b.branch_id for b in branches])
    for branch in branches:
      snap = snaps[branch.branch_id]
      states[branch.task].compute.snapshots += 1
      branch.state_id = (-1 if isinstance(snap, pool_lib.BranchFailure)
                         else text_state_id(snap.data))

  def _fork(self, live: list[_Branch], states: list[TreeState], entropies: np.ndarray,
            threshold: float, new_branch_id):
    """Decides at every live state, forks the chosen ones.

    Returns (the branches in their new row order, the source row of each, and the first-token
    entropy of each new row's state).
    """
    cfg = self.config
    wanted: dict[int, int] = {}   # index into live -> siblings to add
    verdicts = {}
    pending = collections.defaultdict(lambda: (0, 0))  # task -> worst-case (steps, tokens) added
    history_wanted = []  # "top_k_after": backbones whose state is snapshotted for later
    for index, branch in enumerate(live):
      state = states[branch.task]
      entropy = float(entropies[branch.row])
      seen = dict(forks_used=state.compute.forks, leaves_started=state.branches_started,
                  env_steps_used=state.compute.env_steps,
                  tokens_used=state.compute.tokens_processed)
      if branch.state_entropy is not None:
        # Started after the fact at an already decided state: no second decision there.
        verdicts[index] = (branch.state_entropy, False, False, False, None)
      elif cfg.topology == "tree" and cfg.fork_rule == "top_k_after" and branch.can_fork:
        verdicts[index] = (entropy, True, False, False, seen)  # decided when it finishes
        history_wanted.append(index)
      elif cfg.topology == "group":
        eligible = branch.node == ROOT and branch.can_fork
        rule = affordable = eligible
        extra = cfg.group_size - 1 if eligible else 0
      else:
        eligible = branch.can_fork
        rule = eligible and self._rule(entropy, state, threshold, state.rule_rng)
        affordable = rule and self._affordable(state, live, branch, pending[branch.task])
        extra = cfg.num_siblings - 1 if affordable else 0
      if index in verdicts:
        continue
      verdicts[index] = (entropy, eligible, rule, affordable, seen)
      if extra:
        wanted[index] = extra
        # Charge the budget now, so later decisions in this turn see it.
        state.compute.forks += 1
        state.branches_started += extra
        steps, tokens = pending[branch.task]
        pending[branch.task] = (steps + extra * (cfg.max_turns - branch.depth),
                                tokens + extra * (cfg.max_length - branch.length))

    snapshots = {}
    if wanted or history_wanted:
      snapshots = self.pool.snapshot_many([live[i].branch_id for i in [*wanted,
                                                                          *history_wanted]])
    restore_requests = {}
    for index, extra in wanted.items():
      branch = live[index]
      state = states[branch.task]
      state.compute.snapshots += 1
      snap = snapshots[branch.branch_id]
      if isinstance(snap, pool_lib.BranchFailure):
        continue
      for child in range(1, extra + 1):
        restore_requests[new_branch_id(branch.task)] = (index, snap, child)
    restored = self.pool.restore_many({b: s for b, (_, s, _) in restore_requests.items()})
    sibling_keys = self._keys.child_key_data(
        [live[i].key for i, _, _ in restore_requests.values()],
        [live[i].depth for i, _, _ in restore_requests.values()],
        [child for _, _, child in restore_requests.values()])

    new_live, sources, row_entropy = [], [], []
    siblings_of = collections.defaultdict(list)
    for n, (new_id, (index, _, _)) in enumerate(restore_requests.items()):
      source = live[index]
      if not self._restored(states[source.task], source.node, new_id, restored[new_id]):
        continue
      siblings_of[index].append(_Branch(
          task=source.task, branch_id=new_id, node=source.node, depth=source.depth,
          length=source.length,
          can_fork=cfg.siblings_fork and cfg.topology == "tree",
          state_id=source.state_id, key=sibling_keys[n]))
    for index, branch in enumerate(live):
      state = states[branch.task]
      entropy, eligible, rule, affordable, seen = verdicts[index]
      snap = snapshots.get(branch.branch_id)
      if index in history_wanted:
        state.compute.snapshots += 1
        if not isinstance(snap, pool_lib.BranchFailure):
          branch.history.append(_PastState(
              Decision(branch.node, branch.depth, entropy, True, False, False, 1, **seen),
              snap, branch.state_id, state.cue_token(branch.node), branch.length))
          new_live.append(branch)
          sources.append(branch.row)
          row_entropy.append(entropy)
          continue
      if branch.state_entropy is not None:
        branch.state_entropy = None
        new_live.append(branch)
        sources.append(branch.row)
        row_entropy.append(entropy)
        continue
      if isinstance(snap, pool_lib.BranchFailure):
        # The branch's sandbox failed at its current state: the branch ends here.
        parent = state.builder.parent_of(branch.node) if branch.node != ROOT else ROOT
        state.failures.append(Failure(branch.node, parent, snap.op, snap.reason))
        state.compute.failed_branches += 1
        if index in wanted:
          state.branches_started -= wanted[index]
          state.compute.forks -= 1
        state.decisions.extend(past.decision for past in branch.history)
        state.decisions.append(Decision(branch.node, branch.depth, entropy, eligible, rule,
                                        affordable, 0, **seen))
        if branch.node != ROOT:
          state.fail_node(branch.node)
        self.pool.close(branch.branch_id)
        continue
      group = [branch] + siblings_of[index]
      if cfg.topology == "group" and branch.node == ROOT:
        branch.can_fork = False
      state.decisions.append(Decision(
          branch.node, branch.depth, entropy, eligible, rule, affordable, len(group), **seen,
          snapshot_digest=_digest(snap.data) if snap is not None else ""))
      for member in group:
        new_live.append(member)
        sources.append(branch.row)
        row_entropy.append(entropy)
    return new_live, sources, np.asarray(row_entropy, np.float32)
