"""The training loop: warm start, then rollout → estimator → update, with checkpoints and metrics.

`train(config, workdir)` runs an experiment described by a configuration (`training/config.py`)
and `evaluate(config, workdir)` scores its latest checkpoint on held-out tasks; `experiments/
run.py` and the Colab notebook both call them.

One run:

1. The word tokenizer of the environment's vocabulary is saved to `<workdir>/tokenizer` (HF
   format) and loaded back from there, and a from-scratch decoder is built from the seed; a
   held-out evaluation of the untrained model (stage "init").
2. Supervised warm start (`warm_start.*`): expert episodes of training tasks become token chains
   (`agent_format.expert_tree_tokens`), packed and fitted with the SFT step, so that a tiny model
   starts with a non-zero success rate. Then a held-out evaluation (stage "warm_start") and
   checkpoint 0. The policy-gradient optimiser continues the warm start's Adam moments.
3. Iterations 1..N: grow one tree (BPO) or group (RLOO, GRPO, GiGPO) per task with
   `rollout.RolloutEngine`, compute per-node advantages and path weights with the jitted
   estimator (vmapped over trees), pack each tree into one row (`packing.pack_trees`) and take
   one update step (`training.update`), which skips a step whose loss or gradient is NaN or Inf.
   Every `eval.every` iterations a held-out evaluation; every `checkpoint.every` a checkpoint.

Exact resume. Everything random is a function of the seed and the iteration: iteration i samples
with `fold_in(key(seed), i)`, its tasks are positions `[(i-1)·T, i·T)` of a fixed, seeded order
of the training split, and the sandboxes are deterministic. A checkpoint holds the parameters,
the optimiser state, the iteration, the key, the task position and the metrics history, so a run
killed at any point and started again with the same workdir ends with the same parameters and
the same metrics (wall-clock times aside) as a run that was never interrupted.

Several processes (`scale.distributed`, e.g. two on one machine, or the hosts of a pod) run the
same loop and end with the parameters of a one-process run (up to the order of float sums).
Every tree's randomness comes from its task's global index (`rollout`'s "Randomness"), so each
process grows the trees of its contiguous share of the iteration's tasks (and of the held-out
tasks) with its own sandboxes, and `distributed.allgather_objects` then gives every process the
whole batch: the estimator, the packing, the fork threshold and the metrics are computed
identically everywhere. The update runs on the `scale.mesh` mesh over every process's devices
(parameters and optimiser state laid out by `bpo_jax.sharding`'s rules, rows of the packed
batch over the batch axes); each process feeds its own rows (`distributed.global_batch`).
Rollouts use a whole copy of the parameters on each process's first device. The warm start runs
in every process alike. Process 0 alone writes the tokenizer, config.json, metrics.jsonl,
TensorBoard and summary.json; checkpoints are written and restored by all processes together.

Metrics per iteration (JSONL, TensorBoard, progress bar): success and return of the leaves,
advantage statistics, the update's loss, gradient norm, variance of the micro-batch gradient
norms, approximate KL to the sampling policy, token entropy, whether the step was skipped, and
the rollout's compute counters (tokens, env steps, snapshots, restores, failed branches) with
the wall time of each phase (`time/...`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Sequence

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bpo_jax import agent_format
from bpo_jax import branching
from bpo_jax import estimators
from bpo_jax import packing
from bpo_jax import rollout as rollout_lib
from bpo_jax import sharding
from bpo_jax import tree as tree_lib
from bpo_jax.models import config as model_config_lib
from bpo_jax.models import decoder as decoder_lib
from bpo_jax.sandboxes import pool as pool_lib
from bpo_jax.sandboxes import registry
from bpo_jax.training import checkpoint as checkpoint_lib
from bpo_jax.training import config as config_lib
from bpo_jax.training import distributed
from bpo_jax.training import metrics as metrics_lib
from bpo_jax.training import precision
from bpo_jax.training import tokenizer as tokenizer_lib
from bpo_jax.training import update as update_lib

# Keys a resumed run may change without breaking exactness (they do not touch the numbers).
RESUMABLE_CHANGES = ("train.iterations", "log.tensorboard", "log.progress_bar", "checkpoint.keep",
                     "env.num_workers", "env.timeout_s", "scale.distributed.process_id",
                     "scale.distributed.coordinator_address")


# ----------------------------------------------------------------------------- building blocks


def model_config_from(config, vocab_size: int) -> model_config_lib.ModelConfig:
  """The decoder's `ModelConfig` from the `model` section and the tokenizer's vocabulary (with
  the `scale` section's parameter dtype, remat and scanned layers)."""
  m = config.model
  llama = m.architecture == "llama"
  return model_config_lib.ModelConfig(
      architecture=m.architecture, vocab_size=vocab_size, hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, qkv_bias=not llama,
      tie_word_embeddings=True, max_position_embeddings=m.max_length, dtype=m.dtype,
      param_dtype=config.scale.param_dtype, remat=config.scale.remat,
      scan_layers=config.scale.scan_layers)


def rollout_config_from(config, evaluation: bool = False) -> rollout_lib.RolloutConfig:
  """The rollout engine's settings: BPO trees, baseline groups, or greedy single episodes."""
  r = config.rollout
  common = dict(max_turns=config.env.max_turns, max_new_tokens=r.max_action_tokens,
                max_length=config.model.max_length)
  if evaluation:
    return rollout_lib.RolloutConfig(
        topology="tree", fork_rule="never", max_leaves=1, temperature=config.eval.temperature,
        **common)
  state_ids = "observation" if r.estimator == "gigpo" else "none"
  if r.estimator == "bpo":
    return rollout_lib.RolloutConfig(
        topology="tree", num_siblings=r.k, fork_rule=r.fork_rule,
        entropy_measure=r.entropy_measure, entropy_threshold=r.entropy_threshold,
        fork_prob=r.fork_probability,
        max_leaves=r.max_leaves, max_env_steps=r.max_env_steps, max_tokens=r.max_tree_tokens,
        temperature=r.temperature, top_p=r.top_p, state_ids=state_ids, **common)
  return rollout_lib.RolloutConfig(
      topology="group", group_size=r.k, temperature=r.temperature, top_p=r.top_p,
      state_ids=state_ids, **common)


def update_config_from(config) -> update_lib.UpdateConfig:
  normalization = {"tree": "per_tree", "token": "per_token"}[config.train.normalization]
  return update_lib.UpdateConfig(
      num_micro_batches=config.train.micro_batches, clip_eps=config.train.clip_epsilon,
      kl_coef=config.train.kl_coef, normalization=normalization,
      temperature=config.rollout.temperature if config.rollout.temperature > 0 else 1.0)


def make_tasks(config, split: str, num: int) -> list:
  """`num` tasks of the configured environment's split ("train" or "test")."""
  env = registry.get_environment(config.env.name)
  return env.make_tasks(split, num=num, seed=config.env.task_seed, **dict(config.env.options))


def make_pool(config) -> pool_lib.SandboxPool:
  # In-process sandboxes keep no backups: there is no worker to lose.
  return pool_lib.SandboxPool.for_environment(
      config.env.name, num_workers=config.env.num_workers, timeout_s=config.env.timeout_s,
      keep_backups=config.env.num_workers > 0, **dict(config.env.options))


def environment_vocabulary(config, tasks: Sequence[Any]) -> list[str]:
  """The environment's `vocabulary()`, or, for environments without one, every word of the
  given tasks' expert episodes and of the actions admissible along them."""
  env = registry.get_environment(config.env.name)
  if hasattr(env, "vocabulary"):
    return list(env.vocabulary())
  words = set()
  sandbox = env.make_sandbox(**dict(config.env.options))
  try:
    for task in tasks:
      words.update(agent_format.split_words(sandbox.reset(task)))
      for action in sandbox.expert_actions() or []:
        if hasattr(sandbox, "admissible_actions"):
          for admissible in sandbox.admissible_actions():
            words.update(agent_format.split_words(admissible))
        step = sandbox.step(action)
        words.update(agent_format.split_words(action))
        words.update(agent_format.split_words(step.observation))
        if step.done:
          break
  finally:
    sandbox.close()
  return sorted(words - set(agent_format.SPECIAL_TOKENS))


def task_order(num_tasks: int, seed: int, start: int, count: int) -> list[int]:
  """Positions `[start, start + count)` of an endless task order: a seeded permutation of the
  training split per epoch. A pure function of its arguments (exact resume needs no state).

  Example: with 4 tasks, positions 0..3 are one permutation of 0..3 and 4..7 another.
  """
  out = []
  for position in range(start, start + count):
    epoch, offset = divmod(position, num_tasks)
    permutation = np.random.default_rng([seed, epoch]).permutation(num_tasks)
    out.append(int(permutation[offset]))
  return out


@functools.partial(jax.jit, static_argnames=("estimator", "gamma", "trees_per_task",
                                             "trunk"))
def advantages_and_weights(trees: tree_lib.RolloutTree, *, estimator: str, gamma: float,
                           trees_per_task: int = 1, trunk: str = "zero"):
  """Per-node advantages and path weights of a stacked batch of trees (vmapped estimators).

  BPO uses its sibling baselines and path weights, and for the trunk (the steps before a
  tree's first fork) a baseline that does not depend on the tree's own actions: `trunk="zero"`;
  `"loo"`, the mean root value of the other trees of its task (trees are grouped by task in
  consecutive runs of `trees_per_task`); or `"batch"`, the mean root value of every other tree
  in the batch (other tasks included: they are sampled independently of this tree, so the
  estimate stays unbiased, and with tasks of similar difficulty it removes most of the trunk's
  return variance). The baselines (one root group per task) use their own
  advantages with the path weights of a star, 1/N per episode, so that every estimator averages
  over its episodes in the same "per tree" normalisation.

  Returns:
    (advantages [T, N], weights [T, N]), zero on invalid nodes.
  """
  if estimator == "bpo":
    if trunk == "zero":
      baseline = jnp.zeros(trees.parent.shape[:1], jnp.float32)
    else:
      root = jax.vmap(lambda t: estimators.root_value(t, gamma))(trees)
      groups = root.reshape(-1, trees_per_task) if trunk == "loo" else root[None]
      baseline = jax.vmap(estimators.leave_one_out_trunk_baselines)(groups).reshape(-1)
    out = jax.vmap(lambda t, b: estimators.bpo_advantages(t, gamma=gamma, trunk_baseline=b))(
        trees, baseline)
    return out.advantages, out.weights
  fn = {"rloo": estimators.rloo_advantages, "grpo": estimators.grpo_advantages,
        "gigpo": estimators.gigpo_advantages}[estimator]
  advantages = jax.vmap(lambda t: fn(t, gamma=gamma))(trees)
  weights = jax.vmap(estimators.path_weights)(trees)
  return advantages, jnp.where(trees.valid, weights, 0.0)


def _row_count(num_rows: int, micro_batches: int) -> int:
  """Rows padded up to a multiple of the micro-batch count."""
  return -(-num_rows // micro_batches) * micro_batches


@dataclasses.dataclass
class Experiment:
  """What a run builds from its configuration before any training."""

  config: Any
  workdir: str
  tokenizer: tokenizer_lib.WordTokenizerAdapter
  fmt: agent_format.AgentFormat
  model_config: model_config_lib.ModelConfig
  graphdef: Any
  train_tasks: list
  eval_tasks: list
  pool: pool_lib.SandboxPool

  def close(self):
    self.pool.shutdown()


def build_experiment(config, workdir: str) -> tuple[Experiment, update_lib.TrainState]:
  """Tokenizer (saved to and loaded from the workdir), tasks, sandbox pool, initial model."""
  train_tasks = make_tasks(config, "train", config.env.num_train_tasks)
  eval_tasks = make_tasks(config, "test", config.env.num_eval_tasks)
  tokenizer_dir = os.path.join(workdir, "tokenizer")
  if (distributed.is_primary()
      and not os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json"))):
    tokenizer_lib.save_word_tokenizer(environment_vocabulary(config, train_tasks), tokenizer_dir)
  distributed.barrier("tokenizer saved")
  tokenizer = tokenizer_lib.load_word_tokenizer(tokenizer_dir)
  fmt = agent_format.AgentFormat.for_word_tokenizer(
      tokenizer, max_observation_tokens=config.env.max_observation_tokens or None)
  model_config = model_config_from(config, tokenizer.vocab_size)
  model = decoder_lib.Decoder(model_config, rngs=nnx.Rngs(params=config.seed))
  graphdef, params = nnx.split(model)
  state = update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=None)
  return Experiment(config=config, workdir=workdir, tokenizer=tokenizer, fmt=fmt,
                    model_config=model_config, graphdef=graphdef, train_tasks=train_tasks,
                    eval_tasks=eval_tasks, pool=make_pool(config)), state


def _with_master_weights(config, tx):
  """Low-precision parameters keep a float32 master copy in the optimizer (`scale`)."""
  if config.scale.param_dtype != "float32" and config.scale.master_weights:
    return precision.with_float32_master_weights(tx)
  return tx


def make_rl_optimizer(config):
  return _with_master_weights(config, update_lib.make_optimizer(update_lib.OptimizerConfig(
      learning_rate=config.train.learning_rate, weight_decay=config.train.weight_decay,
      max_grad_norm=config.train.max_grad_norm)))


def make_sft_optimizer(config):
  return _with_master_weights(config, update_lib.make_optimizer(update_lib.OptimizerConfig(
      learning_rate=config.warm_start.learning_rate, max_grad_norm=config.train.max_grad_norm)))


# ----------------------------------------------------------------------------- placement


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where the train state lives and how the update's batch is fed.

  One process: nothing is sharded (`mesh` None); the state stays on the default device and the
  packed batch goes in whole, as before. Several processes: the `scale.mesh` mesh over every
  process's devices, the state laid out by the sharding rules (`state_sharding`), and each
  process feeding its rows of the packed batch (`row_sharding`).
  """

  mesh: Any = None
  state_sharding: Any = None
  row_sharding: Any = None

  @classmethod
  def create(cls, config, state) -> "Placement":
    """The placement for this run's processes; `state` gives the train state's structure."""
    if jax.process_count() == 1:
      return cls()
    m = config.scale.mesh
    mesh = sharding.make_mesh(sharding.MeshConfig(data=m.data, fsdp=m.fsdp, tensor=m.tensor,
                                                  dcn_data=m.dcn_data), jax.devices())
    param_sh = sharding.param_shardings(state.params, mesh)
    state_sh = update_lib.TrainState(
        step=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), params=param_sh,
        opt_state=sharding.optimizer_shardings(state.opt_state, state.params, param_sh, mesh))
    return cls(mesh=mesh, state_sharding=state_sh, row_sharding=sharding.batch_sharding(mesh))

  @property
  def row_shards(self) -> int:
    """Devices the rows of a batch are split over (1 unsharded)."""
    if self.row_sharding is None:
      return 1
    axes = self.row_sharding.spec[0] if len(self.row_sharding.spec) else None
    axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    return int(np.prod([self.mesh.shape[a] for a in axes]))

  def place(self, state):
    """A train state every process holds alike (host or local arrays), laid out globally."""
    if self.mesh is None:
      return state
    return distributed.put_global(jax.tree.map(np.asarray, state), self.state_sharding)

  def abstract(self, state):
    """Shape, dtype (and, sharded, the layout) of each leaf: what a checkpoint restores into."""
    if self.mesh is None:
      return _abstract(state)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                        self.state_sharding)

  def local(self, tree):
    """The arrays whole on this process's first device (for rollouts and evaluations)."""
    return tree if self.mesh is None else distributed.local_copy(tree)

  def feed(self, packed: packing.PackedBatch):
    """The update's batch: the packed global batch whole, or this process's rows of it."""
    if self.mesh is None:
      return jax.tree.map(jnp.asarray, packed)
    num_rows = packed.tokens.shape[0]
    rows = distributed.process_rows(self.row_sharding, num_rows)
    local = jax.tree.map(lambda x: np.asarray(x)[rows.start:rows.stop], packed)
    return distributed.global_batch(local, self.row_sharding, num_rows)

  def host(self, tree):
    """Every leaf (a scalar metric, say) as a NumPy value on every process."""
    return distributed.to_host(tree) if self.mesh is not None else jax.tree.map(np.asarray,
                                                                                  tree)


# ----------------------------------------------------------------------------- warm start


def expert_episodes(exp: Experiment, tasks: Sequence[Any]) -> list[agent_format.ExpertEpisode]:
  """The expert's episode of each task (`sandbox.expert_actions()` from the first state)."""
  env = registry.get_environment(exp.config.env.name)
  sandbox = env.make_sandbox(**dict(exp.config.env.options))
  episodes = []
  try:
    for task in tasks:
      sandbox.reset(task)
      actions = sandbox.expert_actions()
      if not actions:
        continue
      episode = agent_format.expert_tree_tokens(exp.fmt, sandbox, task,
                                                actions[:exp.config.env.max_turns])
      episodes.append(episode)
  finally:
    sandbox.close()
  return episodes


def warm_start(exp: Experiment, params) -> tuple[Any, Any, list[dict]]:
  """Supervised steps on expert episodes of the first training tasks of the order.

  Batches of `warm_start.batch_size` episodes are drawn with a seeded generator; each episode is
  a chain packed into one row. Returns the parameters, the optimiser state (None without a warm
  start) and one metrics record per logged step.
  """
  config = exp.config
  ws = config.warm_start
  if ws.num_trajectories == 0 or ws.steps == 0:
    return params, None, []
  chosen = task_order(len(exp.train_tasks), config.seed, 0, ws.num_trajectories)
  episodes = expert_episodes(exp, [exp.train_tasks[i] for i in chosen])
  if not episodes:
    raise ValueError(f"the {config.env.name} expert solved none of the warm-start tasks")
  tx = make_sft_optimizer(config)
  state = update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                opt_state=tx.init(params))
  micro = config.train.micro_batches
  sft_step = update_lib.make_sft_step(exp.graphdef, tx, num_micro_batches=micro)
  rng = np.random.default_rng([config.seed, 1])
  ones = [np.ones(e.tokens.num_nodes, np.float32) for e in episodes]
  records = []
  start = time.perf_counter()
  for step in range(1, ws.steps + 1):
    batch_ids = rng.choice(len(episodes), size=min(ws.batch_size, len(episodes)), replace=False)
    batch = packing.pack_trees([episodes[i].tokens for i in batch_ids],
                               [ones[i] for i in batch_ids], [ones[i] for i in batch_ids],
                               num_rows=_row_count(len(batch_ids), micro))
    state, metrics = sft_step(state, jax.tree.map(jnp.asarray, batch))
    if step == ws.steps or step % max(1, ws.steps // 10) == 0:
      records.append({"phase": "warm_start", "iteration": 0, "step": step,
                      "loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
                      "expert_episodes": len(episodes),
                      "time/elapsed": time.perf_counter() - start})
      logging.info("warm start step %d/%d: loss %.4f", step, ws.steps, records[-1]["loss"])
  return state.params, state.opt_state, records


# ----------------------------------------------------------------------------- evaluation


def evaluate_policy(exp: Experiment, params, tasks: Sequence[Any], key: jax.Array,
                    confidence: float) -> dict:
  """Success rate on `tasks`, one episode each at `eval.temperature` (0: greedy), with its
  Wilson interval; also the mean return and episode length.

  With several processes each plays its share of the tasks (under their global indices) and
  the outcomes are gathered, so every process returns the same record.
  """
  engine = rollout_lib.RolloutEngine(exp.graphdef, exp.model_config, exp.fmt, exp.pool,
                                     rollout_config_from(exp.config, evaluation=True))
  start = time.perf_counter()
  share = distributed.process_share(len(tasks))
  batch = engine.rollout(params, list(tasks)[share.start:share.stop], key, task_ids=share)
  outcomes = [(bool(r.node_success[r.leaves()].any()), float(r.leaf_returns().sum()),
               int(r.tree.valid.sum())) for r in batch.rollouts]
  parts = distributed.allgather_objects((outcomes, batch.compute.failed_branches))
  outcomes = [o for part, _ in parts for o in part]
  successes = sum(success for success, _, _ in outcomes)
  low, high = metrics_lib.wilson_interval(successes, len(tasks), confidence)
  return {"success_rate": successes / len(tasks), "success_low": low, "success_high": high,
          "successes": successes, "num_tasks": len(tasks), "confidence": confidence,
          "return": metrics_lib.mean_or_zero(r for _, r, _ in outcomes),
          "episode_length": metrics_lib.mean_or_zero(n for _, _, n in outcomes),
          "failed_branches": sum(failed for _, failed in parts),
          "time/eval": time.perf_counter() - start}


def _eval_record(exp: Experiment, params, iteration: int, stage: str = "train") -> dict:
  """A held-out evaluation record; `stage` is "init" (the untrained model), "warm_start" or
  "train". `params` are whole on this process (`Placement.local`)."""
  config = exp.config
  key = jax.random.fold_in(jax.random.key(config.seed + 1), iteration)
  result = evaluate_policy(exp, params, exp.eval_tasks[:config.eval.num_tasks], key,
                           config.eval.confidence)
  return {"phase": "eval", "iteration": iteration, "stage": stage, **result}


# ----------------------------------------------------------------------------- one iteration


def _rollout_stats(batch: rollout_lib.RolloutBatch) -> dict:
  leaves_success, leaves_return = [], []
  for r in batch.rollouts:
    leaves = r.leaves()
    leaves_success.extend(r.node_success[leaves].tolist())
    leaves_return.extend(r.leaf_returns().tolist())
  out = {
      "success": metrics_lib.mean_or_zero(float(s) for s in leaves_success),
      "return": metrics_lib.mean_or_zero(leaves_return),
      "tree_success": metrics_lib.mean_or_zero(float(r.node_success[r.leaves()].any())
                                               for r in batch.rollouts),
      "leaves": len(leaves_success),
      "nodes": int(sum(int(r.tree.valid.sum()) for r in batch.rollouts)),
  }
  state_entropy = batch.state_entropies()
  decisions = sum(len(r.decisions) for r in batch.rollouts)
  out["state_entropy_mean"] = float(state_entropy.mean()) if state_entropy.size else 0.0
  out["state_entropy_p90"] = (float(np.quantile(state_entropy, 0.9)) if state_entropy.size
                              else 0.0)
  out["fork_rate"] = batch.compute.forks / max(decisions, 1)
  out.update(batch.compute.as_dict())
  out["unique_tokens"] = int(sum(r.tokens.num_unique_tokens() for r in batch.rollouts))
  out.update({f"time/rollout_{k}": v for k, v in batch.phase_seconds.items()})
  return out


def _advantage_stats(advantages: np.ndarray, weights: np.ndarray, valid: np.ndarray) -> dict:
  a = advantages[valid]
  w = weights[valid]
  if not a.size:
    return {"advantage_mean": 0.0, "advantage_std": 0.0, "advantage_abs_max": 0.0,
            "advantage_nonzero": 0.0, "weight_sum": 0.0}
  return {"advantage_mean": float(a.mean()), "advantage_std": float(a.std()),
          "advantage_abs_max": float(np.abs(a).max()),
          "advantage_nonzero": float(np.mean(a != 0)),
          "weight_sum": float(w.sum())}


def initial_fork_threshold(config) -> dict:
  """The fork threshold's running state before the first iteration (JSON-able)."""
  return {"threshold": float(config.rollout.entropy_threshold), "updates": 0}


def next_fork_threshold(config, threshold: dict, batch: rollout_lib.RolloutBatch) -> dict:
  """The threshold for the next iteration: with `rollout.entropy_quantile` > 0, an average of
  the quantiles of the state entropies seen so far (`branching.update_quantile_threshold`)."""
  quantile = config.rollout.entropy_quantile
  if quantile <= 0:
    return threshold
  running = branching.QuantileThreshold(jnp.float32(threshold["threshold"]),
                                        jnp.int32(threshold["updates"]))
  running = batch.update_threshold(running, quantile=quantile)
  return {"threshold": float(running.threshold), "updates": int(running.num_updates)}


def run_iteration(exp: Experiment, engine: rollout_lib.RolloutEngine, train_step, state,
                  iteration: int, root_key: jax.Array, threshold: dict | None = None,
                  placement: Placement | None = None):
  """One rollout → estimator → update iteration.

  With several processes (`placement` sharded), each grows the trees of its share of the tasks
  and every process then holds the whole batch (see the module docstring).

  Returns:
    (state, metrics record, the whole rollout batch, the fork threshold for the next iteration).
  """
  config = exp.config
  r = config.rollout
  placement = placement or Placement()
  threshold = threshold or initial_fork_threshold(config)
  times = {}
  start = time.perf_counter()
  # Tasks of this iteration: positions [(i-1)·T, i·T) of the order, each repeated per tree.
  positions = task_order(len(exp.train_tasks), config.seed,
                         (iteration - 1) * r.tasks_per_iteration, r.tasks_per_iteration)
  tasks = [exp.train_tasks[p] for p in positions for _ in range(r.trees_per_task)]
  key = jax.random.fold_in(root_key, iteration)
  share = distributed.process_share(len(tasks))
  batch = engine.rollout(placement.local(state.params), tasks[share.start:share.stop], key,
                         threshold=threshold["threshold"], task_ids=share)
  batch = rollout_lib.RolloutBatch.concatenate(distributed.allgather_objects(batch))
  times["time/rollout"] = time.perf_counter() - start

  start = time.perf_counter()
  trees = batch.stacked_trees()
  advantages, weights = advantages_and_weights(
      jax.tree.map(jnp.asarray, trees), estimator=r.estimator, gamma=float(r.gamma),
      trees_per_task=r.trees_per_task, trunk=r.trunk_baseline)
  advantages, weights = np.asarray(advantages), np.asarray(weights)
  # Rows: a multiple of the micro-batches, each split evenly over the devices of the batch axes.
  num_rows = _row_count(len(tasks), config.train.micro_batches * placement.row_shards)
  packed = packing.pack_trees(batch.tree_tokens(), list(advantages), list(weights),
                              num_rows=num_rows)
  times["time/estimate_and_pack"] = time.perf_counter() - start

  start = time.perf_counter()
  # PPO epochs: the same batch, its behaviour logprobs fixed, `train.epochs` times. The first
  # step's metrics are the estimator's (ratio 1); the last one's KL and clipping show how far
  # the later epochs moved the policy.
  fed = placement.feed(packed)
  skipped = 0.0
  for epoch in range(config.train.epochs):
    state, epoch_metrics = train_step(state, fed, None, len(tasks))
    epoch_metrics = {k: float(v) for k, v in placement.host(epoch_metrics).items()}
    skipped = max(skipped, epoch_metrics["skipped"])
    if epoch == 0:
      update_metrics = epoch_metrics
  if config.train.epochs > 1:
    update_metrics["last_epoch_approx_kl"] = epoch_metrics["approx_kl"]
    update_metrics["last_epoch_clip_fraction"] = epoch_metrics["clip_fraction"]
  update_metrics["skipped"] = skipped
  times["time/update"] = time.perf_counter() - start

  record = {"phase": "train", "iteration": iteration, "row_length": int(packed.shape[1]),
            "fork_threshold": threshold["threshold"]}
  record.update(_rollout_stats(batch))
  record.update(_advantage_stats(advantages, weights, np.asarray(trees.valid)))
  record.update(update_metrics)
  record["grad_norm_variance"] = update_metrics["micro_grad_norm_var"]
  record.update(times)
  if record["skipped"]:
    logging.warning("iteration %d: non-finite loss or gradient (loss %s); update skipped",
                    iteration, record["loss"])
  return state, record, batch, next_fork_threshold(config, threshold, batch)


# ----------------------------------------------------------------------------- train / evaluate


def _check_workdir_config(config, workdir: str):
  """A workdir holds one experiment: resuming with other settings would not be exact."""
  path = os.path.join(workdir, "config.json")
  current = config_lib.to_plain(config)
  env = registry.get_environment(config.env.name)
  if hasattr(env, "protections_record"):  # what the sandbox's commands are confined by
    current["env_protections"] = env.protections_record(**dict(config.env.options))
  # Every process checks the saved file before process 0 rewrites it.
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)

    def flat(d, prefix=""):
      out = {}
      for k, v in d.items():
        if isinstance(v, dict):
          out.update(flat(v, f"{prefix}{k}."))
        else:
          out[f"{prefix}{k}"] = v
      return out

    a, b = flat(saved), flat(current)
    changed = sorted(k for k in set(a) | set(b)
                     if a.get(k) != b.get(k) and k not in RESUMABLE_CHANGES)
    if changed:
      raise config_lib.ConfigError([
          f"{k}: the workdir {workdir!r} holds a run with {k} = {a.get(k)!r}, not {b.get(k)!r} "
          "(use a new workdir, or the same settings to resume)" for k in changed])
  distributed.barrier("workdir config checked")
  if distributed.is_primary():
    with open(path, "w", encoding="utf-8") as f:
      json.dump(current, f, indent=2, sort_keys=True)


def _abstract(state):
  # On this process's first device: a checkpoint written by several processes (another
  # topology) then restores here too.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)


def train(config, workdir: str, stop_after: int | None = None) -> dict:
  """Trains as configured in `workdir`, resuming from its latest checkpoint if there is one.

  Args:
    config: an experiment configuration (see `training/config.py`); validated first.
    workdir: where the tokenizer, checkpoints, metrics.jsonl, tensorboard/ and summary.json go.
    stop_after: stop after this iteration (for tests and demos; the run can be resumed).

  Returns:
    The summary: held-out success before RL (after the warm start) and at the end, with
    intervals, the iterations run, the workdir's paths.
  """
  config_lib.validate(config, "train", workdir)
  _connect_processes(config)
  os.makedirs(workdir, exist_ok=True)
  _check_workdir_config(config, workdir)
  exp, state = build_experiment(config, workdir)
  try:
    return _train(exp, state, stop_after)
  finally:
    exp.close()


def _connect_processes(config) -> None:
  """Starts JAX's distributed runtime for `scale.distributed` if the caller has not (it must
  happen before JAX computes anything; experiments/run.py does it first thing)."""
  wanted = config.scale.distributed.num_processes
  if wanted > 1 and not jax.distributed.is_initialized():
    distributed.initialize_from_config(config)
  if jax.process_count() != wanted:
    raise config_lib.ConfigError([
        f"scale.distributed.num_processes = {wanted}: JAX runs {jax.process_count()} "
        "process(es); start one process per process_id with the same coordinator_address"])


class _RecordsOnly:
  """The metrics writer of processes other than 0: records are kept (cleaned), not written."""

  def write(self, record: dict) -> dict:
    return metrics_lib.clean_record(record)

  def close(self):
    pass


def _train(exp: Experiment, state: update_lib.TrainState, stop_after: int | None) -> dict:
  config, workdir = exp.config, exp.workdir
  tx = make_rl_optimizer(config)
  local_state = update_lib.TrainState(step=state.step, params=state.params,
                                      opt_state=tx.init(state.params))
  placement = Placement.create(config, local_state)
  train_step = update_lib.make_train_step(exp.graphdef, tx, update_config_from(config),
                                          state_sharding=placement.state_sharding,
                                          batch_sharding=placement.row_sharding)
  engine = rollout_lib.RolloutEngine(exp.graphdef, exp.model_config, exp.fmt, exp.pool,
                                     rollout_config_from(config))
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                             keep=config.checkpoint.keep)
  root_key = jax.random.key(config.seed)
  abstract = placement.abstract(local_state)
  del local_state
  latest = checkpointer.latest_step()
  if latest is not None:
    state, loop = checkpointer.restore(latest, abstract)
    history, threshold = loop["history"], loop["fork_threshold"]
    if checkpoint_lib.key_to_json(root_key) != loop["key"]:
      raise ValueError("the checkpoint's RNG key does not match this configuration's seed")
    logging.info("resumed from the checkpoint of iteration %d in %s", latest, workdir)
  else:
    history = [_eval_record(exp, state.params, 0, "init")]
    params, sft_opt_state, warm_start_records = warm_start(exp, state.params)
    history += warm_start_records
    opt_state = tx.init(params)
    # The policy-gradient steps continue the warm start's Adam moments (the two optimisers
    # differ only in the learning rate, so their states have one structure). A fresh Adam's
    # first steps move every parameter by about the learning rate, sign(g) times lr, however
    # small its gradient; with the sparse gradients of a few successful episodes that is mostly
    # noise, while the warm start's second moments scale each step to that parameter's usual
    # gradient size.
    if (sft_opt_state is not None
        and jax.tree.structure(sft_opt_state) == jax.tree.structure(opt_state)):
      opt_state = sft_opt_state
    state = update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                  opt_state=opt_state)
    history.append(_eval_record(exp, state.params, 0,
                                "warm_start" if warm_start_records else "init"))
    threshold = initial_fork_threshold(config)
    # Every process ran the same warm start; from here the state is laid out over all of them.
    state = placement.place(state)
    checkpointer.save(0, state, _loop_state(0, root_key, config, history, threshold))
    latest = 0
  writer = _RecordsOnly()
  if distributed.is_primary():
    writer = metrics_lib.MetricsWriter(workdir, tensorboard=config.log.tensorboard,
                                       progress_bar=config.log.progress_bar,
                                       total_iterations=config.train.iterations,
                                       history=history)
  try:
    last = config.train.iterations if stop_after is None else min(stop_after,
                                                                  config.train.iterations)
    for iteration in range(latest + 1, last + 1):
      state, record, _, threshold = run_iteration(exp, engine, train_step, state, iteration,
                                                  root_key, threshold, placement)
      history.append(writer.write(record))
      final = iteration == config.train.iterations
      if (config.eval.every and iteration % config.eval.every == 0) or final:
        history.append(writer.write(_eval_record(exp, placement.local(state.params),
                                                 iteration)))
      if iteration % config.checkpoint.every == 0 or final:
        checkpointer.save(iteration, state,
                          _loop_state(iteration, root_key, config, history, threshold))
  finally:
    writer.close()
    checkpointer.close()
  summary = summarize(history, workdir)
  if distributed.is_primary():
    with open(os.path.join(workdir, "summary.json"), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2, sort_keys=True)
  return summary


def _loop_state(iteration: int, root_key, config, history, threshold: dict) -> dict:
  """What a checkpoint holds besides the arrays (see the module docstring)."""
  return {"iteration": iteration, "key": checkpoint_lib.key_to_json(root_key),
          "task_position": iteration * config.rollout.tasks_per_iteration,
          "fork_threshold": threshold,
          "history": [metrics_lib.clean_record(r) for r in history]}


def summarize(history: Sequence[dict], workdir: str) -> dict:
  """Held-out success of the untrained model (`eval_init`), before the first policy-gradient
  iteration (`eval_start`, after the warm start) and at the end (`eval_end`), and the
  iterations run."""
  evals = [r for r in history if r.get("phase") == "eval"]
  train_records = [r for r in history if r.get("phase") == "train"]
  summary = {"workdir": workdir, "iterations": len(train_records)}
  if evals:
    at_zero = [r for r in evals if r["iteration"] == 0]
    for name, record in (("init", evals[0]), ("start", at_zero[-1] if at_zero else evals[0]),
                         ("end", evals[-1])):
      summary[f"eval_{name}"] = {k: record[k] for k in (
          "iteration", "success_rate", "success_low", "success_high", "num_tasks")}
  return summary


def load_checkpoint(config, workdir: str):
  """(Experiment, TrainState, loop state) of the latest checkpoint in `workdir`.

  With several processes they restore it together; each gets the whole state on its first
  device.
  """
  _connect_processes(config)
  exp, state = build_experiment(config, workdir)
  tx = make_rl_optimizer(config)
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), create=False)
  try:
    latest = checkpointer.latest_step()
    if latest is None:
      raise FileNotFoundError(f"no checkpoint in {checkpointer.directory!r}; train first")
    state = update_lib.TrainState(step=state.step, params=state.params,
                                  opt_state=tx.init(state.params))
    placement = Placement.create(config, state)
    state, loop = checkpointer.restore(latest, placement.abstract(state))
    state = placement.local(state)
  finally:
    checkpointer.close()
  return exp, state, loop


def evaluate(config, workdir: str) -> dict:
  """Scores the latest checkpoint of `workdir` on `eval.num_tasks` held-out tasks.

  Writes `<workdir>/eval.json` and returns it: success rate with its Wilson interval at
  `eval.confidence`, mean return and episode length, and the checkpoint's iteration.
  """
  config_lib.validate(config, "eval", workdir)
  exp, state, loop = load_checkpoint(config, workdir)
  try:
    record = _eval_record(exp, state.params, loop["iteration"])
  finally:
    exp.close()
  record = metrics_lib.clean_record(record)
  if distributed.is_primary():
    with open(os.path.join(workdir, "eval.json"), "w", encoding="utf-8") as f:
      json.dump(record, f, indent=2, sort_keys=True)
  return record


# ----------------------------------------------------------------------------- display


def sample_tree(config, workdir: str, task_index: int = 0, seed: int = 0):
  """Grows one tree (or group) with the latest checkpoint of `workdir` on training task
  `task_index`; returns `(TaskRollout, advantages)` for `render_tree`."""
  exp, state, _ = load_checkpoint(config, workdir)
  try:
    engine = rollout_lib.RolloutEngine(exp.graphdef, exp.model_config, exp.fmt, exp.pool,
                                       rollout_config_from(config))
    batch = engine.rollout(state.params, [exp.train_tasks[task_index]], jax.random.key(seed))
  finally:
    exp.close()
  r = config.rollout
  advantages, _ = advantages_and_weights(
      jax.tree.map(jnp.asarray, batch.stacked_trees()), estimator=r.estimator,
      gamma=float(r.gamma), trees_per_task=1, trunk="zero")
  return batch.rollouts[0], np.asarray(advantages[0])


def render_tree(rollout: rollout_lib.TaskRollout, advantages: np.ndarray | None = None) -> str:
  """A text drawing of one task's rollout tree: each step's action, reward and outcome.

  Example line: `├─ take apple  r=0  A=+0.50` (A only when advantages are given); forks show as
  several children under one step.
  """
  tokens = rollout.tokens
  kids = tokens.children()
  lines = [f"[root] {rollout.first_observation[:90]}"]
  reward = np.asarray(rollout.tree.reward)

  def visit(node: int, prefix: str, last: bool):
    connector = "└─ " if last else "├─ "
    outcome = ""
    if rollout.node_success[node]:
      outcome = "  SUCCESS"
    elif bool(rollout.tree.truncated[node]):
      outcome = "  (cut)"
    elif bool(rollout.tree.terminal[node]):
      outcome = "  (end)"
    adv = "" if advantages is None else f"  A={advantages[node]:+.2f}"
    lines.append(f"{prefix}{connector}{rollout.action_texts[node] or '<empty>'}  "
                 f"r={reward[node]:g}{adv}{outcome}")
    children = kids[node]
    for j, child in enumerate(children):
      visit(child, prefix + ("   " if last else "│  "), j == len(children) - 1)

  roots = kids[tokens.num_nodes]
  for j, node in enumerate(roots):
    visit(node, "", j == len(roots) - 1)
  return "\n".join(lines)
