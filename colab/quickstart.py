# %% [markdown]
# # bpo_jax quickstart: BPO against GRPO on the built-in world
#
# Branching Policy Optimization grows one *tree* of agent steps per task: it snapshots the
# sandbox where the policy is unsure, tries K actions from that exact state, and gives each
# step an advantage from its siblings' returns. This notebook
#
# 1. installs the library from a checkout of its repository,
# 2. trains the quickstart (a tiny model, a supervised warm start on expert episodes, then BPO)
#    and the same setting with GRPO,
# 3. plots the success rate and the variance of the gradient norm of both,
# 4. draws one rollout tree of the trained BPO policy.
#
# Everything runs on a CPU. This file is the notebook's paired script (`colab/quickstart.py`,
# cells marked `# %%`); `python colab/pair_notebook.py` writes `quickstart.ipynb` from it. CI
# runs the script with `QUICKSTART_TINY=1`, a seconds-long setting.

# %%
import os
import subprocess
import sys

# Run from the repository root (in Colab: upload or clone the repository, then `%cd` into it).
REPO = os.path.abspath(os.getcwd())
if os.path.basename(REPO) == "colab":
  REPO = os.path.dirname(REPO)
if REPO not in sys.path:
  sys.path.insert(0, REPO)
try:
  import bpo_jax  # noqa: F401
except ImportError:
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", REPO], check=True)

TINY = os.environ.get("QUICKSTART_TINY") == "1"
WORKDIR = os.environ.get("QUICKSTART_WORKDIR", os.path.join(REPO, "workdirs", "colab"))

# %% [markdown]
# ## Train BPO and GRPO
#
# Both start from the same warm start (the same seed and expert episodes) and spend matched
# compute per task (see `experiments/configs/base.py`). `train` resumes from the workdir's
# latest checkpoint, so running this cell again continues where it stopped.

# %%
from experiments.configs import base  # noqa: E402
from bpo_jax.training import display  # noqa: E402
from bpo_jax.training import loop  # noqa: E402
from bpo_jax.training import metrics  # noqa: E402

configs = {}
summaries = {}
for estimator in ("bpo", "grpo"):
  config = base.rooms(estimator)
  if TINY:
    config = base.tiny(config)
  config.log.progress_bar = not TINY
  configs[estimator] = config
  summaries[estimator] = loop.train(config, os.path.join(WORKDIR, estimator))
  start, end = summaries[estimator]["eval_start"], summaries[estimator]["eval_end"]
  print(f"{estimator}: held-out success {start['success_rate']:.2f} after the warm start, "
        f"{end['success_rate']:.2f} [{end['success_low']:.2f}, {end['success_high']:.2f}] "
        f"after {summaries[estimator]['iterations']} iterations")

# %% [markdown]
# ## Success and gradient-norm variance
#
# `success` is the fraction of the training rollouts' episodes that reached the goal;
# `grad_norm_variance` is the variance of the gradient norm across the update's micro-batches
# (each scaled to estimate the full gradient), a cheap per-iteration view of the estimator's
# noise.

# %%
curves = {}
for estimator in configs:
  records = metrics.read_jsonl(os.path.join(WORKDIR, estimator, "metrics.jsonl"))
  train_records = [r for r in records if r["phase"] == "train"]
  curves[estimator] = {
      "iteration": [r["iteration"] for r in train_records],
      "success": [r["success"] for r in train_records],
      "grad_norm_variance": [r["grad_norm_variance"] for r in train_records],
  }

try:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
except ImportError:
  plt = None
if plt is not None:
  figure, axes = plt.subplots(1, 2, figsize=(11, 3.5))
  for estimator, curve in curves.items():
    axes[0].plot(curve["iteration"], curve["success"], label=estimator.upper())
    axes[1].plot(curve["iteration"], curve["grad_norm_variance"], label=estimator.upper())
  axes[0].set(xlabel="iteration", ylabel="training success", title="Success")
  axes[1].set(xlabel="iteration", ylabel="variance", yscale="symlog",
              title="Gradient-norm variance across micro-batches")
  for axis in axes:
    axis.legend()
  figure.tight_layout()
  if TINY:
    figure.savefig(os.path.join(WORKDIR, "curves.png"))
  else:
    plt.show()
else:
  print("iteration  " + "  ".join(f"{e}:success  {e}:grad_var" for e in curves))
  for i, iteration in enumerate(curves["bpo"]["iteration"]):
    print(f"{iteration:9d}  " + "  ".join(
        f"{curves[e]['success'][i]:11.3f}  {curves[e]['grad_norm_variance'][i]:10.3g}"
        for e in curves))

# %% [markdown]
# ## One rollout tree
#
# The trained BPO policy on a training task: each line is a step (the action, its reward and its
# advantage A); a step with several children is a fork, where the sandbox was restored into K
# branches.

# %%
rollout, advantages = display.sample_tree(configs["bpo"], os.path.join(WORKDIR, "bpo"))
print(display.render_tree(rollout, advantages))
