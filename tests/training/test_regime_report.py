"""The rooms-regime report: its paired statistics by hand, and the script on a small fixture."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments import regime_report  # noqa: E402
from experiments.configs import rooms_regime  # noqa: E402

# t_{0.975, 2} and t_{0.80, 2}, from tables.
T975, T80 = 4.302653, 1.060660


def test_mdd_by_hand():
  assert regime_report.mdd(0.1, 3) == pytest.approx((T975 + T80) * 0.1 / np.sqrt(3), rel=1e-6)
  # More pairs, smaller MDD at the same spread; both quantiles fall toward the normal's.
  assert regime_report.mdd(0.1, 30) < regime_report.mdd(0.1, 10) < regime_report.mdd(0.1, 3)


def test_paired_difference_by_hand():
  d = regime_report.paired([0.6, 0.7, 0.8], [0.3, 0.5, 0.7])  # differences 0.3, 0.2, 0.1
  assert d["mean"] == pytest.approx(0.2) and d["sd"] == pytest.approx(0.1)
  assert d["high"] - d["mean"] == pytest.approx(T975 * 0.1 / np.sqrt(3), rel=1e-6)
  assert d["mdd"] == pytest.approx(0.309651, abs=1e-6)


def test_unit_interval_cuts_a_proportion():
  x = regime_report.unit_interval(dict(mean=0.95, low=0.9, high=1.04, n=3))
  assert (x["low"], x["high"]) == (0.9, 1.0)


SEEDS = (0, 1, 2)
START = (0.3, 0.4, 0.4)
FINAL = dict(bpo=(0.6, 0.7, 0.8), grpo=(0.5, 0.5, 0.6), rloo=(0.3, 0.5, 0.7))
VARIANCE = dict(bpo=1.0, grpo=4.0, rloo=2.0)


def _write(path, payload):
  with open(path, "w", encoding="utf-8") as f:
    if path.endswith(".jsonl"):
      f.write("".join(json.dumps(r) + "\n" for r in payload))
    else:
      json.dump(payload, f)


def _run(workdir, start, final, variance):
  """One finished run of 2 iterations, evaluated at 0, 1 and 2."""
  os.makedirs(workdir)
  config = dict(env=dict(options=dict(difficulty=1)),
                warm_start=dict(num_trajectories=32, steps=120),
                train=dict(iterations=2, epochs=1, learning_rate=2e-4),
                rollout=dict(tasks_per_iteration=4, max_env_steps=24))
  evals = [(0, start), (1, start + 0.75 * (final - start)), (2, final)]
  records = ([dict(phase="eval", iteration=i, success_rate=s) for i, s in evals]
             + [dict(phase="train", iteration=i, env_steps=80, tokens_processed=400,
                     grad_norm=1.0 * i) for i in (1, 2)])
  summary = dict(iterations=2, eval_start=dict(success_rate=start),
                 eval_end=dict(success_rate=final, num_tasks=512))
  gv = dict(draws=16, params_of="bpo", checkpoints=[dict(
      step=0, variance=variance, mean_sq_norm=1.0 + variance / 16, draws=16,
      env_steps_per_task=20.0, tokens_per_task=100.0)])
  for name, payload in (("config.json", config), ("metrics.jsonl", records),
                        ("summary.json", summary), ("gradient_variance.json", gv),
                        ("provenance.json", dict(commit="abcdef0123",
                                                 commands=dict(train="fixture")))):
    _write(os.path.join(workdir, name), payload)


def _fixture(root):
  for m, finals in FINAL.items():
    for s, start, final in zip(SEEDS, START, finals):
      _run(os.path.join(root, "runs", m, f"seed{s}"), start, final, VARIANCE[m])
  # An unfinished run of a fourth seed is not a paired seed.
  os.makedirs(os.path.join(root, "runs", "bpo", "seed3"))


def test_report_reproduces_the_figures(tmp_path):
  results = tmp_path / "results"
  _fixture(str(results))
  doc = tmp_path / "RESULTS.md"
  doc.write_text(f"# R\n\nabove\n{regime_report.BEGIN}\nstale\n{regime_report.END}\nbelow\n")
  args = [f"--results={results}", f"--doc={doc}"]
  assert regime_report.main(args + ["--check"]) == 1
  assert regime_report.main(args) == 0
  assert regime_report.main(args + ["--check"]) == 0
  text = doc.read_text()
  assert text.startswith("# R\n\nabove\n") and text.endswith("below\n") and "stale" not in text
  # BPO − RLOO per seed 0.3, 0.2, 0.1: 0.2 ± 4.302653 · 0.1 / √3, MDD 5.363313 · 0.1 / √3.
  assert "| BPO − RLOO | 0.200 [-0.048, 0.448] | 0.100 | 0.310 |" in text
  # The best baseline is GRPO (mean 0.533 > 0.5); its gains 0.2, 0.1, 0.2 over the warm start.
  assert "| GRPO − warm start (the best baseline's gain) | 0.167 [0.023, 0.310] | 0.058 |" in text
  # BPO's final success 0.7 ± 0.248414, inside [0, 1].
  assert "| BPO | 0.700 [0.452, 0.948] | 20.0 | 100 |" in text
  # Claim 2 at the shared checkpoint: variances 1, 4, 2 on every seed.
  # (‖E g‖² = 1 on every seed: the relative ratios equal the raw ones.)
  assert ("| 0 | 3 | 16 | BPO 1, GRPO 4, RLOO 2 | 0.50 [0.50, 0.50] | 3 | 0.50 [0.50, 0.50] "
          "| 0.25 [0.25, 0.25] | 0.25 [0.25, 0.25] |\n") in text
  # Claim 3: GRPO's mean final 0.533; BPO's mean curve (0.367, 0.617, 0.7) stays above it from
  # update 1, GRPO's own (0.367, 0.492, 0.533) from update 2.
  assert "GRPO) mean final success, 0.533" in text
  assert "BPO 1 [" in text and "GRPO 2 [" in text
  assert "| 1 | 120 | 0.400 | 0.700 | 0.500 | 0.500 |" in text  # seed 1's row
  assert "a warm start of 32 expert episodes over 120 steps;" in text
  assert "3 paired seeds (0, 1, 2), 7 short of the 10 the comparison asks for," in text
  assert "Code abcdef0; commands (S: each seed): `fixture`." in text
  assert (results / "regime_curves.png").stat().st_size > 0


def test_a_warm_start_stopped_at_its_target_reports_each_seeds_steps(tmp_path):
  """With `warm_start.target_success` each seed's warm-start steps are its `stopped_at`."""
  _fixture(str(tmp_path))
  stops = {0: 90, 1: 110, 2: 150}
  for m in FINAL:
    for s in SEEDS:
      workdir = tmp_path / "runs" / m / f"seed{s}"
      config = json.loads((workdir / "config.json").read_text())
      config["warm_start"].update(steps=150, target_success=0.3, check_every=10,
                                  validation_tasks=64)
      _write(str(workdir / "config.json"), config)
      records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
      checks = [dict(phase="warm_start", iteration=0, step=k, loss=0.5, validation_success=0.1)
                for k in range(10, stops[s] + 1, 10)]
      checks[-1].update(validation_success=0.3, stopped_at=stops[s])
      _write(str(workdir / "metrics.jsonl"), checks + records)
  # Seed 2 stops at the maximum, its last check below the target.
  for m in FINAL:
    path = tmp_path / "runs" / m / "seed2" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[len(range(10, 151, 10)) - 1]["validation_success"] = 0.2
    _write(str(path), records)
  x = regime_report.summarise(regime_report.load(str(tmp_path)))
  assert x["per_seed"]["steps"] == ["90", "110", "150 (target not reached)"]
  assert regime_report.per_seed_lines(x)[3] == "| 1 | 110 | 0.400 | 0.700 | 0.500 | 0.500 |"
  assert ("from a warm start of 32 expert episodes stopped at the first check (every 10 steps, "
          "at most 150) where greedy success on 64 training tasks it did not demonstrate "
          "reached 0.3;") in regime_report.section(x)


def test_ten_paired_seeds_are_not_called_short():
  assert regime_report.seeds_words(list(range(10))) == (
      "10 paired seeds (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)")
  assert regime_report.seeds_words([4, 7]) == (
      "2 paired seeds (4, 7), 8 short of the 10 the comparison asks for")


def test_too_few_paired_seeds_is_one_line(tmp_path, capsys):
  _run(str(tmp_path / "runs" / "bpo" / "seed0"), 0.3, 0.6, 1.0)
  doc = tmp_path / "RESULTS.md"
  doc.write_text(f"{regime_report.BEGIN}\n{regime_report.END}\n")
  assert regime_report.main([f"--results={tmp_path}", f"--doc={doc}"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "0 seed(s) finished by every method" in err


@pytest.mark.parametrize("regime, world", [("rooms_regime", "rooms"),
                                           ("rooms_d2_regime", "rooms_d2")])
def test_config_is_the_rooms_comparison_from_a_warm_start_stopped_at_a_target(regime, world):
  import importlib
  from bpo_jax.training import warm_start
  module = importlib.import_module(f"experiments.configs.{regime}")
  c = module.get_config()
  r = importlib.import_module(f"experiments.configs.{world}").get_config()
  assert c.env.options.difficulty == r.env.options.difficulty
  assert c.env.max_turns == r.env.max_turns
  assert c.warm_start.target_success == getattr(module, "TARGET_SUCCESS") > 0
  assert c.warm_start.steps > r.warm_start.steps
  assert c.rollout.max_env_steps == r.rollout.max_env_steps  # the same matched budget
  assert c.rollout.max_tree_tokens >= 4 * c.model.max_length  # four whole contexts at least
  assert c.eval.num_tasks == c.env.num_eval_tasks == 512
  assert c.rollout.task_offset == c.warm_start.num_trajectories
  # The validation tasks lie past every position the iterations draw: [N, N + 64 · 8).
  start, _ = warm_start.validation_positions(c.env.num_train_tasks, c.warm_start.validation_tasks)
  assert c.rollout.task_offset + c.train.iterations * c.rollout.tasks_per_iteration <= start


def test_the_difficulty_2_regime_differs_from_the_first_in_its_world_and_warm_start_alone():
  """`rooms_d2_regime.py` is `rooms_regime.py` with `rooms_d2.world`'s settings, observations
  and context for its longer observations, and its own warm start (episodes, steps, target) and
  the training tasks that start after it: the same held-out set, schedule and learning rate."""
  from bpo_jax.training import config as config_lib
  from experiments.configs import rooms_d2_regime
  flat = lambda c: dict(_flatten(config_lib.to_plain(c)))
  one, two = flat(rooms_regime.get_config()), flat(rooms_d2_regime.get_config())
  assert {k for k in one if one[k] != two.get(k)} == {
      "env.options.difficulty", "env.max_turns", "model.max_length", "rollout.max_env_steps",
      "env.max_observation_tokens", "rollout.max_tree_tokens", "warm_start.num_trajectories",
      "warm_start.steps", "warm_start.target_success", "rollout.task_offset",
      "env.num_train_tasks"}
  assert two["env.options.difficulty"] == 2 and two["rollout.max_env_steps"] == 4 * 7


@pytest.mark.slow
def test_the_difficulty_2_regime_keeps_every_expert_observation_whole_and_its_path_in_context(
    tmp_path):
  """With the world's tokenizer (trained as a run trains it), every observation of the expert
  episodes of the tuning worlds' training tasks and of the comparison's held-out tasks fits
  `OBSERVATION_TOKENS` (a cut one would lose the exits, the one-way door among them), and a
  path of the cut's bound fits the context."""
  from bpo_jax.sandboxes import rooms
  from bpo_jax.text import build
  from experiments.configs import rooms_d2_regime
  c = rooms_d2_regime.get_config()
  train = rooms.make_tasks("train", num=c.env.num_train_tasks, seed=0, difficulty=2)
  tokenizer, fmt = build.build_text("rooms", str(tmp_path), train, env_options={"difficulty": 2},
                                    max_observation_tokens=c.env.max_observation_tokens)
  assert fmt.path_token_bound(c.env.max_turns, c.rollout.max_action_tokens) <= c.model.max_length
  longest = 0
  for split, seed in (("train", 1), ("test", 0)):
    for task in rooms.make_tasks(split, num=256, seed=seed, difficulty=2):
      sandbox = rooms.make_sandbox(max_steps=c.env.max_turns)
      observations = [sandbox.reset(task)]
      observations += [sandbox.step(a).observation for a in rooms.expert_actions(task)]
      longest = max([longest] + [len(tokenizer.encode(o, add_special_tokens=False))
                                 for o in observations])
  assert 40 < longest <= c.env.max_observation_tokens, longest


def _flatten(tree, prefix=""):
  for key, value in tree.items():
    if isinstance(value, dict) and value:
      yield from _flatten(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def test_claim2_against_rloo_alone(tmp_path):
  """GRPO's draws are optional: without them its column reads "not measured"."""
  _fixture(str(tmp_path))
  for s in SEEDS:
    os.remove(tmp_path / "runs" / "grpo" / f"seed{s}" / "gradient_variance.json")
  x = regime_report.summarise(regime_report.load(str(tmp_path)))
  assert x["claim2"][0]["rloo_raw"]["ratio"] == pytest.approx(0.5) and x["claim2"][0]["below"] == 3
  assert regime_report.claim2_lines(x)[-1].endswith("| not measured |")


def test_claim2_with_the_draws_gram_matrices_resamples_draws_too(tmp_path):
  """Files that keep their draws' Gram matrix (grad_variance.py --gram): the ratios are those of
  the variances the matrices give, the bootstrap resamples draws as well, and the section says
  so; without them, seeds alone."""
  _fixture(str(tmp_path))
  rng = np.random.RandomState(0)
  variances = {}
  for m, spread in (("bpo", 1.0), ("grpo", 3.0), ("rloo", 2.0)):
    for s in SEEDS:
      g = 1.0 + spread * rng.randn(16, 5)
      var = float(np.sum((g - g.mean(0)) ** 2) / 15)
      variances.setdefault(m, []).append(var)
      _write(str(tmp_path / "runs" / m / f"seed{s}" / "gradient_variance.json"), dict(
          draws=16, params_of="bpo", checkpoints=[dict(
              step=0, variance=var, mean_sq_norm=float(g.mean(0) @ g.mean(0)), draws=16,
              gram=(g @ g.T).tolist(), env_steps_per_task=20.0, tokens_per_task=100.0)]))
  x = regime_report.summarise(regime_report.load(str(tmp_path)))
  c = x["claim2"][0]
  assert c["resampled"] == "seeds and draws"
  assert c["rloo_raw"]["ratio"] == pytest.approx(np.mean(variances["bpo"])
                                                 / np.mean(variances["rloo"]), rel=1e-12)
  assert c["rloo_raw"]["low"] < c["rloo_raw"]["ratio"] < c["rloo_raw"]["high"]
  assert "95% percentile bootstrap over seeds and draws;" in regime_report.section(x)
  _fixture(str(tmp_path / "plain"))
  plain = regime_report.summarise(regime_report.load(str(tmp_path / "plain")))
  assert plain["claim2"][0]["resampled"] == "seeds"
  assert "95% percentile bootstrap over seeds;" in regime_report.section(plain)


@pytest.mark.parametrize("gram, why", [([[1.0, 0.0], [0.0]], "ragged"),
                                       ([[1.0, 0.0], [0.0, 1.0]], "2 x 2 for 16 draws")])
def test_a_gram_matrix_of_another_shape_is_one_line(tmp_path, capsys, gram, why):
  """A gradient_variance.json whose Gram matrix is not draws x draws: one line naming the
  method, seed and checkpoint, exit 2, the doc untouched."""
  del why
  _fixture(str(tmp_path))
  for m in ("bpo", "grpo", "rloo"):
    for s in SEEDS:
      path = tmp_path / "runs" / m / f"seed{s}" / "gradient_variance.json"
      saved = json.loads(path.read_text())
      good = np.eye(16).tolist()
      saved["checkpoints"][0]["gram"] = gram if (m, s) == ("rloo", 1) else good
      _write(str(path), saved)
  doc = tmp_path / "RESULTS.md"
  doc.write_text(f"{regime_report.BEGIN}\nkept\n{regime_report.END}\n")
  assert regime_report.main([f"--results={tmp_path}", f"--doc={doc}"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1
  assert "rloo seed 1, checkpoint 0:" in err and "is not a 16 x 16 matrix" in err
  assert "kept" in doc.read_text()


def test_claim2_from_another_measurement_of_the_same_checkpoints(tmp_path, capsys):
  """`--claim2=DIR`: the gradient variances of DIR/runs/EST/seedS (grad_variance.py's
  `--params_from` output, e.g. at more draws) replace the runs' own; a run DIR has not measured
  counts as unmeasured; a DIR without runs/ is one line, exit 2."""
  _fixture(str(tmp_path / "results"))
  other = tmp_path / "more_draws"
  for m, variance in (("bpo", 3.0), ("rloo", 4.0), ("grpo", 12.0)):
    for s in SEEDS[:2]:  # seed 2 not measured there
      os.makedirs(other / "runs" / m / f"seed{s}")
      _write(str(other / "runs" / m / f"seed{s}" / "gradient_variance.json"), dict(
          draws=64, params_of="bpo", checkpoints=[dict(
              step=64, variance=variance, mean_sq_norm=1.0 + variance / 64, draws=64,
              env_steps_per_task=20.0, tokens_per_task=100.0)]))
  x = regime_report.summarise(regime_report.load(str(tmp_path / "results"), str(other)))
  c = x["claim2"]
  assert list(c) == [64] and c[64]["seeds"] == 2 and c[64]["draws"] == 64
  assert c[64]["rloo_raw"]["ratio"] == pytest.approx(0.75)
  assert c[64]["grpo_raw"]["ratio"] == pytest.approx(0.25)
  assert c[64]["variance"] == dict(bpo=3.0, grpo=12.0, rloo=4.0)
  # The rest of the report is the runs' own.
  assert x == {**regime_report.summarise(regime_report.load(str(tmp_path / "results"))),
               "claim2": c}
  doc = tmp_path / "RESULTS.md"
  doc.write_text(f"{regime_report.BEGIN}\n{regime_report.END}\n")
  # A measurement that records its commit and command is named in the provenance line.
  path = other / "runs" / "bpo" / "seed0" / "gradient_variance.json"
  saved = json.loads(path.read_text())
  _write(str(path), dict(saved, provenance=dict(commit="123456789a", command="gv --first_seed=0")))
  line = regime_report.provenance_line(regime_report.summarise(
      regime_report.load(str(tmp_path / "results"), str(other))))
  assert line == ("Code abcdef0, claim 2 measured at 1234567; commands (S: each seed): "
                  "`fixture`, `gv --first_seed=S`.")
  assert regime_report.main([f"--results={tmp_path / 'results'}", f"--doc={doc}",
                             f"--claim2={tmp_path / 'none'}"]) == 2
  err = capsys.readouterr().err
  assert "--claim2=" in err and "no runs/ directory" in err and len(err.splitlines()) == 1


def test_the_warm_start_pilot_resumes_after_each_finished_seed(tmp_path):
  """A seed counts as done once its last check (step == steps) is in the file."""
  from experiments import warm_start_pilot
  path = tmp_path / "pilot.jsonl"
  assert warm_start_pilot.done_seeds(str(path)) == set()
  _write(str(path), [dict(seed=0, step=s, steps=20) for s in (10, 20)]
         + [dict(seed=1, step=10, steps=20)])
  assert warm_start_pilot.done_seeds(str(path)) == {0}
  # A run killed while writing seed 1's last check: the cut line is dropped from the file.
  whole = path.read_bytes()
  with open(path, "ab") as f:
    f.write(b'{"seed": 1, "step": 2')
  assert warm_start_pilot.done_seeds(str(path)) == {0} and path.read_bytes() == whole


def test_the_warm_start_pilot_names_an_out_it_cannot_write_in_one_line(tmp_path):
  (tmp_path / "file").write_text("")
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "warm_start_pilot.py"),
       f"--config={os.path.join(ROOT, 'experiments', 'configs', 'rooms_regime.py')}",
       f"--out={tmp_path / 'file' / 'pilot.jsonl'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 1, result.stderr
  assert result.stderr == f"error: --out={tmp_path / 'file' / 'pilot.jsonl'}: Not a directory\n"


def test_every_experiments_script_imports_beside_the_others():
  # A script that defined its flags at import would clash with run.py's in one process (a
  # test worker imports several): each defines them only when run as a command.
  names = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "experiments"))
                 if f.endswith(".py") and f != "__init__.py")
  code = "; ".join(f"import experiments.{n}" for n in names) + "; print('ok')"
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.stdout == "ok\n", result.stderr[-2000:]
  assert {"run", "warm_start_pilot", "compare", "grad_variance"} <= set(names)


@pytest.mark.parametrize("flags_, expected", [
    (["--steps=15", "--out=OUT"], "error: --steps = 15 and --heldout_every = 20: must be "
                                  "multiples of warm_start.check_every = 10\n"),
    ([], "error: --out is required, e.g. --out=results/rooms_regime/warm_start_pilot.jsonl\n"),
    (["--config.warm_start.target=0.3", "--out=OUT"], "error: warm_start.target: unknown key;"),
])
def test_the_warm_start_pilot_refuses_bad_flags_in_one_line(tmp_path, flags_, expected):
  out = tmp_path / "pilot.jsonl"
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "warm_start_pilot.py"),
       f"--config={os.path.join(ROOT, 'experiments', 'configs', 'rooms_regime.py')}",
       *(f.replace("OUT", str(out)) for f in flags_)],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and result.stderr.startswith(expected), result.stderr
  assert result.stderr.count("\n") == 1 and not out.exists()


def test_by_task_by_hand():
  d = regime_report.by_task(np.array([[1, 0], [1, 1]]), np.array([[0, 0], [1, 0]]))
  assert (d["a_only"], d["b_only"], d["mean"], d["seeds"], d["tasks"]) == (2, 0, 0.5, 2, 2)
  # Every resample of a constant difference is that constant.
  d = regime_report.by_task(np.ones((3, 5)), np.zeros((3, 5)))
  assert (d["mean"], d["low"], d["high"]) == (1.0, 1.0, 1.0)
  # The mean is the mean over seeds of each seed's difference of success rates.
  rng = np.random.default_rng(0)
  a, b = rng.integers(0, 2, (4, 64)), rng.integers(0, 2, (4, 64))
  d = regime_report.by_task(a, b, draws=200)
  assert d["mean"] == pytest.approx(np.mean(a.mean(1) - b.mean(1)), abs=1e-15)
  assert d["a_only"] - d["b_only"] == int((a - b).sum()) and d["low"] < d["mean"] < d["high"]


def _with_task_outcomes(root, replay_seed=None):
  """The fixture's runs with 10 held-out tasks each, the first round(10 · success) solved: in
  the records' `task_successes`, or for `replay_seed` in task_outcomes.json (a replay)."""
  for m in FINAL:
    for s in SEEDS:
      workdir = os.path.join(root, "runs", m, f"seed{s}")
      path = os.path.join(workdir, "metrics.jsonl")
      records = [json.loads(line) for line in open(path, encoding="utf-8")]
      replayed = {}
      for r in records:
        if r["phase"] == "eval":
          solved = round(10 * r["success_rate"])
          text = "1" * solved + "0" * (10 - solved)
          if s == replay_seed:
            replayed[str(r["iteration"])] = text
          else:
            r["task_successes"] = text
      _write(path, records)
      if replayed:
        _write(os.path.join(workdir, regime_report.REPLAYED),
               dict(outcomes=replayed, commit="0123456789", command="replay"))


def test_the_differences_paired_by_task_and_seed(tmp_path):
  _fixture(str(tmp_path))
  # Without per-task outcomes the section says how many seeds have them.
  x = regime_report.summarise(regime_report.load(str(tmp_path)))
  assert x["by_task"] is None and regime_report.by_task_lines(x) == [
      "Paired by task: the per-task outcomes are known for 0 of 3 seeds (`python "
      "experiments/task_outcomes.py` replays them from the checkpoints)."]
  _with_task_outcomes(str(tmp_path), replay_seed=1)
  x = regime_report.summarise(regime_report.load(str(tmp_path)))
  lines = "\n".join(regime_report.by_task_lines(x))
  # Solved per seed: BPO 6, 7, 8; GRPO 5, 5, 6; RLOO 3, 5, 7; the warm start 3, 4, 4.
  assert "(3 seeds × 10 tasks;" in lines and "(code 0123456)" in lines
  assert "| BPO − GRPO | 5 | 0 | 0.167 [" in lines  # (1 + 2 + 2) / 30
  assert "| BPO − RLOO | 6 | 0 | 0.200 [" in lines  # (3 + 2 + 1) / 30
  assert "| GRPO − warm start | 5 | 0 | 0.167 [" in lines  # (2 + 1 + 2) / 30
  for d in x["by_task"].values():
    assert 0 <= d["low"] <= d["mean"] <= d["high"] <= 1


@pytest.mark.parametrize("args, message", [
    ([], "error: the following arguments are required: --results"),
    (["--results=RESULTS", "--seeds=3"], "error: unrecognized arguments: --seeds=3"),
    (["--results=RESULTS"],
     "error: --results=RESULTS: no finished run (runs/EST/seedS/summary.json)"),
])
def test_task_outcomes_refuses_bad_flags_in_one_line(tmp_path, capsys, args, message):
  from experiments import task_outcomes
  with pytest.raises(SystemExit) as exit_:
    task_outcomes.main([a.replace("RESULTS", str(tmp_path)) for a in args])
  assert exit_.value.code == 2
  assert capsys.readouterr().err == message.replace("RESULTS", str(tmp_path)) + "\n"


def test_a_replay_that_fails_is_one_line_and_no_file(tmp_path, capsys):
  """A run without its checkpoints (or with unreadable ones): reported, exit status 1, and the
  other runs still replayed (here: none can be)."""
  from experiments import task_outcomes
  _fixture(str(tmp_path))
  for m in FINAL:
    for s in SEEDS:
      _write(str(tmp_path / "runs" / m / f"seed{s}.json"), {})
  assert task_outcomes.main([f"--results={tmp_path}"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 9  # every method and seed
  assert err[0].startswith("error: runs/bpo/seed0: the replay failed: FileNotFoundError: no "
                           "checkpoint directory")
  assert not list(tmp_path.glob("runs/*/*/task_outcomes.json"))


def test_a_replay_file_cut_short_is_named_in_one_line(tmp_path, capsys):
  _fixture(str(tmp_path / "results"))
  path = tmp_path / "results" / "runs" / "grpo" / "seed1" / regime_report.REPLAYED
  path.write_text('{"outcomes": {"2": "10')
  doc = tmp_path / "RESULTS.md"
  doc.write_text(f"{regime_report.BEGIN}\n{regime_report.END}\n")
  assert regime_report.main([f"--results={tmp_path / 'results'}", f"--doc={doc}"]) == 2
  err = capsys.readouterr().err
  assert f"{path} does not read:" in err and err.count("\n") == 1
  assert doc.read_text() == f"{regime_report.BEGIN}\n{regime_report.END}\n"
