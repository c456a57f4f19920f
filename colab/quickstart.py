# %% [markdown]
# # bpo_jax quickstart: BPO against GRPO on the built-in world
#
# Branching Policy Optimization grows one *tree* of agent steps per task: it snapshots the
# sandbox where the policy is unsure, tries K actions from that exact state, and gives each
# step an advantage from its siblings' returns. This notebook
#
# 1. clones and installs the library (set `REPO_URL` in the first cell),
# 2. trains BPO and GRPO on the built-in rooms world with a tiny model made from scratch (a
#    supervised warm start on expert episodes, then 30 iterations of 16 tasks each), at
#    matched spend: a budget of env steps per task under which BPO's trees spend what GRPO's
#    groups do,
# 3. plots held-out success against the env steps spent, and prints what each spent per task
#    (and GRPO's spend as a multiple of BPO's) and the variance of its gradient,
# 4. draws a tree BPO grows after the warm start, where siblings' returns differ, with the
#    advantages training gives it.
#
# **Run time:** everything runs on a CPU: one warm start of 200 steps, then 30 iterations of
# each method. Run headless from a fresh virtualenv (the first cell's install included) on a
# 2-core machine shared with other jobs, the whole notebook took 13 to 23 minutes of wall time
# (three runs, as the other jobs' load varied), 11 to 22 of them training (10 to 11 minutes of
# CPU time); the training cell prints its wall and CPU time.
# Progress bars show the warm start and each method's iterations; held-out evaluations print
# beneath them.
#
# This file is the notebook's paired script (`colab/quickstart.py`, cells marked `# %%`);
# `python colab/pair_notebook.py` writes `quickstart.ipynb` from it. CI runs it with
# `QUICKSTART_TINY=1`, a quick setting (a one-layer model, 2 iterations of 2 tasks: under a
# minute of training, 2.5 minutes for the whole notebook with its install).

# %%
# Set REPO_URL to this repository's git address (the placeholder below is not one); a headless
# run may set it from outside instead, in the environment variable QUICKSTART_REPO_URL. When the
# notebook runs inside a checkout (opened from it, or the working directory is in it), that
# checkout is used and nothing is cloned.
import importlib.metadata
import os
import subprocess
import sys

REPO_URL = "https://github.com/YOUR-ORG/bpo_jax.git"  # placeholder: fill in
REPO_URL = os.environ.get("QUICKSTART_REPO_URL", REPO_URL)


def find_checkout(start):
  """The checkout of this repository holding `start` (or above it), else None."""
  path = os.path.abspath(start)
  while True:
    if all(os.path.exists(os.path.join(path, p))
           for p in ("setup.py", "bpo_jax/__init__.py", "colab/quickstart.py")):
      return path
    if os.path.dirname(path) == path:
      return None
    path = os.path.dirname(path)


def installed_versions():
  """{distribution: version} of the packages imported so far (what a restart would reload)."""
  names = importlib.metadata.packages_distributions()
  imported = {m.split(".")[0] for m in list(sys.modules)}
  out = {}
  for module in imported & set(names):
    for dist in names[module]:
      try:
        out[dist] = importlib.metadata.version(dist)
      except importlib.metadata.PackageNotFoundError:
        pass
  return out


REPO = os.environ.get("QUICKSTART_CHECKOUT") or find_checkout(os.getcwd())
if REPO is None:
  if "YOUR-ORG" in REPO_URL:
    raise RuntimeError("set REPO_URL in this cell to the repository's git address, then run it again")
  REPO = os.path.abspath(os.path.basename(REPO_URL.rstrip("/")).removesuffix(".git"))
  if not os.path.exists(REPO):
    subprocess.run(["git", "clone", "--depth", "1", REPO_URL, REPO], check=True)
# The cells below import from the checkout whatever the working directory was: a folder named
# like the package, met before the checkout on the path, would import as an empty namespace.
os.chdir(REPO)
sys.path.insert(0, REPO)
for module in [m for m in sys.modules if m.split(".")[0] in ("bpo_jax", "experiments")]:
  del sys.modules[module]

before = installed_versions()
if os.environ.get("QUICKSTART_SKIP_INSTALL") != "1":  # CI's environment is installed already
  # The `results` extra is matplotlib, for the figure (Colab's image has it already).
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{REPO}[results]"],
                 check=True)
changed = sorted(d for d, v in before.items() if installed_versions().get(d, v) != v)
if changed:
  print("Restart the runtime (Runtime > Restart session), then run the cells below: "
        f"pip changed packages already imported ({', '.join(changed)}).")
else:
  print(f"Installed from {REPO}; no runtime restart needed.")

TINY = os.environ.get("QUICKSTART_TINY") == "1"
WORKDIR = os.environ.get("QUICKSTART_WORKDIR", os.path.join(REPO, "workdirs", "colab"))

# %% [markdown]
# ## Train BPO and GRPO
#
# BPO's run evaluates the untrained model, trains the warm start and evaluates it; GRPO's
# starts from that checkpoint (the warm start does not read the estimator, so this is what
# GRPO's own warm start would give, bit for bit). Both get `MATCHED_ENV_STEPS` = 22 env steps
# per task: GRPO rolls the whole episodes that fit at the worst case, 22 // 5 = 4 episodes of at
# most five steps (`rollout.group_size = 0`), and BPO grows one tree, forking at every decision
# where the worst case of every live branch still fits (`experiments/configs/base.py`,
# `compared`). A group reserves its episodes' worst case once, at the root, while a tree
# reserves each live branch's at every fork, so the same budget is not the same spend: under
# the 24 steps of the library's comparisons (`base.matched_budget(4, 5)`) BPO's trees spend
# about 1.1 times what GRPO's groups do, under 22 the same to within a few percent (the next
# cell prints the ratio). `train` resumes from the workdir's latest checkpoint, so running this
# cell again continues where it stopped.

# %%
import time  # noqa: E402

from experiments import aggregate  # noqa: E402
from experiments import compare  # noqa: E402
from experiments.configs import base  # noqa: E402
from bpo_jax.training import display  # noqa: E402
from bpo_jax.training import loop  # noqa: E402
from bpo_jax.training import settings  # noqa: E402

MATCHED_ENV_STEPS = 22  # the budget under which both spend the same (the cell above)

configs, runs = {}, {}
start, cpu_start = time.time(), time.process_time()
for estimator in ("bpo", "grpo"):
  config = base.compared(base.rooms(estimator))
  config.rollout.max_env_steps = MATCHED_ENV_STEPS
  config = base.variant(config, "tiny" if TINY else None)
  config.log.progress_bar = not TINY
  # Every checkpoint kept: the tree below is grown from the one after the warm start.
  config.checkpoint.keep = config.train.iterations // config.checkpoint.every + 1
  configs[estimator] = config
  if estimator != "bpo":  # from BPO's checkpoint 0: the warm start is the same for both
    compare.start_from_lead(compare.Run(estimator, config.seed, os.path.join(WORKDIR, estimator)),
                            compare.Run("bpo", config.seed, os.path.join(WORKDIR, "bpo")), config)
  print(f"{estimator}: {config.train.iterations} iterations", flush=True)
  loop.train(config, os.path.join(WORKDIR, estimator))
  runs[estimator] = aggregate.read_run(os.path.join(WORKDIR, estimator))
print(f"trained in {time.time() - start:.0f} s ({time.process_time() - cpu_start:.0f} s of CPU time)")

# %% [markdown]
# ## Like with like: held-out success against env steps, and what each spent
#
# Held-out success is the greedy policy's success on 64 tasks neither method trained on (95%
# Wilson interval), against the env steps spent in training up to that point. Beside it, each
# method's env steps and policy tokens (prefilled and decoded) per task, over all iterations,
# and GRPO's as a multiple of BPO's, which matched spend keeps within 1 ± 0.1 for env steps.
# The gradient-norm variance is the variance of the gradient norm across an update's two
# micro-batches (each scaled to estimate the full gradient); its summary is the mean over the
# iterations with a 95% Student-t interval.

# %%
summary = {}
for estimator, run in runs.items():
  numbers = aggregate.run_metrics(run)
  variance = aggregate.t_interval([r["grad_norm_variance"] for r in run["records"]
                                   if r["phase"] == "train"])
  evals = {r["iteration"]: r for r in run["records"] if r["phase"] == "eval"}
  summary[estimator] = dict(numbers, variance=variance, evals=evals)
  end = run["summary"]["eval_end"]
  print(f"{estimator.upper():4s} held-out success {run['summary']['eval_start']['success_rate']:.3f}"
        f" after the warm start, {end['success_rate']:.3f} [{end['success_low']:.3f}, "
        f"{end['success_high']:.3f}] after {numbers['updates']} updates; per task "
        f"{numbers['env_steps_per_task']:.1f} env steps, {numbers['tokens_per_task']:.0f} tokens")
ratio = {k: summary["grpo"][k] / summary["bpo"][k] if summary["bpo"][k] else float("nan")
         for k in ("env_steps_per_task", "tokens_per_task")}
print(f"GRPO's spend per task as a multiple of BPO's: env steps {ratio['env_steps_per_task']:.2f}, "
      f"tokens {ratio['tokens_per_task']:.2f}"
      + ("" if abs(ratio["env_steps_per_task"] - 1) <= 0.1 else " (env steps NOT matched within 10%)"))
for estimator, s in summary.items():
  v = s["variance"]
  interval = "" if v["low"] is None else f" [{v['low']:.3g}, {v['high']:.3g}]"
  print(f"{estimator.upper():4s} gradient-norm variance across micro-batches: mean {v['mean']:.3g}"
        f"{interval} over {v['n']} iterations")

try:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
except ImportError:
  plt = None
if plt is not None:
  figure, axes = plt.subplots(1, 2, figsize=(11, 3.8), width_ratios=(3, 2))
  for estimator, s in summary.items():
    curve = s["curve"]
    x = [p["env_steps"] for p in curve]
    low = [s["evals"][p["iteration"]]["success_low"] for p in curve]
    high = [s["evals"][p["iteration"]]["success_high"] for p in curve]
    line, = axes[0].plot(x, [p["success"] for p in curve], marker="o",
                         label=f"{estimator.upper()}: {s['env_steps_per_task']:.1f} env steps, "
                         f"{s['tokens_per_task']:.0f} tokens per task")
    axes[0].fill_between(x, low, high, color=line.get_color(), alpha=0.15)
  axes[0].set(xlabel="env steps spent in training (all tasks)",
              ylabel="held-out success (greedy)", ylim=(0, 1.02),
              title=f"Held-out success at matched spend (GRPO/BPO env steps per task "
              f"{ratio['env_steps_per_task']:.2f})")
  axes[0].legend(loc="lower right", fontsize=8)
  names = list(summary)
  means = [summary[e]["variance"]["mean"] for e in names]
  errors = [[m - (summary[e]["variance"]["low"] if summary[e]["variance"]["low"] is not None else m)
             for e, m in zip(names, means)],
            [(summary[e]["variance"]["high"] if summary[e]["variance"]["high"] is not None else m) - m
             for e, m in zip(names, means)]]
  axes[1].bar([e.upper() for e in names], means, yerr=errors, capsize=6, color=["C0", "C1"])
  axes[1].set(ylabel="mean over iterations (95% t-interval)",
              title="Gradient-norm variance across micro-batches")
  figure.tight_layout()
  figure.savefig(os.path.join(WORKDIR, "curves.png"), dpi=120)
  if not TINY:
    plt.show()

# %% [markdown]
# ## A tree BPO grows, with its advantages
#
# From the checkpoint after the warm start, the tree training's first iteration grows, at the
# fork threshold training stored in the checkpoint and with the configured budgets; shown is the
# first of that iteration's trees with a fork whose siblings' returns differ (marked ◆). Each
# line is a step: the action, its reward r and the advantage A the estimator gives it in that
# iteration's batch; a step with several children is a fork, where the sandbox was restored into
# K branches.

# %%
drawn = display.draw_tree(settings.from_config(configs["bpo"]), os.path.join(WORKDIR, "bpo"),
                          step=0)
print(f"iteration {drawn.iteration}, tree {drawn.tree_index} of the batch (draw {drawn.draw}), "
      f"fork threshold {drawn.threshold:.3g} nats, forks whose siblings differ: "
      f"{len(drawn.differing_forks)}")
print(display.render_tree(drawn.rollout, drawn.advantages, tuple(drawn.differing_forks)))
