"""The training loop: warm start, then rollout → estimator → update, with checkpoints and metrics.

`train(config, workdir)` runs an experiment described by a configuration (`training/config.py`),
`evaluate(config, workdir)` scores its latest checkpoint on held-out tasks and `export(config,
workdir, export_dir)` writes that checkpoint as an HF directory; `experiments/run.py` and the
Colab notebook call them. This module starts, resumes and checkpoints a
run; the parts it calls each do one job:

  settings.py    the configuration read once into typed, frozen settings, which the parts take
  translate.py   the settings -> ModelConfig, RolloutConfig, UpdateConfig, optimisers, mesh
  experiment.py  tasks, sandbox pool, tokenizer and initial model; the seeded task order
  warm_start.py  supervised steps on expert episodes
  evaluation.py  held-out success with its interval
  placement.py   where the train state lives, how the update's batch is fed
  iteration.py   one rollout → estimator → packing → update iteration and its metrics
  startup.py     the sampler's and the update's programs compiled before the first rollout
  estimator_registry.py  the estimators by name (advantage function, topology)
  display.py     one tree grown with a checkpoint, drawn as text

One run:

1. The run's chat format (`text.build`): a byte-level BPE tokenizer trained on the
   environment's text and saved to `<workdir>/tokenizer` (HF format, loaded back from there),
   or `model.checkpoint`'s tokenizer and chat template; the path budgets are checked in its
   token counts; the decoder is `model.checkpoint`'s or built from the seed (with
   `model.lora_rank > 0` only its adapters train: the train state holds them alone, over a
   frozen base rebuilt on every start); a held-out evaluation of the untrained model (stage
   "init").
2. Supervised warm start (`warm_start.*`): expert episodes of training tasks become token chains
   (`text.expert_tree_tokens`), packed and fitted with the SFT step, so that a tiny model
   starts with a non-zero success rate. Then a held-out evaluation (stage "warm_start"; none
   without a warm start, whose run starts from the untrained model's) and
   checkpoint 0. The policy-gradient optimiser continues the warm start's Adam moments. With
   `train.kl_coef > 0` the parameters at this point are the KL term's frozen reference.
3. Iterations 1..N: grow one tree (BPO) or group (RLOO, GRPO, GiGPO) per task with
   `rollout.RolloutEngine`, compute per-node advantages and path weights with the jitted
   estimator (vmapped over trees), pack each tree into one row (`packing.pack_trees`) and take
   one update step (`training.update`), which skips a step whose loss or gradient is NaN or Inf;
   `train.max_skipped_updates` skipped iterations in a row stop the run
   (`iteration.NonFiniteUpdates`).
   Every `eval.every` iterations a held-out evaluation; every `checkpoint.every` a checkpoint.

Exact resume. Everything random is a function of the seed and the iteration: iteration i samples
with `fold_in(key(seed), i)`, its tasks are positions `[(i-1)·T, i·T)` of a fixed, seeded order
of the training split, and the sandboxes are deterministic. A checkpoint holds the parameters,
the optimiser state, the iteration, the key, the task position and the metrics history, so a run
killed at any point and started again with the same workdir ends with the same parameters and
the same metrics (wall-clock times aside) as a run that was never interrupted; a checkpoint that
does not restore is named and the one before it used (`checkpoint.py`). The workdir is the run's
record, locked while a run uses it (`workdir.py`): a resume, `evaluate` and `export` are
checked against its config.json (`RESUMABLE_CHANGES`, `EVAL_CHANGES`). The KL term's
reference parameters are saved in every checkpoint beside the train state (`_checkpoint_tree`),
so a resumed run keeps the reference of the run it continues.

Where the update runs. On the `scale.mesh` mesh (data x fsdp x tensor) over the run's devices,
in one process or many (`placement.py`): parameters and optimiser state laid out by
`bpo_jax.sharding`'s rules, rows of the packed batch over the batch axes ("data", "fsdp"). One
device is the unsharded case. Several processes (`scale.distributed`, e.g. two on one machine,
or the hosts of a pod) run the same loop and end with the parameters of a one-process run (up to
the order of float sums). Every tree's randomness comes from its task's global index
(`rollout`'s "Randomness"), so each process grows the trees of its contiguous share of the
iteration's tasks (and of the held-out tasks) with its own sandboxes, and
`distributed.allgather_objects` then gives every process the whole batch: the estimator, the
packing, the fork threshold and the metrics are computed identically everywhere, and each
process feeds its own rows of the packed batch (`distributed.global_batch`). Rollouts and
evaluations sample on the same devices: once per iteration the parameters move device to device
from the training layout to the sampling layout, and each process decodes its trees' rows on its
own devices (`Placement.for_sampling`). The warm start runs on the mesh like the update (each
process feeding its rows of every supervised batch). Process 0 alone writes the tokenizer,
config.json, metrics.jsonl, TensorBoard and summary.json; checkpoints are written and restored by
all processes together.

Metrics per iteration (JSONL, TensorBoard, progress bar): success and return of the leaves,
advantage statistics, the update's loss, gradient norm, variance of the micro-batch gradient
norms, approximate KL to the sampling policy, the k3 KL to the reference (`kl_ref`, with
`train.kl_coef > 0`), token entropy, whether the step was skipped, and
the rollout's compute counters (tokens, env steps, snapshots, restores, failed branches) with
the wall time of each phase (`time/...`), and the bytes of the train state, whole
(`state_bytes`) and on the device holding the most of it (`state_bytes_per_device`), the same of
the parameters in the sampling layout (`sample_bytes`, `sample_bytes_per_device`) and the
devices the trees were decoded on (`decode_devices`, summed over the processes).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any, Callable, NamedTuple, Sequence

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp

from bpo_jax.models import params as params_lib
from bpo_jax.training import checkpoint as checkpoint_lib
from bpo_jax.training import compile_cache
from bpo_jax.training import config as config_lib
from bpo_jax.training import distributed
from bpo_jax.training import evaluation
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import iteration as iteration_lib
from bpo_jax.training import metrics as metrics_lib
from bpo_jax.training import placement as placement_lib
from bpo_jax.training import settings as settings_lib
from bpo_jax.training import startup as startup_lib
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib
from bpo_jax.training import warm_start as warm_start_lib
from bpo_jax.training import workdir as workdir_lib

# Keys a resumed run may change without breaking exactness (they do not touch the numbers).
RESUMABLE_CHANGES = ("train.iterations", "log.tensorboard", "log.progress_bar", "checkpoint.keep",
                     "env.num_workers", "env.timeout_s", "scale.distributed.process_id",
                     "scale.distributed.coordinator_address", "scale.compile_cache_dir",
                     "scale.startup_compile")
# Keys `evaluate` and `export` may set otherwise than the run's record: how many held-out tasks
# and how they are played, and where the checkpoint is restored (its arrays are the same on any
# mesh). Everything else decides which model the checkpoint holds and how it is read.
EVAL_CHANGES = RESUMABLE_CHANGES + (
    "eval.num_tasks", "eval.temperature", "eval.confidence", "eval.every", "env.num_eval_tasks",
    "scale.num_devices", "scale.decode_batch", "scale.mesh.data", "scale.mesh.fsdp",
    "scale.mesh.tensor", "scale.mesh.dcn_data", "scale.distributed.num_processes")


def _check_workdir_config(settings, workdir: str, keys_set=(), may_change=RESUMABLE_CHANGES):
  """A workdir holds one experiment (`workdir.py`): resuming with other settings would not be
  exact, and a checkpoint restores only into its own model. Returns the configuration record to
  save (`_write_workdir_config`), with the keys the run's command lines set (`keys_set` now)."""
  current = workdir_lib.config_record(settings)
  # Every process checks the saved file before process 0 rewrites it.
  saved = workdir_lib.require_record(workdir)
  if saved is not None:
    recorded = {k: v for k, v in saved.items() if k != workdir_lib.FLAG_KEYS}
    changed = config_lib.saved_differences(recorded, current, may_change)
    if changed:
      raise config_lib.ConfigError([
          f"{k}: the workdir {workdir!r} holds a run with {k} = {was!r}, not {now!r} "
          "(use a new workdir, or the same settings to resume)"
          for k, (was, now) in changed.items()])
  current[workdir_lib.FLAG_KEYS] = workdir_lib.record_keys(saved, keys_set)
  distributed.barrier("workdir config checked")
  return current


def _write_workdir_config(current: dict, workdir: str) -> None:
  """Saves the checked configuration (`_check_workdir_config`) once the run is built, whole
  (`workdir.write_json`), when it differs from the saved one."""
  if distributed.is_primary() and workdir_lib.read_record(workdir) != current:
    workdir_lib.write_json(os.path.join(workdir, workdir_lib.CONFIG), current)


def train(config, workdir: str, stop_after: int | None = None, keys_set=()) -> dict:
  """Trains as configured in `workdir`, resuming from its latest checkpoint if there is one.

  Args:
    config: an experiment configuration (see `training/config.py`); validated first, then read
      once into the run's `Settings` (`training/settings.py`), which the parts take.
    workdir: where the tokenizer, checkpoints, metrics.jsonl, tensorboard/ and summary.json go.
    stop_after: stop after this iteration (for tests and demos; the run can be resumed).
    keys_set: the keys the command line set (`--config.KEY=V`), recorded in config.json so
      that later commands on the workdir take their values from it (`workdir.apply_record`).

  Returns:
    The summary: held-out success before RL (after the warm start) and at the end, with
    intervals, the iterations run, the workdir's paths.
  """
  config_lib.validate(config, "train", workdir)
  settings = settings_lib.from_config(config)
  compile_cache.enable(settings.scale.compile_cache_dir)  # before the run's first compile
  _connect_processes(settings)
  created = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  with workdir_lib.lock_run(workdir, "train"):
    checked = _check_workdir_config(settings, workdir, keys_set)
    try:
      exp, state = experiment_lib.build_experiment(settings, workdir)
    except BaseException:
      # Nothing half-written: a run that cannot be built leaves no workdir it created.
      if created and distributed.is_primary():
        shutil.rmtree(workdir, ignore_errors=True)
      raise
    _write_workdir_config(checked, workdir)
    try:
      return _train(exp, state, stop_after)
    finally:
      exp.close()


def _connect_processes(settings) -> None:
  """Starts JAX's distributed runtime for `scale.distributed` if the caller has not (it must
  happen before JAX computes anything; experiments/run.py does it first thing), and checks
  that the run's devices form the configured mesh."""
  wanted = settings.scale.distributed.num_processes
  if wanted > 1 and not jax.distributed.is_initialized():
    distributed.initialize_from_settings(settings.scale.distributed)
  if jax.process_count() != wanted:
    raise config_lib.ConfigError([
        f"scale.distributed.num_processes = {wanted}: JAX runs {jax.process_count()} "
        "process(es); start one process per process_id with the same coordinator_address"])
  placement_lib.run_devices(settings)  # the configured mesh fits the devices, before any work


class _RecordsOnly:
  """The metrics writer of processes other than 0: records are kept (cleaned), not written."""

  def write(self, record: dict) -> dict:
    return metrics_lib.clean_record(record)

  def close(self):
    pass


class UpdateSetup(NamedTuple):
  """The policy-gradient optimiser, the train state's structure (shapes and dtypes, no values),
  where the state lives and the jitted update: what `train` runs every iteration."""

  tx: Any
  local_state: update_lib.TrainState
  placement: placement_lib.Placement
  train_step: Callable


def build_update(exp: experiment_lib.Experiment, params) -> UpdateSetup:
  """The run's optimiser, placement (`scale.mesh` over its devices) and jitted update step,
  for the trainable `params` (their structure; the values are not kept)."""
  return make_update(exp.settings, exp.graphdef, params)


def make_update(settings, graphdef, params) -> UpdateSetup:
  """`build_update` from the configuration and the model's graph definition alone.

  `params` may be arrays or `jax.ShapeDtypeStruct`s: only their structure is read and no
  optimiser state is allocated (`jax.eval_shape`), so the dry run (`dry_run.py`) compiles the
  update a 7B run executes without making its parameters.
  """
  tx = translate.rl_optimizer(settings)
  local_state = jax.eval_shape(
      lambda p: update_lib.TrainState(step=jnp.zeros((), jnp.int32), params=p,
                                      opt_state=tx.init(p)), params)
  placement = placement_lib.Placement.create(settings, local_state)
  use_ref = settings.train.kl_coef > 0
  train_step = update_lib.make_train_step(graphdef, tx, translate.update_config(settings),
                                          ref_params=params if use_ref else None,
                                          state_sharding=placement.state_sharding,
                                          batch_sharding=placement.row_sharding)
  return UpdateSetup(tx, local_state, placement, train_step)


def _train(exp: experiment_lib.Experiment, state: update_lib.TrainState,
           stop_after: int | None) -> dict:
  settings, workdir = exp.settings, exp.workdir
  setup = build_update(exp, state.params)
  tx, local_state, placement, _ = setup
  exp = dataclasses.replace(exp, frozen=placement.place_frozen(exp.frozen))
  use_ref = settings.train.kl_coef > 0
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                             keep=settings.checkpoint.keep)
  root_key = jax.random.key(settings.seed)
  abstract = _checkpoint_tree(placement.abstract(local_state), use_ref)
  del local_state
  # The latest checkpoint that restores; those after it are set aside (checkpoint.py).
  restored = checkpointer.restore_latest(abstract, _check_loop_state(root_key), set_aside=True)
  last = (settings.train.iterations if stop_after is None
          else min(stop_after, settings.train.iterations))
  # The rollout engine and the update, their programs compiled here where that applies and an
  # iteration is left to run them (a resume of a finished run compiles nothing).
  exp, engine, train_step, startup_record = startup_lib.start(
      exp, setup, state.params, compile_set=last > (0 if restored is None else restored[0]))
  if restored is not None:
    latest, tree, loop = restored
    (state, ref), loop = _from_checkpoint_tree((tree, loop))
    history, threshold = loop["history"], loop["fork_threshold"]
    logging.info("resumed from the checkpoint of iteration %d in %s", latest, workdir)
  else:
    # The initial parameters (alike in every process) laid out over the run's devices: the
    # warm start runs there like the update.
    state, history = _start(exp, placement.place_params(state.params), tx, placement)
    threshold = iteration_lib.initial_fork_threshold(settings)
    # The KL term's reference: the parameters the policy gradient starts from (own buffers: the
    # update donates the train state's).
    ref = jax.tree.map(jnp.copy, state.params) if use_ref else None
    checkpointer.save(0, _checkpoint_tree(state, use_ref, ref),
                      _loop_state(0, root_key, settings, history, threshold))
    latest = 0
  writer = _RecordsOnly()
  if distributed.is_primary():
    writer = metrics_lib.MetricsWriter(workdir, tensorboard=settings.log.tensorboard,
                                       progress_bar=settings.log.progress_bar,
                                       total_iterations=settings.train.iterations,
                                       history=history)
  if startup_record is not None:
    history.append(writer.write(dict(startup_record, iteration=latest)))
  try:
    for iteration in range(latest + 1, last + 1):
      state, record, _, threshold = iteration_lib.run_iteration(
          exp, engine, train_step, state, iteration, root_key, threshold, placement, ref)
      if exp.programs is not None:  # calls outside the start-up set so far (0 when closed)
        record["compile_misses"] = exp.programs.misses
      history.append(writer.write(record))
      iteration_lib.check_skipped_updates(history, settings.train.max_skipped_updates)
      final = iteration == settings.train.iterations
      if (settings.eval.every and iteration % settings.eval.every == 0) or final:
        history.append(writer.write(_evaluate(exp, placement, state.params, iteration)))
      if iteration % settings.checkpoint.every == 0 or final:
        checkpointer.save(iteration, _checkpoint_tree(state, use_ref, ref),
                          _loop_state(iteration, root_key, settings, history, threshold))
  finally:
    writer.close()
    checkpointer.close()
  summary = summarize(history, workdir)
  if distributed.is_primary():
    # The file names its workdir relative to the directory the run started in (compare.py's
    # runs: results/<name>/runs/EST/seedS), so that a committed result holds no path of the
    # machine it ran on.
    workdir_lib.write_json(os.path.join(workdir, "summary.json"),
                           dict(summary, workdir=os.path.relpath(workdir)))
  return summary


def _start(exp: experiment_lib.Experiment, params, tx,
           placement: placement_lib.Placement) -> tuple[update_lib.TrainState, list]:
  """A run's iteration 0: held-out evaluation of the untrained model, the warm start, and a
  held-out evaluation after it. `params` are laid out by `placement`, and so is the train state
  returned with the records so far."""
  history = [_evaluate(exp, placement, params, 0, "init")]
  params, sft_opt_state, warm_start_records = warm_start_lib.warm_start(
      exp, params, placement, _validation(exp, placement))
  history += warm_start_records
  state = placement.init_state(tx, params)
  # The policy-gradient steps continue the warm start's Adam moments (the two optimisers
  # differ only in the learning rate, so their states have one structure). A fresh Adam's
  # first steps move every parameter by about the learning rate, sign(g) times lr, however
  # small its gradient; with the sparse gradients of a few successful episodes that is mostly
  # noise, while the warm start's second moments scale each step to that parameter's usual
  # gradient size.
  if (sft_opt_state is not None
      and jax.tree.structure(sft_opt_state) == jax.tree.structure(state.opt_state)):
    state = update_lib.TrainState(step=state.step, params=state.params, opt_state=sft_opt_state)
  if warm_start_records:  # without a warm start the untrained model's evaluation stands
    history.append(_evaluate(exp, placement, state.params, 0, "warm_start"))
  return state, history


def _validation(exp: experiment_lib.Experiment, placement: placement_lib.Placement):
  """The warm start's `validate`: params -> success on `warm_start.validation_tasks` training
  tasks (`warm_start.validation_positions`) played as the held-out evaluation plays, at
  `warm_start.target_temperature` (0: greedy); None without a target
  (`warm_start.target_success` 0), when no such tasks are set aside."""
  ws = exp.settings.warm_start
  if ws.target_success == 0:
    return None
  start, count = warm_start_lib.validation_positions(len(exp.train_tasks), ws.validation_tasks)
  tasks = [exp.train_tasks[i] for i in experiment_lib.task_order(
      len(exp.train_tasks), exp.settings.seed, start, count)]
  key = jax.random.key(exp.settings.seed + 2)  # apart from the iterations' and evaluations' keys
  return lambda params: evaluation.evaluate_policy(
      exp, iteration_lib.policy_for_sampling(exp, placement, params), tasks, key,
      exp.settings.eval.confidence, temperature=ws.target_temperature)["success_rate"]


def _evaluate(exp: experiment_lib.Experiment, placement: placement_lib.Placement, params,
              iteration: int, stage: str = "train") -> dict:
  """The held-out evaluation record of the train state's `params`, sampled where rollouts
  sample (`iteration.policy_for_sampling`)."""
  return evaluation.eval_record(exp, iteration_lib.policy_for_sampling(exp, placement, params),
                                iteration, stage)


def _checkpoint_tree(state, use_ref: bool, ref=None):
  """What a checkpoint's arrays are: the train state, and with `train.kl_coef > 0` the KL
  term's reference parameters beside it (so a resumed run keeps its reference exactly). With
  LoRA both hold adapters only; the frozen base is rebuilt from its source on every start."""
  if not use_ref:
    return state
  return {"train": state, "ref": state.params if ref is None else ref}


def _from_checkpoint_tree(restored):
  """((train state, reference or None), loop state) of a restored checkpoint."""
  tree, loop = restored
  if isinstance(tree, dict) and "ref" in tree:
    return (tree["train"], tree["ref"]), loop
  return (tree, None), loop


def _check_loop_state(root_key) -> Callable[[int, dict], None]:
  """The check of a restored checkpoint's loop state (`_loop_state`) at its step: raises
  ValueError, naming what is wrong, for a state this run cannot continue from."""
  def check(step: int, loop: dict) -> None:
    for name, kind in (("iteration", int), ("key", list), ("task_position", int),
                       ("fork_threshold", dict), ("history", list)):
      if not isinstance(loop.get(name), kind):
        raise ValueError(f"its loop state has no {kind.__name__} {name!r}")
    if loop["iteration"] != step:
      raise ValueError(f"its loop state is of iteration {loop['iteration']}, not {step}")
    if loop["key"] != checkpoint_lib.key_to_json(root_key):
      raise ValueError("its RNG key does not match this configuration's seed")
  return check


def _loop_state(iteration: int, root_key, settings, history, threshold: dict) -> dict:
  """What a checkpoint holds besides the arrays (see the module docstring)."""
  return {"iteration": iteration, "key": checkpoint_lib.key_to_json(root_key),
          "task_position": (settings.rollout.task_offset + iteration * settings.rollout.signal_rounds
                            * settings.rollout.tasks_per_iteration),
          "fork_threshold": threshold,
          "history": [metrics_lib.clean_record(r) for r in history]}


def summarize(history: Sequence[dict], workdir: str) -> dict:
  """Held-out success of the untrained model (`eval_init`), before the first policy-gradient
  iteration (`eval_start`: after the warm start, or the untrained model's without one) and at
  the end (`eval_end`), each with its `stage`, and the iterations run."""
  evals = [r for r in history if r.get("phase") == "eval"]
  train_records = [r for r in history if r.get("phase") == "train"]
  summary = {"workdir": workdir, "iterations": len(train_records)}
  if evals:
    at_zero = [r for r in evals if r["iteration"] == 0]
    for name, record in (("init", evals[0]), ("start", at_zero[-1] if at_zero else evals[0]),
                         ("end", evals[-1])):
      summary[f"eval_{name}"] = {k: record[k] for k in (
          "iteration", "stage", "success_rate", "success_low", "success_high", "num_tasks")}
  return summary


def load_checkpoint(settings, workdir: str, step: int | None = None):
  """(Experiment, TrainState, loop state) of checkpoint `step` (default: the latest) in
  `workdir`.

  With several processes they restore it together; each gets the whole state on its first
  device.
  """
  _connect_processes(settings)
  exp, state = experiment_lib.build_experiment(settings, workdir)
  try:
    state, _, loop = restore_checkpoint(exp, state, step)
  except BaseException:
    exp.close()
    raise
  return exp, state, loop


def restore_checkpoint(exp: experiment_lib.Experiment, state: update_lib.TrainState,
                       step: int | None = None):
  """(TrainState, KL reference or None, loop state) of checkpoint `step` (default: the latest)
  of `exp.workdir`, restored into `state`'s structure, whole on this process's first device."""
  settings = exp.settings
  tx = translate.rl_optimizer(settings)
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(exp.workdir, "checkpoints"),
                                             create=False)
  try:
    state = update_lib.TrainState(step=state.step, params=state.params,
                                  opt_state=tx.init(state.params))
    placement = placement_lib.Placement.create(settings, state)
    abstract = _checkpoint_tree(placement.abstract(state), settings.train.kl_coef > 0)
    if step is None:  # the latest that restores (checkpoint.py)
      restored = checkpointer.restore_latest(abstract)
      if restored is None:
        raise FileNotFoundError(f"no checkpoint in {checkpointer.directory!r}; train first")
      _, *restored = restored
    else:
      restored = checkpointer.restore(step, abstract)
    (state, ref), loop = _from_checkpoint_tree(restored)
  finally:
    checkpointer.close()
  return placement.local(state), None if ref is None else placement.local(ref), loop


def evaluate(config, workdir: str) -> dict:
  """Scores the latest checkpoint of `workdir` on `eval.num_tasks` held-out tasks.

  Writes `<workdir>/eval.json` and returns it: success rate with its Wilson interval at
  `eval.confidence`, mean return and episode length, and the checkpoint's iteration.
  """
  config_lib.validate(config, "eval", workdir)
  settings = settings_lib.from_config(config)
  compile_cache.enable(settings.scale.compile_cache_dir)
  _connect_processes(settings)
  _check_workdir_config(settings, workdir, may_change=EVAL_CHANGES)
  with workdir_lib.lock_run(workdir, "eval"):
    exp, state, loop = load_checkpoint(settings, workdir)
    try:
      record = evaluation.eval_record(exp, exp.sampling_params(state.params), loop["iteration"])
    finally:
      exp.close()
    record = metrics_lib.clean_record(record)
    if distributed.is_primary():
      workdir_lib.write_json(os.path.join(workdir, "eval.json"), record)
  return record



def export(config, workdir: str, export_dir: str) -> str:
  """Writes the latest checkpoint of `workdir` as an HF directory at `export_dir`.

  config.json, model.safetensors (LoRA adapters merged into the kernels), generation_config.json
  (`model.checkpoint`'s, when it has one) and the run's tokenizer (`save_pretrained`): a
  directory `transformers.AutoModelForCausalLM` / `AutoTokenizer` load as they are. Everything
  is written beside `export_dir` and moved in when complete. Returns `export_dir`.
  """
  config_lib.validate(config, "export", workdir)
  settings = settings_lib.from_config(config)
  if os.path.exists(export_dir) and (not os.path.isdir(export_dir) or os.listdir(export_dir)):
    raise config_lib.ConfigError([f"export_dir = {export_dir!r}: exists and is not an empty "
                                  "directory (export into a new one)"])
  _connect_processes(settings)
  _check_workdir_config(settings, workdir, may_change=EVAL_CHANGES)
  with workdir_lib.lock_run(workdir, "export"):
    exp, state, _ = load_checkpoint(settings, workdir)
  exp.close()
  if not distributed.is_primary():
    return export_dir
  model = nnx.merge(exp.graphdef, exp.full_params(state.params))
  source = settings.model.checkpoint
  generation = None
  if source and os.path.exists(os.path.join(source, "generation_config.json")):
    generation = params_lib.read_generation_config(source)
  tokenizer_dir = source or os.path.join(workdir, "tokenizer")
  parent = os.path.dirname(os.path.abspath(export_dir))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
  try:
    params_lib.save_hf_checkpoint(model, staging, generation_config=generation)
    params_lib.load_tokenizer(tokenizer_dir).save_pretrained(staging)
    if os.path.isdir(export_dir):
      os.rmdir(export_dir)
    os.replace(staging, export_dir)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return export_dir
