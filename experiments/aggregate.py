"""The numbers of `compare.py`: finished runs' metrics aggregated per method over seeds.

Pure functions of what a run leaves in its workdir (config.json, metrics.jsonl, summary.json),
so they are tested on hand-made metrics:

  read_run(workdir)        the three files (and gradient_variance.json when measured)
  run_metrics(run)         one run: final held-out success, env steps and policy tokens per task,
                           policy updates, gradient-norm variance, the evaluation curve, the
                           gradient estimator's variance at its checkpoints, and a tree
                           method's last-fork spread share (estimators.prefix_explained_variance)
  aggregate(per_method)    per method over seeds: means, 95% t-intervals, ratios to BPO's
                           compute, the mean curve with its band; claim 2's variance ratios to
                           GRPO's and RLOO's; and claim 3
  shared_variance(...)     claim 2 with every method at one run's parameters (--params)
  markdown(results)        the tables

Per task means per training task of an iteration: a run's total over its iterations divided by
iterations x `rollout.tasks_per_iteration` (all of a task's trees together). Policy updates are
optimizer steps: iterations x `train.epochs`. The gradient-norm variance is the sample variance
(ddof 1) of the iterations' `grad_norm` (skipped updates left out): how much the update's size
moves from one iteration to the next, not the variance of the gradient estimator at fixed
parameters. Intervals over seeds are Student-t intervals, mean ± t_{(1+c)/2, n-1} · s / √n with
s the sample std: none for one seed.

Claim 2, the gradient estimator's variance at fixed parameters (`training.gradient_variance`,
measured by `grad_variance.py --draws=M`): a run's value is the mean over its measured
checkpoints of E||g - mean g||^2; a method's is the mean over seeds with its interval, and its
ratio to GRPO's (RLOO's) is the ratio of the two means. The draws' env steps and policy tokens
per task sit beside it, so the variances are read at their budgets.
"""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

import numpy as np

REFERENCE = "bpo"
GRADIENT_VARIANCE_JSON = "gradient_variance.json"
# Claim 2 compares each method's gradient variance with these baselines' (when present).
VARIANCE_BASELINES = ("grpo", "rloo")


def read_run(workdir: str) -> dict:
  """`{"config", "records", "summary"}` of a finished run's workdir."""
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
    summary = json.load(f)
  grad = None
  path = os.path.join(workdir, GRADIENT_VARIANCE_JSON)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      grad = json.load(f)
  return {"config": config, "records": records, "summary": summary, "gradient_variance": grad}


def _last_per_iteration(records: Sequence[dict], phase: str) -> list[dict]:
  """The records of `phase`, the last one per iteration (a resumed run may repeat some, and
  iteration 0 is evaluated before and after the warm start), by iteration."""
  latest = {r["iteration"]: r for r in records if r.get("phase") == phase}
  return [latest[i] for i in sorted(latest)]


def evaluation_curve(records: Sequence[dict], epochs: int) -> list[dict]:
  """Held-out success at each evaluated iteration, with the env steps, policy tokens and
  policy updates spent up to and including that iteration."""
  train = _last_per_iteration(records, "train")
  curve = []
  for e in _last_per_iteration(records, "eval"):
    done = [r for r in train if r["iteration"] <= e["iteration"]]
    curve.append({"iteration": e["iteration"], "success": e["success_rate"],
                  "env_steps": sum(r["env_steps"] for r in done),
                  "tokens": sum(r["tokens_processed"] for r in done),
                  "updates": len(done) * epochs})
  return curve


def run_metrics(run: dict) -> dict:
  """One run's numbers (module docstring)."""
  config, records = run["config"], run["records"]
  train = _last_per_iteration(records, "train")
  epochs = config["train"]["epochs"]
  tasks = max(len(train), 1) * config["rollout"]["tasks_per_iteration"]
  # A skipped update's gradient was not finite and moved nothing: it is no step's size.
  grad_norms = [r["grad_norm"] for r in train
                if not r.get("skipped") and math.isfinite(r["grad_norm"])]
  return {
      "final_success": run["summary"]["eval_end"]["success_rate"],
      "env_steps_per_task": sum(r["env_steps"] for r in train) / tasks,
      "tokens_per_task": sum(r["tokens_processed"] for r in train) / tasks,
      "updates": len(train) * epochs,
      "skipped_updates": sum(1 for r in train if r.get("skipped")),
      "grad_norm_variance": (float(np.var(grad_norms, ddof=1)) if len(grad_norms) >= 2
                             else None),
      "curve": evaluation_curve(records, epochs),
      "gradient_variance": gradient_variance_metrics(run.get("gradient_variance")),
      "prefix_explained_share": explained_share(train),
  }


def explained_share(train: Sequence[dict]) -> float | None:
  """The last-fork spread share of a tree method's iterations (their
  `prefix_explained_share`, weighted by the trees it was measured on); None for a group method
  or when no tree's returns differed."""
  measured = [(r["prefix_explained_share"], r["variance_trees"]) for r in train
              if r.get("variance_trees")]
  if not measured:
    return None
  return sum(s * n for s, n in measured) / sum(n for _, n in measured)


def true_sq_norm(point: dict) -> float:
  """||E g||² estimated without bias from one checkpoint's draws: ||ḡ||² − E||g − ḡ||² / M.

  E||ḡ||² = ||E g||² + tr Cov / M, so ||ḡ||² alone is biased upwards, and a relative variance
  E||g − ḡ||² / ||ḡ||² cannot much exceed M. The estimate is negative when ||E g||² is small
  against tr Cov / M (not resolved by M draws).
  Example: variance 16 over M = 16 draws, ||ḡ||² = 1.5 → 0.5.
  """
  return point["mean_sq_norm"] - point["variance"] / point["draws"]


def gradient_variance_metrics(measured: dict | None) -> dict | None:
  """One run's claim-2 numbers from its gradient_variance.json: the means over its checkpoints
  of E||g - mean g||^2, ||mean g||^2, ||E g||^2 (`true_sq_norm`) and the
  draws' env steps and tokens per task."""
  if not measured or not measured["checkpoints"]:
    return None
  points = measured["checkpoints"]
  return {"draws": measured["draws"], "steps": [p["step"] for p in points],
          "per_checkpoint": [p["variance"] for p in points],
          "true_sq_norm": float(np.mean([true_sq_norm(p) for p in points])),
          "fork_shares": _level_means([point_fork_shares(p) for p in points]),
          "fork_reach": _level_means([p.get("fork_reach") or [] for p in points]),
          **{k: float(np.mean([p[k] for p in points]))
             for k in ("variance", "mean_sq_norm", "env_steps_per_task", "tokens_per_task")}}


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
  """`{"mean", "low", "high", "n"}`: the Student-t interval of the mean over `values`.

  Example: [0.2, 0.4, 0.6] at 95%: mean 0.4, s = 0.2, t_{0.975, 2} = 4.3027 → 0.4 ± 0.4968.
  """
  x = np.asarray(values, np.float64)
  mean = float(np.mean(x))
  if len(x) < 2:
    return {"mean": mean, "low": None, "high": None, "n": len(x)}
  from scipy import stats  # pylint: disable=g-import-not-at-top  # ~2 s: only where a t is read
  half = float(stats.t.ppf((1 + confidence) / 2, len(x) - 1) * np.std(x, ddof=1)
               / math.sqrt(len(x)))
  return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(x)}


def mean_curve(curves: Sequence[Sequence[dict]], confidence: float = 0.95) -> list[dict]:
  """The seeds' evaluation curves averaged at the iterations every seed evaluated: the mean
  x-coordinates and the success's mean and t-interval (the band)."""
  common = set.intersection(*({p["iteration"] for p in c} for c in curves)) if curves else set()
  out = []
  for it in sorted(common):
    points = [next(p for p in c if p["iteration"] == it) for c in curves]
    success = t_interval([p["success"] for p in points], confidence)
    out.append({"iteration": it, "success": success["mean"], "success_low": success["low"],
                "success_high": success["high"],
                **{k: float(np.mean([p[k] for p in points]))
                   for k in ("env_steps", "tokens", "updates")}})
  return out


def _ratio(value: float, reference: float | None) -> float | None:
  return value / reference if reference else None


def method_summary(runs: Sequence[dict], confidence: float = 0.95) -> dict:
  """One method's `run_metrics` over its seeds."""
  variances = [r["grad_norm_variance"] for r in runs if r["grad_norm_variance"] is not None]
  return {
      "seeds": len(runs),
      "final_success": t_interval([r["final_success"] for r in runs], confidence),
      "final_success_per_seed": [r["final_success"] for r in runs],
      "env_steps_per_task": float(np.mean([r["env_steps_per_task"] for r in runs])),
      "tokens_per_task": float(np.mean([r["tokens_per_task"] for r in runs])),
      "updates": float(np.mean([r["updates"] for r in runs])),
      "skipped_updates": int(sum(r["skipped_updates"] for r in runs)),
      "grad_norm_variance": t_interval(variances, confidence) if variances else None,
      "curve": mean_curve([r["curve"] for r in runs], confidence),
      "gradient_variance": _variance_summary(runs, confidence),
      "prefix_explained_share": _optional_interval(
          [r.get("prefix_explained_share") for r in runs], confidence),
  }


def _optional_interval(values: Sequence[float | None], confidence: float) -> dict | None:
  present = [v for v in values if v is not None]
  return t_interval(present, confidence) if present else None


def _variance_summary(runs: Sequence[dict], confidence: float) -> dict | None:
  measured = [r["gradient_variance"] for r in runs if r.get("gradient_variance")]
  if not measured:
    return None
  return {"seeds": len(measured), "draws": min(m["draws"] for m in measured),
          "steps": sorted({step for m in measured for step in m["steps"]}),
          "variance": t_interval([m["variance"] for m in measured], confidence),
          "fork_shares": _level_means([m.get("fork_shares") or [] for m in measured]),
          "fork_reach": _level_means([m.get("fork_reach") or [] for m in measured]),
          **{k: float(np.mean([m[k] for m in measured]))
             for k in ("mean_sq_norm", "true_sq_norm", "env_steps_per_task", "tokens_per_task")}}


def _mean_present(values: Sequence[float | None]) -> float | None:
  present = [v for v in values if v is not None]
  return float(np.mean(present)) if present else None


def point_fork_shares(point: dict) -> list[float | None]:
  """A checkpoint's fork shares by level (`gradient_variance.fork_shares`); a file measured
  before the levels holds level 1 alone, as `first_fork_share`."""
  return point["fork_shares"] if "fork_shares" in point else [point.get("first_fork_share")]


def _level_means(shares: Sequence[Sequence[float | None]]) -> list[float | None]:
  """Per level, the mean of the shares present. Example: [[0.1, 0.4], [0.3, None]] → [0.2, 0.4]."""
  levels = max((len(s) for s in shares), default=0)
  return [_mean_present([s[k] for s in shares if k < len(s)]) for k in range(levels)]


# Means of the same held-out fractions summed in another order differ in their last bits.
REACH_SLACK = 1e-9


def first_reach(curve: Sequence[dict], target: float) -> float | None:
  """Policy updates at the first point of a mean curve from which its success stays at least
  `target` (to `REACH_SLACK`) to the end; None when the last point is below it. A curve that
  touches the target and falls back has not reached it.

  Example: successes 0.1, 0.3, 0.2, 0.3 at 0, 5, 10, 15 updates and target 0.3 → 15.
  """
  reached = None
  for p in curve:
    if p["success"] >= target - REACH_SLACK:
      reached = p["updates"] if reached is None else reached
    else:
      reached = None
  return reached


def claim_three(methods: dict, reference: str = REFERENCE) -> dict | None:
  """The policy updates `reference` needs to reach the best baseline's final mean success and
  stay there (`first_reach`), against the updates that baseline needed (both on the mean curves;
  of baselines tied at the best final success, the one that needed fewest). With
  `baseline_start`, that baseline's success before its first update: when its final success is
  no higher, there is no gain to reach sooner and `fewer_updates` is None."""
  baselines = {name: m for name, m in methods.items() if name != reference}
  if reference not in methods or not baselines:
    return None
  target = max(m["final_success"]["mean"] for m in baselines.values())
  # Among baselines tied at the best final success, the one that reached it first.
  tied = [name for name, m in baselines.items() if m["final_success"]["mean"] == target]
  reach = {name: first_reach(baselines[name]["curve"], target) for name in tied}
  best = min(tied, key=lambda name: (reach[name] is None, reach[name] or 0.0))
  ours = first_reach(methods[reference]["curve"], target)
  theirs = first_reach(baselines[best]["curve"], target)
  start = baselines[best]["curve"][0]["success"]
  gained = target > start + REACH_SLACK
  fewer = 1.0 - ours / theirs if gained and ours is not None and theirs else None
  return {"baseline": best, "target_success": target, "baseline_start": start,
          "reference_updates": ours, "baseline_updates": theirs, "fewer_updates": fewer}


def aggregate(per_method: dict[str, Sequence[dict]], confidence: float = 0.95,
              reference: str = REFERENCE) -> dict:
  """`{"methods": {name: method_summary + compute ratios}, "claim_3": ..., "confidence"}`
  from each method's `run_metrics` over its seeds; the ratios are to `reference`'s means."""
  methods = {name: method_summary(runs, confidence) for name, runs in per_method.items() if runs}
  ref = methods.get(reference)
  for m in methods.values():
    m["env_steps_ratio"] = _ratio(m["env_steps_per_task"], ref and ref["env_steps_per_task"])
    m["tokens_ratio"] = _ratio(m["tokens_per_task"], ref and ref["tokens_per_task"])
  _variance_ratios({n: m["gradient_variance"] for n, m in methods.items()})
  return {"confidence": confidence, "reference": reference, "methods": methods,
          "claim_3": claim_three(methods, reference)}


def _variance_ratios(variances: dict[str, dict | None]) -> None:
  """Adds to each method's claim-2 summary its ratio to GRPO's and RLOO's mean variance."""
  for v in variances.values():
    for baseline in VARIANCE_BASELINES:
      b = variances.get(baseline)
      if v is not None:
        v[f"ratio_to_{baseline}"] = _ratio(v["variance"]["mean"],
                                           b and b["variance"]["mean"])


def shared_variance(per_method: dict[str, Sequence[dict]], params_of: str,
                    confidence: float = 0.95) -> dict:
  """Claim 2 with every method measured at the same parameters, those of `params_of`'s run of
  each seed (`grad_variance.py --params`): `{"confidence", "params_of", "methods": {name:
  {"gradient_variance": summary with ratios}}}` from each method's gradient_variance.json
  contents over the seeds; the form `claim_two_lines` reads."""
  methods = {}
  for name, measured in per_method.items():
    runs = [{"gradient_variance": gradient_variance_metrics(m)} for m in measured]
    summary = _variance_summary(runs, confidence)
    if summary is not None:
      methods[name] = {"gradient_variance": summary}
  _variance_ratios({n: m["gradient_variance"] for n, m in methods.items()})
  return {"confidence": confidence, "params_of": params_of, "methods": methods}


def _fmt(x, digits: int = 3) -> str:
  return "–" if x is None else f"{x:.{digits}f}"


def _interval(s: dict | None, digits: int = 3) -> str:
  if s is None:
    return "–"
  if s["low"] is None:
    return _fmt(s["mean"], digits)
  return f"{_fmt(s['mean'], digits)} [{_fmt(s['low'], digits)}, {_fmt(s['high'], digits)}]"


def markdown(results: dict) -> str:
  """The results table (one row per method) and claim 3, in markdown."""
  pct = f"{results['confidence']:.0%}"
  ref = results["reference"].upper()
  lines = [f"| method | seeds | final held-out success ({pct} t-interval) | env steps / task | "
           f"× {ref} | policy tokens / task | × {ref} | policy updates | grad-norm variance |",
           "|---|---|---|---|---|---|---|---|---|"]
  for name, m in results["methods"].items():
    lines.append(f"| {name} | {m['seeds']} | {_interval(m['final_success'])} | "
                 f"{_fmt(m['env_steps_per_task'], 1)} | {_fmt(m['env_steps_ratio'], 2)} | "
                 f"{_fmt(m['tokens_per_task'], 0)} | {_fmt(m['tokens_ratio'], 2)} | "
                 f"{_fmt(m['updates'], 0)} | {_interval(m['grad_norm_variance'], 4)} |")
  shares = {n: m["prefix_explained_share"] for n, m in results["methods"].items()
            if m.get("prefix_explained_share")}
  if shares:
    lines += ["", "The spread of each path's last-fork sibling mean as a share of its tree's "
              "return spread, over the trees whose returns differ (an upper-biased reading of "
              "Var(E[G | s_f]) / Var(G); `estimators.prefix_explained_variance`): "
              + "; ".join(f"{n} {_interval(v)}" for n, v in shares.items()) + "."]
  lines += claim_two_lines(results)
  c = results["claim_3"]
  if c is not None:
    reached = (f"{ref} reaches it to stay after {_fmt(c['reference_updates'], 0)} policy "
               "updates" if c["reference_updates"] is not None
               else f"{ref} does not reach it to stay")
    fewer = (f" ({c['fewer_updates']:.0%} fewer)" if c["fewer_updates"] is not None else "")
    head = (f"Claim 3: the best baseline, {c['baseline']}, ends at a mean success of "
            f"{c['target_success']:.3f}")
    if c["target_success"] > c["baseline_start"] + REACH_SLACK:
      lines += ["", f"{head}, reached to stay after {_fmt(c['baseline_updates'], 0)} policy "
                f"updates; {reached}{fewer}."]
    else:
      lines += ["", f"{head}, no higher than before its first update "
                f"({c['baseline_start']:.3f}): no gain to reach in fewer updates; {reached}."]
  return "\n".join(lines) + "\n"


def claim_two_lines(results: dict) -> list[str]:
  """The claim-2 table (markdown lines), empty when no method's variance was measured."""
  methods = {n: m["gradient_variance"] for n, m in results["methods"].items()
             if m.get("gradient_variance")}
  if not methods:
    return []
  pct = f"{results['confidence']:.0%}"
  draws = min(v["draws"] for v in methods.values())
  steps = sorted({step for v in methods.values() for step in v.get("steps", ())})
  if len(steps) == 1:
    at = f"at the checkpoint of iteration {steps[0]}"
  else:
    at = f"at the checkpoints of iterations {', '.join(map(str, steps))}"
  where = (f"of {results['params_of'].upper()}'s run of each seed, every method at the same "
           "parameters" if results.get("params_of") else "of each run")
  lines = ["", f"Claim 2: the gradient estimator's variance at fixed parameters, "
           f"E‖g − ḡ‖² over {draws} independent draws of an iteration's trees or groups for the "
           f"same tasks, {at} {where} (mean over "
           f"them, then over seeds with its {pct} t-interval), with the env steps and policy "
           "tokens per task each draw spent.", "",
           "| method | seeds | E‖g − ḡ‖² | × GRPO | × RLOO | ‖ḡ‖² | ‖E g‖² = ‖ḡ‖² − E‖g − ḡ‖²/M "
           "| env steps / task of the draws | policy tokens / task of the draws "
           "| fork shares Var(E[G | s_τk]) / Var(G), k = 1, 2, 3 (paths with a k-th fork) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for name, v in methods.items():
    lines.append(f"| {name} | {v['seeds']} | {_interval(v['variance'], 4)} | "
                 f"{_fmt(v.get('ratio_to_grpo'), 2)} | {_fmt(v.get('ratio_to_rloo'), 2)} | "
                 f"{_fmt(v['mean_sq_norm'], 4)} | {_fmt(v.get('true_sq_norm'), 4)} | "
                 f"{_fmt(v['env_steps_per_task'], 1)} | "
                 f"{_fmt(v['tokens_per_task'], 0)} | "
                 f"{_fork_shares(v.get('fork_shares'), v.get('fork_reach'))} |")
  return lines


def _fork_shares(shares, reach) -> str:
  """"0.00 (1.00), 0.35 (0.90)": each level's share with its paths' weight where measured."""
  reach = reach or []
  return ", ".join(_fmt(x, 2) + (f" ({reach[k]:.2f})" if k < len(reach) and reach[k] is not None
                                 else "") for k, x in enumerate(shares or [None]))


PLOTS = (("env_steps", "env steps (all tasks)", "success_vs_env_steps.png"),
         ("tokens", "policy tokens (all tasks)", "success_vs_tokens.png"),
         ("updates", "policy updates", "success_vs_updates.png"))


def plots(results: dict, out: str) -> list[str]:
  """PNG plots into `out`: held-out success against env steps, policy tokens and policy
  updates (the mean over seeds with its t-interval band), each method's gradient-norm
  variance (mean and interval over seeds) and, when measured, its gradient estimator's variance
  at fixed parameters (the same; at one run's parameters with `claim_2_shared`). Returns the
  files' names."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  methods = results["methods"]
  names = []
  for key, label, name in PLOTS:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, m in methods.items():
      x = [p[key] for p in m["curve"]]
      ax.plot(x, [p["success"] for p in m["curve"]], marker="o", label=method)
      if m["seeds"] >= 2:
        ax.fill_between(x, [p["success_low"] for p in m["curve"]],
                        [p["success_high"] for p in m["curve"]], alpha=0.2)
    ax.set(xlabel=label, ylabel="held-out success", ylim=(-0.02, 1.02))
    ax.legend()
    fig.tight_layout()
    _save(fig, out, name)
    plt.close(fig)
    names.append(name)
  spread = {n: m["grad_norm_variance"] for n, m in methods.items()}
  names.append(_bar_plot(plt, out, "grad_norm_variance.png", spread,
                         "grad-norm variance across iterations"))
  shared = results.get("claim_2_shared")
  measured = {n: m["gradient_variance"]["variance"]
              for n, m in (shared or results)["methods"].items() if m.get("gradient_variance")}
  if measured:
    where = f" ({shared['params_of'].upper()}'s)" if shared else ""
    names.append(_bar_plot(plt, out, "gradient_variance.png", measured,
                           f"E||g - mean g||² at fixed parameters{where}"))
  return names


def _save(fig, out: str, name: str) -> None:
  """Saves `fig` as `out/name` whole: into a temporary file beside it, then renamed."""
  temporary = os.path.join(out, f".{name}.partial.png")
  fig.savefig(temporary, dpi=100)
  os.replace(temporary, os.path.join(out, name))


def _bar_plot(plt, out: str, name: str, values: dict, ylabel: str) -> str:
  """One bar per method of `values` ({method: {"mean", "low", "high"} or None}), its interval
  as the error bar where there is one; saved as `out/name`. Returns `name`."""
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for i, v in enumerate(values.values()):
    if v is None:
      continue
    err = [[v["mean"] - v["low"]], [v["high"] - v["mean"]]] if v["low"] is not None else None
    ax.bar(i, v["mean"], yerr=err, capsize=4)
  ax.set_xticks(range(len(values)), list(values))
  ax.set(ylabel=ylabel)
  fig.tight_layout()
  _save(fig, out, name)
  plt.close(fig)
  return name
