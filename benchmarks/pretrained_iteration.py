"""Training iterations of a `<world>_qwen2_5.py` config at a Qwen2.5 checkpoint's shape: BPO's
trees against GRPO's groups (the reference) at the config's env-step budget.

No weights are downloaded. A random checkpoint of a preset's shape (`--preset`, a
`ModelConfig` classmethod, default `qwen2_5_0_5b`) is written with transformers'
`save_pretrained`, in bfloat16, beside a Qwen2-family tokenizer (`bpo_jax.testing.
chat_tokenizers`, the repository's Qwen2.5 chat template) fitted to the world's texts. The run
is the config's own (rank-16 adapters on bfloat16 weights, its turns, budgets and trees) on
whatever devices JAX sees; random weights write unparseable actions, so every episode runs to
its last turn: the largest rollouts the budget allows (every return is 0, which leaves the
update's work as it is). Each estimator trains `--iterations`
iterations in a process of its own (one after the other, so each one's peak device memory is
its own); the first iteration compiles and is left out, the figures are medians over the rest:
seconds per iteration, its rollout and update, tokens decoded and processed per second of
rollout, and the peak device memory (`memory_stats`, where the backend reports it). Each run's
log and progress bar go to stderr, with the time each step took.

    python benchmarks/pretrained_iteration.py [--json] [--config rooms_qwen2_5]
        [--preset qwen2_5_0_5b] [--iterations 4] [--tasks N] [--shape num_layers=2,...]
        [--compile_cache DIR] [--startup_compile on|off|auto] [--kv_page_size N]

`--shape` overrides preset fields (a smaller model for a CPU check); `--tasks` sets
`rollout.tasks_per_iteration`; `--compile_cache` the runs' `scale.compile_cache_dir` (default
"none": each process compiles what it runs, so the compile figures do not depend on an earlier
run); `--startup_compile` the runs' `scale.startup_compile` (default "on": the closed program
set compiled before the first rollout, `training/startup.py`); `--kv_page_size` the runs'
`model.kv_page_size` (default 0: the dense cache; N: a paged cache of N-slot pages). With --json: one object with, per estimator, the medians (`iteration_s`, `rollout_s`,
`update_s`, `phase_s` per rollout phase and the estimator's packing, `decode_tokens_per_s`,
`processed_tokens_per_s`, `update_tokens_per_s` (the packed trees' tokens over the update's
seconds), `decode_steps`, `decode_s`, `tokens_decoded`, `update_tokens`), `param_bytes` (the
checkpoint's), `env_steps` and `policy_tokens` per task, `peak_bytes`, the compiles
(`compile_cache.CompileCounter`) of the start-up, everything before the second iteration
(`startup_compiles`, `startup_compile_seconds` per program name), and of the timed iterations
(`compiles_in_timed_iterations`, the names in `programs_compiled_in_timed_iterations`), the
start-up set's seconds per program (`startup_set_seconds`, by `ProgramKey.label`), their total
(`startup_set_s`) and the calls outside it (`compile_misses`), and
`bpo_over_grpo_iteration_time` (BPO's median iteration time over GRPO's). Each run prints its
progress (iterations started and done, programs compiled so far) on stderr as it goes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging as std_logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "chat_templates", "qwen2_5.jinja")
ESTIMATORS = ("bpo", "grpo")


def _parse_shape(text: str) -> dict[str, int]:
  """`key=int,...` as a dict; ValueError naming the item that is not of that form."""
  out = {}
  for item in filter(None, text.split(",")):
    key, _, value = item.partition("=")
    try:
      out[key.strip()] = int(value)
    except ValueError:
      raise ValueError(f"--shape item {item!r} is not key=int") from None
  return out


def write_checkpoint(config, preset: str, shape: dict[str, int], directory: str) -> None:
  """A random bfloat16 checkpoint of `preset` (with `shape`'s fields) and a Qwen2-family
  tokenizer fitted to `config`'s world, in `directory`."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bpo_jax.models import ModelConfig  # pylint: disable=g-import-not-at-top
  from bpo_jax.testing import chat_tokenizers  # pylint: disable=g-import-not-at-top
  from bpo_jax.text import corpus  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import experiment  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import settings  # pylint: disable=g-import-not-at-top
  model_config = getattr(ModelConfig, preset)(**shape)
  hf = model_config.to_hf_config()
  hf.update(initializer_range=0.02, torch_dtype="float32", dtype="float32")
  torch.manual_seed(0)
  model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**hf))
  model.to(torch.bfloat16).save_pretrained(directory)
  del model
  options = dict(config.env.options)
  tasks = experiment.make_tasks(settings.from_config(config), "train",
                                 min(64, config.env.num_train_tasks))
  texts = corpus.environment_texts(config.env.name, tasks, options)
  with open(TEMPLATE, encoding="utf-8") as f:
    template = f.read()
  tokenizer = chat_tokenizers.family_tokenizer("qwen2", texts, template, vocab_size=2000)
  chat_tokenizers.save_family_tokenizer(tokenizer, "qwen2", directory)


def world_config(name: str, estimator: str, checkpoint: str, iterations: int, tasks: int,
                 kv_page_size: int = 0):
  from experiments.configs import base  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f"experiments.configs.{name}").get_config()
  config = base.with_estimator(config, estimator)
  config.model.checkpoint = checkpoint
  config.model.kv_page_size = kv_page_size
  config.train.iterations = iterations
  config.eval.every = 0
  config.eval.num_tasks = 1
  config.checkpoint.every = iterations
  if tasks:
    config.rollout.tasks_per_iteration = tasks
  return config


def _counted_iterations(counter, progress):
  """Wraps the loop's `run_iteration` so that each iteration's start records the compile
  counts so far and prints a progress line; returns the list the counts go to."""
  from bpo_jax.training import iteration as iteration_lib  # pylint: disable=g-import-not-at-top
  run_iteration = iteration_lib.run_iteration
  marks = []

  def counted(exp, engine, train_step, state, iteration, *args, **kwargs):
    marks.append((counter.snapshot(), len(counter.log), time.perf_counter()))
    progress(f"iteration {iteration} starts; {counter.compiles} programs compiled so far")
    out = run_iteration(exp, engine, train_step, state, iteration, *args, **kwargs)
    progress(f"iteration {iteration} done in {time.perf_counter() - marks[-1][2]:.1f} s")
    return out

  iteration_lib.run_iteration = counted
  return marks


def _captured_program_set():
  """Wraps `startup.start` so that the run's start-up program set is kept; returns the list
  it goes to."""
  from bpo_jax.training import startup  # pylint: disable=g-import-not-at-top
  start = startup.start
  kept = []

  def keeping(*args, **kwargs):
    out = start(*args, **kwargs)
    kept.append(out[0].programs)
    return out

  startup.start = keeping
  return kept


def _set_figures(kept) -> dict:
  """The start-up set's seconds per program, their total and the misses (empty without one)."""
  programs = kept[-1] if kept else None
  if programs is None:
    return dict(startup_set_seconds={}, startup_set_s=0.0, compile_misses=None)
  from bpo_jax import precompiled  # pylint: disable=g-import-not-at-top
  return dict(startup_set_seconds={precompiled.label(k): round(s, 2)
                                   for k, s in programs.seconds.items()},
              startup_set_s=programs.total_seconds, compile_misses=programs.misses)


def _startup_seconds(log) -> dict[str, float]:
  """Backend compile seconds per program name, summed, the slowest first."""
  seconds = {}
  for name, duration in log:
    seconds[name] = seconds.get(name, 0.0) + duration
  return dict(sorted(((k, round(v, 2)) for k, v in seconds.items()), key=lambda kv: -kv[1]))


def run_one(args) -> dict:
  """Trains one estimator (in this process) and returns its figures."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import compile_cache  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  # The loop's progress on stderr (where a slow run is), without the checkpointer's chatter.
  logging.set_verbosity(logging.INFO)
  std_logging.getLogger("absl").addFilter(lambda record: "orbax" not in record.pathname)
  start = time.perf_counter()
  progress = lambda text: print(f"[{args.estimator} {time.perf_counter() - start:7.1f} s] {text}",  # noqa: E731
                                file=sys.stderr, flush=True)
  counter = compile_cache.CompileCounter()
  marks = _counted_iterations(counter, progress)
  kept = _captured_program_set()
  config = world_config(args.config, args.estimator, args.checkpoint, args.iterations, args.tasks,
                        args.kv_page_size)
  config.scale.compile_cache_dir = args.compile_cache
  config.scale.startup_compile = args.startup_compile
  workdir = os.path.join(args.workdir, args.estimator)
  loop.train(config, workdir)
  progress("done")
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  train = [r for r in records if r.get("phase") == "train"][1:]  # the first one compiles
  median = lambda key: statistics.median(r[key] for r in train)  # noqa: E731
  tasks = config.rollout.tasks_per_iteration
  rollout = median("time/rollout")
  stats = jax.devices()[0].memory_stats() or {}
  timed, timed_log_start, _ = marks[1]  # from the second iteration's start to the end
  phases = sorted(k for k in train[0] if k.startswith("time/rollout_"))
  return dict(
      iteration_s=statistics.median(
          r["time/rollout"] + r["time/estimate_and_pack"] + r["time/update"] for r in train),
      rollout_s=rollout, update_s=median("time/update"),
      phase_s={k[len("time/"):]: median(k) for k in phases + ["time/estimate_and_pack"]},
      decode_tokens_per_s=median("tokens_decoded") / rollout,
      decode_steps=median("decode_steps"), decode_s=median("time/rollout_decode"),
      tokens_decoded=median("tokens_decoded"),
      update_tokens_per_s=median("unique_tokens") / median("time/update"),
      update_tokens=median("unique_tokens"),
      param_bytes=os.path.getsize(os.path.join(args.checkpoint, "model.safetensors")),
      processed_tokens_per_s=median("tokens_processed") / rollout,
      env_steps=median("env_steps") / tasks, policy_tokens=median("num_action_tokens") / tasks,
      iterations_timed=len(train), peak_bytes=stats.get("peak_bytes_in_use"),
      device=str(jax.devices()[0].device_kind),
      startup_compile_seconds=_startup_seconds(counter.log[:timed_log_start]),
      startup_compiles=timed["compiles"], startup_cache_hits=timed["cache_hits"],
      compiles_in_timed_iterations=counter.compiles - timed["compiles"],
      compile_requests_in_timed_iterations=counter.requests - timed["requests"],
      programs_compiled_in_timed_iterations=sorted({n for n, _ in counter.log[timed_log_start:]}),
      **_set_figures(kept))


def _check_configs(parser, args):
  """Every estimator's run configuration validated before the checkpoint is written: a bad
  `--config` or `--tasks` is one line (exit status 2), not a traceback minutes later."""
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(os.path.join(ROOT, "experiments", "configs", f"{args.config}.py")):
    parser.error(f"--config={args.config}: no experiments/configs/{args.config}.py")
  for estimator in ESTIMATORS:
    config = world_config(args.config, estimator, "", args.iterations, args.tasks,
                          args.kv_page_size)
    try:
      config_lib.validate(config, "train", None)
    except config_lib.ConfigError as error:
      parser.error(f"--config={args.config} --tasks={args.tasks} "
                   f"--kv_page_size={args.kv_page_size} for {estimator}: "
                   f"{' '.join(str(error).split())}")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object with the figures")
  p.add_argument("--config", default="rooms_qwen2_5", help="experiments/configs/<name>.py")
  p.add_argument("--preset", default="qwen2_5_0_5b", help="a ModelConfig preset (classmethod)")
  p.add_argument("--shape", default="", help="preset fields to override: key=int,...")
  p.add_argument("--iterations", type=int, default=4)
  p.add_argument("--tasks", type=int, default=0, help="tasks per iteration (0: the config's)")
  p.add_argument("--compile_cache", default="none",
                 help="scale.compile_cache_dir of the runs (default none: every process "
                      "compiles what it runs; '' for the run's default cache)")
  p.add_argument("--startup_compile", default="on", choices=("on", "off", "auto"),
                 help="scale.startup_compile of the runs (default on)")
  p.add_argument("--kv_page_size", type=int, default=0,
                 help="model.kv_page_size of the runs (default 0: the dense cache)")
  p.add_argument("--estimator", help=argparse.SUPPRESS)
  p.add_argument("--checkpoint", help=argparse.SUPPRESS)
  p.add_argument("--workdir", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.iterations < 2:
    p.error(f"--iterations={args.iterations}: must be >= 2 (the first iteration compiles)")
  if not args.estimator:
    _check_configs(p, args)
  from bpo_jax.models import ModelConfig  # pylint: disable=g-import-not-at-top
  args.preset = args.preset.replace("-", "_").replace(".", "_")  # qwen2.5-0.5b = qwen2_5_0_5b
  if not callable(getattr(ModelConfig, args.preset, None)) or args.preset.startswith("_"):
    p.error(f"--preset={args.preset}: not a ModelConfig preset (e.g. qwen2_5_0_5b)")
  try:
    shape = _parse_shape(args.shape)
  except ValueError as error:
    p.error(str(error))
  if args.estimator:  # one estimator's process
    print(json.dumps(run_one(args)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    checkpoint = os.path.join(tmp, "checkpoint")
    start = time.perf_counter()
    write_checkpoint(world_config(args.config, "bpo", "", 2, 0), args.preset, shape, checkpoint)
    print(f"checkpoint written in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    figures = {}
    for estimator in ESTIMATORS:
      command = [sys.executable, os.path.abspath(__file__), f"--config={args.config}",
                 f"--iterations={args.iterations}", f"--tasks={args.tasks}",
                 f"--estimator={estimator}", f"--checkpoint={checkpoint}", f"--workdir={tmp}",
                 f"--compile_cache={args.compile_cache}",
                 f"--startup_compile={args.startup_compile}",
                 f"--kv_page_size={args.kv_page_size}"]
      start = time.perf_counter()
      done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
      print(f"{estimator} run in {time.perf_counter() - start:.0f} s", file=sys.stderr)
      if done.returncode:
        raise SystemExit(f"error: the {estimator} run failed (exit {done.returncode})")
      figures[estimator] = json.loads(done.stdout.strip().splitlines()[-1])
  bpo, grpo = figures["bpo"], figures["grpo"]
  figures.update(config=args.config, preset=args.preset, shape=shape,
                 kv_page_size=args.kv_page_size,
                 bpo_over_grpo_iteration_time=bpo["iteration_s"] / grpo["iteration_s"])
  if args.json:
    print(json.dumps(figures, sort_keys=True))
    return
  gib = lambda b: "n/a" if b is None else f"{b / 2**30:.1f} GiB"  # noqa: E731
  print(f"{args.config} at {args.preset} {figures['shape'] or ''} on {bpo['device']}, medians "
        f"of {bpo['iterations_timed']} iterations after the first:")
  for name in ESTIMATORS:
    f = figures[name]
    print(f"  {name:5s} iteration {f['iteration_s']:.2f} s (rollout {f['rollout_s']:.2f}, "
          f"update {f['update_s']:.2f}); {f['decode_tokens_per_s']:.0f} decoded and "
          f"{f['processed_tokens_per_s']:.0f} processed tokens/s of rollout; per task "
          f"{f['env_steps']:.1f} env steps, {f['policy_tokens']:.0f} policy tokens; peak "
          f"{gib(f['peak_bytes'])}")
    slowest = ", ".join(f"{k} {v:.1f}" for k, v in list(f["startup_compile_seconds"].items())[:4])
    print(f"        start-up: {f['startup_compiles']} programs compiled "
          f"({sum(f['startup_compile_seconds'].values()):.1f} s; slowest: {slowest}); "
          f"{f['compiles_in_timed_iterations']} compiled in the timed iterations")
    if f["startup_set_seconds"]:
      print(f"        start-up set: {len(f['startup_set_seconds'])} programs in "
            f"{f['startup_set_s']:.1f} s, {f['compile_misses']} calls outside it")
  print(f"  BPO's iteration takes {figures['bpo_over_grpo_iteration_time']:.2f}x GRPO's")


if __name__ == "__main__":
  main()
