"""experiments/compare.py and experiments/aggregate.py: estimators x seeds, the table, the plots.

The aggregation is checked on hand-made metrics with hand-computed means, intervals and claim 3;
the command runs BPO and GRPO over two seeds of the rooms tiny config, writes the table, the
JSON and the plots, skips the finished runs when called again and refuses bad flags in one line.
"""

import importlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from experiments import aggregate  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import compare  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import task_outcomes  # pylint: disable=g-import-not-at-top,wrong-import-position
from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bpo_jax.training import metrics  # pylint: disable=g-import-not-at-top,wrong-import-position

COMPARE = os.path.join(ROOT, "experiments", "compare.py")
ROOMS_TINY = os.path.join(ROOT, "experiments", "configs", "rooms.py") + ":tiny"
# Student's t at 97.5% with 2 degrees of freedom (tables: 4.3027).
T_975_2 = 4.302653


def _write_run(workdir, successes, env_steps, tokens, grad_norms, epochs=2, tasks=2,
               shares=None):
  """A run's files: evaluations at iterations 0, 1, 2 with `successes`, two train iterations
  (a tree method's with `shares`: (prefix-explained share, trees measured) per iteration)."""
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump({"train": {"epochs": epochs}, "rollout": {"tasks_per_iteration": tasks}}, f)
  records = [{"phase": "eval", "stage": "init", "iteration": 0, "success_rate": 0.99}]
  records.append({"phase": "eval", "stage": "warm_start", "iteration": 0,
                  "success_rate": successes[0]})
  for i in (1, 2):
    train = {"phase": "train", "iteration": i, "env_steps": env_steps[i - 1],
             "tokens_processed": tokens[i - 1], "grad_norm": grad_norms[i - 1], "skipped": 0.0}
    if shares:
      train["prefix_explained_share"], train["variance_trees"] = shares[i - 1]
    if i == 2:  # a resumed run logs iteration 2 again: the last record counts
      records.append(dict(train, env_steps=999))
    records.append(train)
    records.append({"phase": "eval", "stage": "end" if i == 2 else "every", "iteration": i,
                    "success_rate": successes[i]})
  with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
  with open(os.path.join(workdir, "summary.json"), "w", encoding="utf-8") as f:
    json.dump({"iterations": 2, "eval_end": {"success_rate": successes[2]}}, f)


def test_claim_three_takes_the_tied_baseline_that_reached_first_and_skips_no_step():
  curve = lambda *points: [{"updates": u, "success": v} for u, v in points]
  methods = {"bpo": {"curve": curve((0, 0.1), (2, 0.25), (4, 0.5))},
             "grpo": {"final_success": {"mean": 0.5},
                      "curve": curve((0, 0.1), (2, 0.25), (4, 0.5))},
             "rloo": {"final_success": {"mean": 0.5}, "curve": curve((0, 0.1), (2, 0.5), (4, 0.5))},
             "gigpo": {"final_success": {"mean": 0.25}, "curve": curve((0, 0.25), (4, 0.25))}}
  assert aggregate.claim_three(methods) == {
      "baseline": "rloo", "target_success": 0.5, "baseline_start": 0.1, "reference_updates": 4,
      "baseline_updates": 2, "fewer_updates": -1.0}
  # A best baseline that ends where it started gained nothing: no updates to compare, though
  # both curves are at the target from 0 updates (RLOO dips and comes back).
  flat = {"bpo": {"curve": curve((0, 0.25), (2, 0.25), (4, 0.5))},
          "rloo": {"final_success": {"mean": 0.25}, "curve": curve((0, 0.25), (2, 0.0), (4, 0.25))}}
  assert aggregate.claim_three(flat) == {
      "baseline": "rloo", "target_success": 0.25, "baseline_start": 0.25, "reference_updates": 0,
      "baseline_updates": 4, "fewer_updates": None}
  # Touching the target and falling back is not reaching it; reaching it again is, from there.
  assert aggregate.first_reach(curve((0, 0.1), (5, 0.3), (10, 0.2), (15, 0.3)), 0.3) == 15
  assert aggregate.first_reach(curve((0, 0.1), (5, 0.3), (10, 0.2)), 0.3) is None
  # Means of equal fractions summed in another order count as equal.
  assert (0.1 + 0.2 + 0.3) / 3 > 0.2
  assert aggregate.first_reach(curve((0, 0.2)), (0.1 + 0.2 + 0.3) / 3) == 0
  # A skipped update (its gradient not finite) is left out of the gradient-norm variance.
  train = [{"phase": "train", "iteration": i, "env_steps": 4, "tokens_processed": 40,
            "grad_norm": g, "skipped": float(math.isnan(g))}
           for i, g in enumerate([1.0, float("nan"), 3.0], start=1)]
  run = {"config": {"train": {"epochs": 1}, "rollout": {"tasks_per_iteration": 2}},
         "records": train, "summary": {"eval_end": {"success_rate": 0.5}}}
  metrics = aggregate.run_metrics(run)
  assert metrics["grad_norm_variance"] == 2.0 and metrics["skipped_updates"] == 1


def test_aggregation_of_hand_made_metrics(tmp_path):
  # BPO: finals 0.25, 0.5, 0.75 (mean 0.5, s = 0.25); its mean curve 0.125, 0.5, 0.5. GRPO:
  # finals 0.375 each; mean curve 0.125, 0.25, 0.375. All dyadic: the means are exact.
  bpo = [[0.0, 0.5, 0.25], [0.125, 0.25, 0.5], [0.25, 0.75, 0.75]]
  grpo = [[0.0, 0.25, 0.375], [0.125, 0.25, 0.375], [0.25, 0.25, 0.375]]
  per_method = {"bpo": [], "grpo": []}
  for s in range(3):
    _write_run(tmp_path / f"bpo{s}", bpo[s], [10, 14], [100, 140 + 4 * s], [1.0, 3.0 + s],
               shares=[(0.25, 2), (0.5, 6)])
    _write_run(tmp_path / f"grpo{s}", grpo[s], [16, 16], [200, 200], [1.0, 2.0])
    per_method["bpo"].append(aggregate.run_metrics(aggregate.read_run(tmp_path / f"bpo{s}")))
    per_method["grpo"].append(aggregate.run_metrics(aggregate.read_run(tmp_path / f"grpo{s}")))
  one = per_method["bpo"][0]
  # 24 env steps over 2 iterations x 2 tasks; 2 iterations x 2 epochs; Var(1, 3) = 2.
  assert one["env_steps_per_task"] == 6.0 and one["tokens_per_task"] == 60.0
  assert one["updates"] == 4 and one["grad_norm_variance"] == 2.0
  assert [(p["iteration"], p["success"], p["env_steps"], p["tokens"], p["updates"])
          for p in one["curve"]] == [(0, 0.0, 0, 0, 0), (1, 0.5, 10, 100, 2),
                                     (2, 0.25, 24, 240, 4)]
  results = aggregate.aggregate(per_method)
  b, g = results["methods"]["bpo"], results["methods"]["grpo"]
  half = T_975_2 * 0.25 / math.sqrt(3)
  assert b["final_success"]["mean"] == 0.5
  assert b["final_success"]["low"] == pytest.approx(0.5 - half, rel=1e-6)
  assert b["final_success"]["high"] == pytest.approx(0.5 + half, rel=1e-6)
  assert g["final_success"] == {"mean": 0.375, "low": 0.375, "high": 0.375, "n": 3}
  # Tokens per task: BPO (240 + 4s) / 4 → mean 61; GRPO 100. Env steps 6 against 8.
  assert b["tokens_per_task"] == 61.0 and g["tokens_per_task"] == 100.0
  assert g["env_steps_ratio"] == 8 / 6 and g["tokens_ratio"] == 100 / 61
  assert b["env_steps_ratio"] == 1.0
  # Grad-norm variances: BPO Var(1, 3 + s) = 2, 4.5, 8 → mean 14.5 / 3; GRPO 0.5 each.
  assert b["grad_norm_variance"]["mean"] == pytest.approx(14.5 / 3, rel=1e-12)
  assert g["grad_norm_variance"]["mean"] == 0.5
  assert [p["success"] for p in b["curve"]] == [0.125, 0.5, 0.5]
  assert [p["success"] for p in g["curve"]] == [0.125, 0.25, 0.375]
  # Claim 3: GRPO's final 0.375 is first reached after 4 updates; BPO passes it after 2.
  assert results["claim_3"] == {"baseline": "grpo", "target_success": 0.375,
                                "baseline_start": 0.125, "reference_updates": 2.0,
                                "baseline_updates": 4.0, "fewer_updates": 0.5}
  table = aggregate.markdown(results)
  assert (f"| bpo | 3 | 0.500 [{0.5 - half:.3f}, {0.5 + half:.3f}] | 6.0 | 1.00 | 61 | 1.00 | "
          "4 |") in table
  assert "| grpo | 3 | 0.375 [0.375, 0.375] | 8.0 | 1.33 | 100 | 1.64 | 4 |" in table
  assert "BPO reaches it to stay after 2 policy updates (50% fewer)" in table
  flat = dict(results, claim_3=dict(results["claim_3"], baseline_start=0.375, fewer_updates=None))
  assert ("grpo, ends at a mean success of 0.375, no higher than before its first update "
          "(0.375): no gain to reach in fewer updates; BPO reaches it to stay after 2 policy "
          "updates.") in aggregate.markdown(flat)
  # The explained share, weighted by the trees measured: (0.25 x 2 + 0.5 x 6) / 8; none for GRPO.
  assert one["prefix_explained_share"] == 0.4375
  assert per_method["grpo"][0]["prefix_explained_share"] is None
  assert b["prefix_explained_share"] == {"mean": 0.4375, "low": 0.4375, "high": 0.4375, "n": 3}
  assert g["prefix_explained_share"] is None
  assert "`estimators.prefix_explained_variance`): bpo 0.438 [0.438, 0.438]." in table


def test_t_interval_and_first_reach():
  assert aggregate.t_interval([0.5]) == {"mean": 0.5, "low": None, "high": None, "n": 1}
  two = aggregate.t_interval([0.25, 0.75])  # s = 0.3536, t_{0.975, 1} = 12.7062
  assert two["high"] - two["mean"] == pytest.approx(12.706205 * 0.25, rel=1e-6)
  curve = [{"updates": 0, "success": 0.1}, {"updates": 5, "success": 0.3}]
  assert aggregate.first_reach(curve, 0.3) == 5 and aggregate.first_reach(curve, 0.4) is None


def test_a_failed_run_says_how_it_ended():
  """A SIGKILLed run (the kernel's out-of-memory killer's signal) is named with the remedy; other
  signals by name, exits by status. The statuses are those `subprocess.run` returns."""
  killed = subprocess.run([sys.executable, "-c", "import os, signal; "
                           "os.kill(os.getpid(), signal.SIGKILL)"], check=False).returncode
  assert compare.exit_reason(killed) == (
      "killed by SIGKILL, most often for want of memory: try fewer --jobs")
  assert compare.exit_reason(-15) == "killed by SIGTERM"
  assert compare.exit_reason(1) == "exit 1"


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo"])
def test_a_baseline_rolls_the_whole_episodes_of_the_budget_and_the_file_is_left_alone(estimator):
  config = importlib.import_module("experiments.configs.rooms").get_config("tiny")
  before = compare.plain(config)
  built = compare.run_config(config, estimator, seed=3)
  assert (built.rollout.estimator, built.rollout.group_size, built.seed) == (estimator, 0, 3)
  # :tiny's budget is one fork of k = 2 leaves of 4 turns: a group of 2 whole episodes.
  assert config_lib.group_episodes(built) == 8 // 4 == 2
  assert compare.plain(config) == before
  assert {k: v for k, v in compare.plain(built).items() if k not in ("rollout", "seed")} == {
      k: v for k, v in before.items() if k not in ("rollout", "seed")}


def test_provenance_keeps_the_first_command_adds_each_resume_and_replaces_a_corrupt_record(
    tmp_path, capsys):
  run = compare.Run("bpo", 3, str(tmp_path))
  made = lambda commit, n: dict(commit=commit, code_changes=False, created=f"t{n}",
                                command=f"python experiments/compare.py --seeds={n}")
  compare.record_provenance(run, made("aaa", 1))
  compare.record_provenance(run, made("bbb", 2))
  path = tmp_path / compare.PROVENANCE
  assert json.loads(path.read_text()) == dict(
      commit="aaa", code_changes=False, created="t1",
      commands={"train": "python experiments/compare.py --seeds=1"},
      resumed=[dict(commit="bbb", code_changes=False, created="t2",
                    command="python experiments/compare.py --seeds=2")])
  for corrupt in ('{"commit": "aa', "[1, 2]"):  # cut short by hand; not a record
    path.write_text(corrupt)
    compare.record_provenance(run, made("ccc", 3))
    assert json.loads(path.read_text()) == dict(
        commit="ccc", code_changes=False, created="t3", earlier="unreadable",
        commands={"train": "python experiments/compare.py --seeds=3"})
    assert capsys.readouterr().out == f"bpo seed 3: {path} does not read; written anew\n"


def test_first_seed_plans_the_seeds_from_it(tmp_path):
  config = importlib.import_module("experiments.configs.rooms").get_config("tiny")
  runs = compare.plan(config, ["bpo", "grpo"], 2, str(tmp_path), first_seed=3)
  assert [(r.estimator, r.seed, c.seed) for r, c in runs] == [
      ("bpo", 3, 3), ("grpo", 3, 3), ("bpo", 4, 4), ("grpo", 4, 4)]
  assert runs[-1][0].workdir == str(tmp_path / "runs" / "grpo" / "seed4")


def _compare(*args, **kwargs):
  return subprocess.run([sys.executable, COMPARE, *args], capture_output=True, text=True,
                        cwd=ROOT, check=False, **kwargs)


def test_the_next_run_keeps_a_warm_start_ahead_of_the_lanes():
  assert compare.pick([False, False], [False, False], 2) is None
  assert compare.pick([True, False, True], [False, False, True], 2) == 2
  assert compare.pick([True, True, True], [False, False, True], 2) == 0
  # Without shared warm starts no run is a lead: plan order.
  assert compare.pick([False, True, True], [False, False, False], 2) == 1
  # A sweep's start, [bpo0, grpo0, rloo0, gigpo0, bpo1]: only the leads can start, in order.
  assert compare.pick([True, False, False, False, True], [True, False, False, False, True], 2) == 0
  assert compare.pick([False, False, False, True], [False, False, False, True], 2) == 3


def _check_the_shared_warm_start(tmp_path, run):
  """`run` (started from its seed's BPO checkpoint 0) logs what it logs with its own warm
  start: every record the same, the same floats, not close ones."""
  with open(run + ".log", encoding="utf-8") as f:
    assert "resumed from the checkpoint of iteration 0" in f.read()
  own = str(tmp_path / "own")
  alone = subprocess.run([sys.executable, compare.RUN_PY,
                          f"--config={compare.JSON_CONFIG_PY}:{run}.json", f"--workdir={own}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert alone.returncode == 0, alone.stderr[-2000:]
  untimed = lambda workdir: [{k: v for k, v in r.items() if not k.startswith("time/")}
                             for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
  records = untimed(run)
  phases = [r["phase"] for r in records]
  assert phases.count("warm_start") >= 1 and phases.count("train") == 2
  assert records == untimed(own)


@pytest.mark.slow
def test_compare_writes_the_table_json_and_plots_and_skips_finished_runs(tmp_path, capsys,
                                                                          monkeypatch):
  out = str(tmp_path / "out")
  # One held-out task: four runs of two iterations, two at a time; each seed's warm start is
  # trained by BPO's run, GRPO's starts from its checkpoint 0.
  args = [f"--config={ROOMS_TINY}", "--seeds=2", "--estimators=bpo,grpo", f"--out={out}",
          "--jobs=2", "--share_warm_start", "--config.eval.num_tasks=1"]
  first = _compare(*args)
  assert first.returncode == 0, first.stderr[-2000:]
  assert first.stdout.count("trained in") == 4
  _check_the_shared_warm_start(tmp_path, os.path.join(out, "runs", "grpo", "seed1"))
  results = json.load(open(os.path.join(out, "results.json"), encoding="utf-8"))
  assert set(results["methods"]) == {"bpo", "grpo"}
  for m in results["methods"].values():
    assert m["seeds"] == 2 and m["updates"] == 2 and len(m["curve"]) == 2
    assert m["final_success"]["low"] is not None and m["grad_norm_variance"] is not None
  assert results["methods"]["bpo"]["env_steps_ratio"] == 1.0
  table = open(os.path.join(out, "results.md"), encoding="utf-8").read()
  assert "| bpo | 2 |" in table and "| grpo | 2 |" in table and "Claim 3" in table
  for name in ("success_vs_env_steps.png", "success_vs_tokens.png", "success_vs_updates.png",
               "grad_norm_variance.png"):
    with open(os.path.join(out, name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # Each run is a normal workdir with its config beside it, and the grpo one is grpo's.
  saved = json.load(open(os.path.join(out, "runs", "grpo", "seed1.json"), encoding="utf-8"))
  assert saved["rollout"]["estimator"] == "grpo" and saved["seed"] == 1
  assert os.path.exists(os.path.join(out, "runs", "grpo", "seed1", "summary.json"))
  # Each run records the commit and the command it was trained by.
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                        text=True).stdout.strip()
  for estimator, seed in itertools.product(("bpo", "grpo"), (0, 1)):
    with open(os.path.join(out, "runs", estimator, f"seed{seed}", compare.PROVENANCE),
              encoding="utf-8") as f:
      made = json.load(f)
    assert made["commit"] == head and "resumed" not in made
    assert made["commands"]["train"] == "python experiments/compare.py " + " ".join(args)
  second = _compare(*args)
  assert second.returncode == 0, second.stderr[-2000:]
  assert second.stdout.count("finished, skipped") == 4 and "trained in" not in second.stdout
  assert json.load(open(os.path.join(out, "results.json"), encoding="utf-8")) == results
  # A run saved before a key existed is the same run while the key is at its default.
  path = os.path.join(out, "runs", "grpo", "seed1", "config.json")
  with open(path, encoding="utf-8") as f:
    saved = json.load(f)
  del saved["rollout"]["root_k"]
  with open(path, "w", encoding="utf-8") as f:
    json.dump(saved, f)
  # (compare.py's plan of the same command line, in this process.)
  config = importlib.import_module("experiments.configs.rooms").get_config("tiny")
  config.eval.num_tasks = 1
  third = compare.plan(config, ["bpo", "grpo"], 2, out)
  assert len(third) == 4 and all(compare.finished(run, c.train.iterations) for run, c in third)
  # Finished runs of other settings are not reused.
  config.train.learning_rate = 0.001
  capsys.readouterr()
  with pytest.raises(SystemExit) as other:
    compare.plan(config, ["bpo", "grpo"], 2, out)
  assert other.value.code == 2
  assert capsys.readouterr().err.strip().endswith("holds a finished run with other settings "
                                                  "(train.learning_rate); use another --out")
  _check_task_outcomes(out, capsys, monkeypatch)


def _check_task_outcomes(out: str, capsys, monkeypatch):
  """task_outcomes.py replays each run's evaluations at its kept checkpoints into the logged
  per-task outcomes; a replay that is not the record is reported and written nowhere; with
  --temperature, the loop's evaluation at that temperature, in a file of its own. (On BPO's
  two runs, copied: a replay costs an experiment's build per run.)"""
  shutil.copytree(os.path.join(out, "runs", "bpo"), os.path.join(out + "_bpo", "runs", "bpo"))
  out += "_bpo"
  assert task_outcomes.main([f"--results={out}"]) == 0
  for seed in (0, 1):
    workdir = os.path.join(out, "runs", "bpo", f"seed{seed}")
    logged = task_outcomes.logged_evaluations(workdir)
    with open(os.path.join(workdir, task_outcomes.OUTCOMES), encoding="utf-8") as f:
      saved = json.load(f)
    assert sorted(saved["outcomes"]) == ["0", "2"]  # the checkpoints with an evaluation
    assert saved["outcomes"] == {k: logged[int(k)]["task_successes"] for k in saved["outcomes"]}
    assert saved["commit"] and saved["command"].startswith("python experiments/task_outcomes.py")
  # --temperature=0, the runs' own evaluation temperature: held to the record, in its own file.
  assert task_outcomes.main([f"--results={out}", "--temperature=0"]) == 0
  for seed in (0, 1):
    workdir = os.path.join(out, "runs", "bpo", f"seed{seed}")
    with open(os.path.join(workdir, "task_outcomes_temperature0.json"), encoding="utf-8") as f:
      at_zero = json.load(f)
    assert at_zero["temperature"] == 0 and at_zero["outcomes"] == {
        k: task_outcomes.logged_evaluations(workdir)[int(k)]["task_successes"]
        for k in ("0", "2")}
  # Another temperature: each checkpoint evaluated by the loop's evaluation under the run's
  # settings but that temperature, at the checkpoint's own key (its iteration).
  from bpo_jax.training import evaluation  # pylint: disable=g-import-not-at-top
  calls, real = [], evaluation.eval_record
  def spy(exp, params, iteration):
    calls.append((exp.settings.eval.temperature, exp.settings.rollout.temperature, iteration))
    return real(exp, params, iteration)
  monkeypatch.setattr(evaluation, "eval_record", spy)
  assert task_outcomes.main([f"--results={out}", "--temperature=0.5"]) == 0
  assert calls == [(0.5, 1.0, 0), (0.5, 1.0, 2)] * 2
  for seed in (0, 1):
    with open(os.path.join(out, "runs", "bpo", f"seed{seed}", "task_outcomes_temperature0.5.json"),
              encoding="utf-8") as f:
      at_half = json.load(f)
    assert at_half["temperature"] == 0.5 and sorted(at_half["outcomes"]) == ["0", "2"]
    assert "--temperature=0.5" in at_half["command"]
  monkeypatch.undo()
  # A logged count the replay does not give: one line, exit status 1, no file for that run.
  workdir = os.path.join(out, "runs", "bpo", "seed1")
  os.remove(os.path.join(workdir, task_outcomes.OUTCOMES))
  path = os.path.join(workdir, "metrics.jsonl")
  records = [json.loads(line) for line in open(path, encoding="utf-8")]
  records[-1]["successes"] += 1
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  capsys.readouterr()
  assert task_outcomes.main([f"--results={out}"]) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: runs/bpo/seed1: the replay is not the run's record: checkpoint 2:")
  assert len(err.splitlines()) == 1
  assert not os.path.exists(os.path.join(workdir, task_outcomes.OUTCOMES))


@pytest.mark.parametrize("flag, message", [
    ("--seeds=0", "error: --seeds=0: must be >= 1"),
    ("--first_seed=-1", "error: --first_seed=-1: must be >= 0"),
    ("--estimators=bpo,ppo", "error: --estimators=bpo,ppo: each must be one of bpo, rloo, grpo, "
                             "gigpo"),
    ("--jobs=-1", "error: --jobs=-1: must be >= 0"),
    ("--config.rollout.k=two", "error: rollout.k = 'two': must be of type int"),
    ("--config.rollout.group_std_ddof=3", "error: bpo, seed 0: invalid configuration: "
                                          "rollout.group_std_ddof = 3: must be in [0, 1]"),
])
def test_bad_flags_one_line_exit_2(tmp_path, flag, message):
  result = _compare(f"--config={ROOMS_TINY}", f"--out={tmp_path / 'out'}", flag)
  assert result.returncode == 2
  assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "out").exists()


def _write_gradient_variance(workdir, variances, env_steps=(6.0, 8.0)):
  points = [{"step": 2 * i, "variance": v, "mean_sq_norm": 0.5, "draws": 16,
             "fork_shares": [0.0, 0.25 * (i + 1)], "fork_reach": [1.0, 0.5 * (i + 1)],
             "skipped_draws": 0, "env_steps_per_task": env_steps[i % 2],
             "tokens_per_task": 60.0} for i, v in enumerate(variances)]
  with open(os.path.join(workdir, aggregate.GRADIENT_VARIANCE_JSON), "w",
            encoding="utf-8") as f:
    json.dump({"draws": 16, "checkpoints": points}, f)


# Per method, each seed's variances at two checkpoints. Per seed, the mean over its checkpoints:
# BPO (1, 3) → 2 and (2, 4) → 3, mean 2.5; GRPO (4, 6) → 5 and (6, 8) → 7, mean 6; RLOO
# (10, 10) twice → 10. Ratios 2.5/6, 2.5/10.
HAND_VARIANCES = (("bpo", [(1, 3), (2, 4)]), ("grpo", [(4, 6), (6, 8)]),
                  ("rloo", [(10, 10), (10, 10)]))


def _measured_workdirs(tmp_path, with_runs: bool) -> dict:
  """{method: [workdir per seed]}, each holding `HAND_VARIANCES`' gradient_variance.json, and
  with `with_runs` a finished run's files too."""
  workdirs = {}
  for name, seeds in HAND_VARIANCES:
    workdirs[name] = []
    for s, variances in enumerate(seeds):
      workdir = tmp_path / f"{name}{s}"
      if with_runs:
        _write_run(workdir, [0.0, 0.25, 0.5], [10, 14], [100, 140], [1.0, 3.0])
      os.makedirs(workdir, exist_ok=True)
      _write_gradient_variance(workdir, variances)
      workdirs[name].append(workdir)
  return workdirs


def test_claim_two_by_hand(tmp_path):
  per_method = {name: [aggregate.run_metrics(aggregate.read_run(w)) for w in workdirs]
                for name, workdirs in _measured_workdirs(tmp_path, with_runs=True).items()}
  one = per_method["bpo"][0]["gradient_variance"]
  assert one["variance"] == 2.0 and one["steps"] == [0, 2] and one["per_checkpoint"] == [1, 3]
  assert one["env_steps_per_task"] == 7.0 and one["draws"] == 16
  # ‖E g‖² = ‖ḡ‖² − variance / M per checkpoint: 0.5 − 1/16 and 0.5 − 3/16, mean 0.375.
  assert one["true_sq_norm"] == 0.375
  results = aggregate.aggregate(per_method)
  b = results["methods"]["bpo"]["gradient_variance"]
  assert b["variance"]["mean"] == 2.5 and b["seeds"] == 2
  assert b["ratio_to_grpo"] == 2.5 / 6 and b["ratio_to_rloo"] == 2.5 / 10
  assert results["methods"]["grpo"]["gradient_variance"]["ratio_to_grpo"] == 1.0
  table = aggregate.markdown(results)
  assert "Claim 2" in table and "over 16 independent draws" in table
  # Seed 1: 0.5 − 2/16 and 0.5 − 4/16, mean 0.3125; over the seeds 0.34375.
  # The fork shares: 0 at level 1; at level 2 0.25 and 0.5 at the two checkpoints, 0.375 on
  # every seed; the paths with a second fork weigh 0.5 and 1, 0.75.
  assert "| bpo | 2 | 2.5000 [" in table
  assert "| 0.42 | 0.25 | 0.5000 | 0.3438 | 7.0 | 60 | 0.00 (1.00), 0.38 (0.75) |" in table
  # A file measured before the levels holds level 1 alone.
  assert aggregate.point_fork_shares({"first_fork_share": 0.1}) == [0.1]
  assert "gradient_variance.png" in aggregate.plots(results, str(tmp_path))
  # A run without the measurement has none, and the table has no claim 2.
  bare = tmp_path / "bare"
  _write_run(bare, [0.0, 0.25, 0.5], [10, 14], [100, 140], [1.0, 3.0])
  metrics = aggregate.run_metrics(aggregate.read_run(bare))
  assert metrics["gradient_variance"] is None
  assert "Claim 2" not in aggregate.markdown(aggregate.aggregate({"bpo": [metrics]}))


def test_claim_two_at_shared_parameters_by_hand(tmp_path):
  # Every method at BPO's checkpoints, from the measurement files alone (no run of its own):
  # the same numbers as `HAND_VARIANCES` gives at each run's own.
  measured = {name: [json.loads((w / aggregate.GRADIENT_VARIANCE_JSON).read_text("utf-8"))
                     for w in workdirs]
              for name, workdirs in _measured_workdirs(tmp_path, with_runs=False).items()}
  shared = aggregate.shared_variance(measured, "bpo")
  b = shared["methods"]["bpo"]["gradient_variance"]
  assert b["variance"]["mean"] == 2.5 and b["seeds"] == 2
  assert b["ratio_to_grpo"] == 2.5 / 6 and b["ratio_to_rloo"] == 2.5 / 10
  lines = "\n".join(aggregate.claim_two_lines(shared))
  assert ("at the checkpoints of iterations 0, 2 of BPO's run of each seed, every method at the "
          "same parameters") in lines
  assert "| bpo | 2 | 2.5000 [" in lines and "| 0.42 | 0.25 | 0.5000 | 0.3438 | 7.0 | 60 |" in lines


def test_a_run_whose_finished_lead_left_no_checkpoint_zero_trains_its_own_warm_start(tmp_path):
  run = lambda estimator, seed: compare.Run(estimator, seed, str(tmp_path / f"{estimator}{seed}"))
  bpo0, grpo0, bpo1, grpo1, bpo2, grpo2 = (run(e, s) for s in range(3) for e in ("bpo", "grpo"))
  leads = {grpo0: bpo0, grpo1: bpo1, grpo2: bpo2}
  os.makedirs(os.path.join(bpo1.workdir, "checkpoints", "0"))
  # bpo0 finished earlier, its checkpoints gone; bpo1's are kept; bpo2 is still to run.
  assert compare.lost_leads(leads, {grpo0, grpo1, bpo2, grpo2}) == [grpo0]
  assert compare.lost_leads(leads, {grpo1, bpo2, grpo2}) == []


@pytest.mark.slow
def test_an_out_that_is_a_file_is_one_line_exit_2(tmp_path):
  out = tmp_path / "results"
  out.write_text("notes")
  result = _compare(f"--config={ROOMS_TINY}", f"--out={out}")
  assert result.returncode == 2
  assert result.stderr == f"error: --out={out}: exists and is not a directory\n"
  assert out.read_text() == "notes"


def test_results_come_from_the_finished_runs_and_name_the_failed(tmp_path, capsys):
  """GRPO's run failed (no summary.json): the table holds BPO's two seeds alone and both files
  name the run left out; with no finished run nothing is written."""
  out = str(tmp_path / "out")
  from experiments import cli  # pylint: disable=g-import-not-at-top
  config, _ = cli.load_config_file(ROOMS_TINY)
  runs = [(compare.Run("bpo", s, os.path.join(out, "runs", "bpo", f"seed{s}")),
           compare.run_config(config, "bpo", s)) for s in (0, 1)]
  for (run, _), successes in zip(runs, ([0.0, 0.25, 0.5], [0.0, 0.5, 0.75])):
    _write_run(run.workdir, successes, [10, 14], [100, 140], [1.0, 3.0])
  failed = compare.Run("grpo", 0, os.path.join(out, "runs", "grpo", "seed0"))
  runs.append((failed, compare.run_config(config, "grpo", 0)))
  results = compare.write_results(runs, out, "rooms.py:tiny", failed=[failed])
  assert set(results["methods"]) == {"bpo"} and results["methods"]["bpo"]["seeds"] == 2
  assert results["methods"]["bpo"]["final_success"]["mean"] == 0.625
  assert results["failed"] == ["grpo seed 0"]
  with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
    assert json.load(f)["failed"] == ["grpo seed 0"]
  with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
    table = f.read()
  assert "| bpo | 2 |" in table and "| grpo |" not in table
  assert "Left out, failed: grpo seed 0" in table
  assert not [n for n in os.listdir(out) if n.startswith(".")]  # no temporary file left

  empty = str(tmp_path / "empty")
  os.makedirs(empty)
  assert compare.write_results([runs[-1]], empty, "rooms.py:tiny", failed=[failed]) is None
  assert os.listdir(empty) == []
  assert "error: no run finished: nothing written to " in capsys.readouterr().err
