"""Sandbox costs per environment: step, snapshot, restore, snapshot size, pool throughput.

For every environment in `ENVIRONMENTS`: the median time of one step, one snapshot and one
restore (from bytes, as another process would), the snapshot size, and the steps per second of
a `SandboxPool` with 1 and 2 worker processes stepping 8 branches. For TextWorld also the
reference: TextWorld's own `env.copy()` (the `textworld.start` environment with admissible
commands requested, as agents use it), measured side by side in the same run.

    python benchmarks/sandboxes.py [--json] [--envs rooms textworld] [--repeats 51]
    python benchmarks/sandboxes.py --json --backend=ray --envs rooms   # beside the processes

With --json: one object with `<env>_step_ms`, `<env>_snapshot_ms`, `<env>_restore_ms`,
`<env>_snapshot_bytes`, `<env>_pool1_steps_per_s`, `<env>_pool2_steps_per_s`, and for
TextWorld `textworld_env_copy_ms`, `textworld_snapshot_restore_over_step` ((snapshot + restore)
/ step; target <= 1.0) and `textworld_speedup_vs_env_copy` (env.copy() / (snapshot + restore)).
For ALFWorld the reference is TextWorld's PddlEnv.reset() plus a replay of the prefix (how
ALFWorld returns to a state): `alfworld_reset_replay_ms`, `alfworld_handle_restore_ms` (the
in-process restore) and `alfworld_speedup_vs_reset_replay`.
For SWE the reference is the same shell commands run unconfined (`subprocess.run(["sh", "-c",
...])` in a plain copy of the task directory): `swe_unconfined_step_ms`,
`swe_confined_over_unconfined` (confined step / unconfined command) and
`swe_snapshot_restore_over_step` (target <= 1.0); `swe_instance_*`: the same figures for a
real-format SWE-bench instance selected by config and run in its own Python environment.

With --backend=ray, beside the process pool in the same run, the same pool on Ray: a local
cluster of two simulated sandbox nodes on this machine (loopback only, `testing/ray_cluster.py`),
two actors, one per node. Per environment: `<env>_{processes,ray}_steps_per_s` (2 workers, 8
branches), `<env>_ray_over_processes_steps_per_second`, `<env>_{processes,ray}_snapshot_restore_s`
(a fork: a pool snapshot of a branch on one worker plus its restore into a new branch on the
other, one node to the other on Ray, the new branch's sandbox built on the way; median) and `<env>_ray_cross_node_restore_bytes` (what that restore
moves between nodes: the pickled snapshot to the restoring actor and the pickled answer, with
the branch's backup, back to the pool); `ray_over_processes_steps_per_second` is the median of
the environments' ratios.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402
from bpo_jax.sandboxes import base  # noqa: E402
from bpo_jax.sandboxes import pool as pool_lib  # noqa: E402
from bpo_jax.testing import ray_cluster  # noqa: E402
from bpo_jax.sandboxes import registry  # noqa: E402

TEXTWORLD_GAMES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "tests", "fixtures", "textworld_games")

# One entry per environment: the registry name, sandbox config, task config, actions taken
# before the measured state, and the actions whose steps are timed (each from that state).
# Add an environment with one more entry.
ENVIRONMENTS = {
    "rooms": dict(sandbox={}, tasks={"difficulty": 3}, prefix=[],
                  actions=["go north", "go south", "go east", "go west", "look"]),
    "textworld": dict(sandbox={}, tasks={"games_dir": TEXTWORLD_GAMES}, prefix=["look"],
                      actions=["go north", "examine box", "inventory", "look",
                               "unlock box with keycard"]),
    "frozenlake": dict(sandbox={}, tasks={}, prefix=[], actions=["left", "down", "right", "up"]),
    "taxi": dict(sandbox={}, tasks={}, prefix=[], actions=["south", "north", "east", "west"]),
    "cliffwalking": dict(sandbox={}, tasks={}, prefix=[], actions=["up", "right", "left"]),
    "blackjack": dict(sandbox={}, tasks={}, prefix=[], actions=["hit", "stick"]),
    "webshop": dict(sandbox={"num_products": 1000}, tasks={"num_products": 1000},
                    prefix=["search[black]"], actions=["click[Next >]", "click[Back to Search]"]),
    "swe": dict(sandbox={}, tasks={}, prefix=["write notes.txt\ndraft"],
                actions=["run ls -R", "run cat rle/codec.py", "run grep -n def rle/codec.py"]),
    # A generated game (every generated room has a garbage can).
    "alfworld": dict(sandbox={}, tasks={"num_distractors": (4, 8)},
                     prefix=["go to garbagecan 1", "examine garbagecan 1"],
                     actions=["look", "inventory", "examine garbagecan 1", "help"]),
}


def _median_ms(fn, repeats, setup=lambda: None):
  times = []
  for _ in range(repeats):
    setup()
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def _task(name, spec):
  tasks = registry.get_environment(name).make_tasks("train", 2, 0, **spec["tasks"])
  if name == "textworld":
    return next(t for t in tasks if t.task_id.endswith("custom-s1"))
  return tasks[0]


def measure_sandbox(name, spec, repeats):
  module = registry.get_environment(name)
  sandbox = module.make_sandbox(**spec["sandbox"])
  sandbox.reset(_task(name, spec))
  for action in spec["prefix"]:
    sandbox.step(action)
  snap = base.Snapshot(sandbox.snapshot().data)
  actions = spec["actions"]
  counter = iter(range(10**9))

  def restore():
    sandbox.restore(snap)

  def step():
    sandbox.step(actions[next(counter) % len(actions)])

  step_ms = _median_ms(step, repeats, setup=restore)
  snapshot_ms = _median_ms(sandbox.snapshot, repeats, setup=restore)
  restore_ms = _median_ms(restore, repeats)
  return snap, {"step_ms": step_ms, "snapshot_ms": snapshot_ms, "restore_ms": restore_ms,
                "snapshot_bytes": len(snap)}


def measure_pool(name, spec, snap, num_workers, branches=8, rounds=6, pool_class=None):
  """Steps per second of `branches` branches stepped together; finished ones are restored."""
  pool_class = pool_class or pool_lib.SandboxPool
  with pool_class.for_environment(name, num_workers=num_workers, timeout_s=60.0,
                                  **spec["sandbox"]) as pool:
    ids = list(range(branches))
    pool.restore_many({b: snap for b in ids})
    actions = spec["actions"]
    steps = 0
    start = time.perf_counter()
    for r in range(rounds):
      results = pool.step_many({b: actions[(b + r) % len(actions)] for b in ids})
      steps += len(results)
      finished = [b for b, s in results.items() if not isinstance(s, base.Step) or s.done]
      if finished:
        pool.restore_many({b: snap for b in finished})
    return steps / (time.perf_counter() - start)


def measure_pool_snapshot_restore(name, spec, snap, repeats, pool_class=None):
  """Median seconds of a pool snapshot of a branch on worker 0 plus its restore into a branch
  on worker 1, and the pool."""
  pool_class = pool_class or pool_lib.SandboxPool
  with pool_class.for_environment(name, num_workers=2, timeout_s=60.0,
                                  **spec["sandbox"]) as pool:
    pool.restore("source", snap)
    assert pool.worker_of("source") == 0
    pool.step("source", spec["actions"][0])
    times = []
    for i in range(repeats):
      start = time.perf_counter()
      taken = pool.snapshot("source")
      pool.restore(f"copy{i}", taken)  # worker 1: one branch fewer than worker 0
      times.append(time.perf_counter() - start)
      assert pool.worker_of(f"copy{i}") == 1, "the copy must land on the other worker"
      pool.close(f"copy{i}")
    return statistics.median(times)


def measure_ray_cross_node_restore_bytes(name, spec, snap):
  """The pickled sizes of what a restore on another node moves: the snapshot there, the answer
  (with the branch's backup) back."""
  import pickle  # pylint: disable=g-import-not-at-top
  from bpo_jax.sandboxes import ray_pool  # pylint: disable=g-import-not-at-top
  with ray_pool.RaySandboxPool.for_environment(name, num_workers=2, timeout_s=60.0,
                                               **spec["sandbox"]) as pool:
    source = pool.restore_many({"source": snap, "other": snap})
    assert all(r is None for r in source.values())
    assert pool.node_of("source") != pool.node_of("other")
    taken = pool.snapshot("source")
    # The call the pool sends for a restore on the other node, and its answer.
    actor = pool._workers[pool.worker_of("other")].actor  # pylint: disable=protected-access
    import ray  # pylint: disable=g-import-not-at-top
    answer = ray.get(actor.run.remote("restore", "other", taken, True))
    assert answer[0] == "ok"
    return len(pickle.dumps(taken)) + len(pickle.dumps(answer))


def compare_backends(name, spec, snap, repeats):
  """The process pool and the Ray pool (inside a two-node local cluster), side by side."""
  from bpo_jax.sandboxes import ray_pool  # pylint: disable=g-import-not-at-top
  figures = {}
  for backend, pool_class in (("processes", pool_lib.SandboxPool),
                              ("ray", ray_pool.RaySandboxPool)):
    figures[f"{name}_{backend}_steps_per_s"] = measure_pool(name, spec, snap, 2,
                                                            pool_class=pool_class)
    figures[f"{name}_{backend}_snapshot_restore_s"] = measure_pool_snapshot_restore(
        name, spec, snap, max(5, repeats // 5), pool_class=pool_class)
  figures[f"{name}_ray_over_processes_steps_per_second"] = (
      figures[f"{name}_ray_steps_per_s"] / figures[f"{name}_processes_steps_per_s"])
  figures[f"{name}_ray_cross_node_restore_bytes"] = measure_ray_cross_node_restore_bytes(
      name, spec, snap)
  line = (f"{'':13s} processes {figures[f'{name}_processes_steps_per_s']:7.0f} steps/s, "
          f"ray {figures[f'{name}_ray_steps_per_s']:7.0f} steps/s "
          f"({figures[f'{name}_ray_over_processes_steps_per_second']:.2f}x); snapshot+restore "
          f"across workers {1e3 * figures[f'{name}_processes_snapshot_restore_s']:.2f} ms / "
          f"{1e3 * figures[f'{name}_ray_snapshot_restore_s']:.2f} ms across nodes; a cross-node "
          f"restore moves {figures[f'{name}_ray_cross_node_restore_bytes']} B")
  return figures, line


def measure_textworld_env_copy(spec, repeats):
  """TextWorld's own environment and its env.copy(), on the same game and state."""
  import textworld  # pylint: disable=g-import-not-at-top
  task = _task("textworld", spec)
  infos = textworld.EnvInfos(admissible_commands=True, score=True, won=True, lost=True,
                             description=True, inventory=True)
  env = textworld.start(task.game_file, request_infos=infos)
  env.reset()
  for action in spec["prefix"]:
    env.step(action)
  copy_ms = _median_ms(env.copy, repeats)
  env.close()
  return copy_ms


def measure_swe_unconfined(spec, repeats):
  """The SWE step's commands run by a plain `subprocess.run(["sh", "-c", ...])` in a copy of
  the task directory: the reference for what confinement adds to a step."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  task = _task("swe", spec)
  commands = [a.split(" ", 1)[1] for a in spec["actions"]]
  counter = iter(range(10**9))
  with tempfile.TemporaryDirectory() as workdir:
    for path, _, content in task.files:
      os.makedirs(os.path.dirname(os.path.join(workdir, path)), exist_ok=True)
      with open(os.path.join(workdir, path), "wb") as f:
        f.write(content)

    def run():
      subprocess.run(["/bin/sh", "-c", commands[next(counter) % len(commands)]], cwd=workdir,
                     capture_output=True)

    return _median_ms(run, repeats)


def _git(cwd, *args):
  import subprocess  # pylint: disable=g-import-not-at-top
  env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b.invalid",
         "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b.invalid"}
  return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, check=True,
                        capture_output=True, text=True, env=env).stdout.strip()


def swe_instance_spec(root):
  """A real-format SWE-bench instance under `root` (a clone with a base and a fix commit, a row,
  a specs file whose install step puts a module in the instance's environment) and the
  benchmark entry that selects it by config, as `env.options.instances` does."""
  import json  # pylint: disable=g-import-not-at-top
  clone = os.path.join(root, "repos", "acme__mathlib")
  os.makedirs(os.path.join(clone, "mathlib"))
  os.makedirs(os.path.join(clone, "tests"))
  with open(os.path.join(clone, "mathlib", "__init__.py"), "w") as f:
    f.write("def double(x):\n    return x + x + 1\n")
  with open(os.path.join(clone, "tests", "test_double.py"), "w") as f:
    f.write("from mathlib import double\n\n\ndef test_zero():\n    assert double(0) < 2\n")
  _git(clone, "init", "-q")
  _git(clone, "add", ".")
  _git(clone, "commit", "-qm", "base")
  base_commit = _git(clone, "rev-parse", "HEAD")
  # A later commit with the fix and a hidden test: the row's patch and test patch (checked at
  # load to apply at the base).
  with open(os.path.join(clone, "mathlib", "__init__.py"), "w") as f:
    f.write("def double(x):\n    return 2 * x\n")
  with open(os.path.join(clone, "tests", "test_double.py"), "a") as f:
    f.write("\n\ndef test_two():\n    assert double(2) == 4\n")
  _git(clone, "commit", "-qam", "fix")
  fix = _git(clone, "rev-parse", "HEAD")
  _git(clone, "checkout", "-q", base_commit)
  row = {"repo": "acme/mathlib", "instance_id": "acme__mathlib-1", "base_commit": base_commit,
         "patch": _git(clone, "diff", base_commit, fix, "--", "mathlib") + "\n",
         "test_patch": _git(clone, "diff", base_commit, fix, "--", "tests") + "\n",
         "problem_statement": "double(2) is 5", "version": "0.1",
         "FAIL_TO_PASS": ["tests/test_double.py::test_two"],
         "PASS_TO_PASS": ["tests/test_double.py::test_zero"],
         "environment_setup_commit": base_commit, "log_parser": "parse_log_pytest",
         "test_cmd": "python -m pytest -rA -p no:cacheprovider"}
  with open(os.path.join(root, "rows.jsonl"), "w") as f:
    f.write(json.dumps(row) + "\n")
  install = ["python -c \"import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()"
             "['purelib'], 'tinydep.py').write_text('FACTOR = 2')\""]
  with open(os.path.join(root, "specs.json"), "w") as f:
    json.dump({"acme/mathlib": {"0.1": {"install": install}}}, f)
  options = {"instances": os.path.join(root, "rows.jsonl"), "specs": os.path.join(root,
             "specs.json"), "repos_dir": os.path.join(root, "repos"),
             "envs_dir": os.path.join(root, "envs")}
  return dict(sandbox=options, tasks=options, prefix=["write notes.txt\ndraft"],
              actions=["run ls -R", "run cat mathlib/__init__.py",
                       "run python -c 'import tinydep'"])


def measure_alfworld_reference(spec, repeats):
  """ALFWorld's own way back to a state, TextWorld's PddlEnv.reset() and a replay of the prefix,
  against the sandbox's in-process restore (engine state id and fact copy) of the same state."""
  from bpo_jax.sandboxes import alfworld  # pylint: disable=g-import-not-at-top
  aw = alfworld._alfworld()  # pylint: disable=protected-access
  task = _task("alfworld", spec)
  env = aw["alfred_tw_env"].AlfredDemangler(
      aw["PddlEnv"](aw["textworld"].EnvInfos(admissible_commands=True, won=True)))
  env.load(task.game_data)

  def reset_and_replay():
    env.reset()
    for action in spec["prefix"]:
      env.step(action)

  reset_replay_ms = _median_ms(reset_and_replay, max(5, repeats // 5))
  env.close()
  sandbox = alfworld.make_sandbox(**spec["sandbox"])
  sandbox.reset(task)
  for action in spec["prefix"]:
    sandbox.step(action)
  snap = sandbox.snapshot()  # with its in-process handle
  handle_restore_ms = _median_ms(lambda: sandbox.restore(snap), repeats)
  sandbox.close()
  return reset_replay_ms, handle_restore_ms


def main(argv=None):
  parser = common.parser(__doc__.split("\n")[0])
  parser.add_argument("--envs", nargs="*", default=list(ENVIRONMENTS))
  parser.add_argument("--backend", choices=("processes", "ray"), default="processes",
                      help="ray: also the Ray pool on a local two-node cluster, side by side")
  parser.set_defaults(repeats=51)
  args = parser.parse_args(argv)
  unknown = sorted(set(args.envs) - set(ENVIRONMENTS))
  if unknown:
    parser.error(f"unknown environments {unknown}; known: {sorted(ENVIRONMENTS)}")
  if args.backend == "ray":
    with ray_cluster.local_cluster(num_nodes=2):
      figures, lines = measure(args)
  else:
    figures, lines = measure(args)
  common.emit(figures, args.json, lines)


def measure(args):
  """Every figure of the environments in `args.envs`, and the lines that print them."""
  figures, lines = {}, []
  ratios = []
  for name in args.envs:
    spec = ENVIRONMENTS[name]
    snap, single = measure_sandbox(name, spec, args.repeats)
    for key, value in single.items():
      figures[f"{name}_{key}"] = value
    for workers in (1, 2):
      figures[f"{name}_pool{workers}_steps_per_s"] = measure_pool(name, spec, snap, workers)
    lines.append(
        f"{name:13s} step {single['step_ms']:7.3f} ms  snapshot {single['snapshot_ms']:7.3f} ms"
        f"  restore {single['restore_ms']:7.3f} ms  size {single['snapshot_bytes']:6d} B"
        f"  pool 1 worker {figures[f'{name}_pool1_steps_per_s']:7.0f} steps/s"
        f"  2 workers {figures[f'{name}_pool2_steps_per_s']:7.0f} steps/s")
    if args.backend == "ray":
      side_by_side, line = compare_backends(name, spec, snap, args.repeats)
      figures.update(side_by_side)
      ratios.append(side_by_side[f"{name}_ray_over_processes_steps_per_second"])
      lines.append(line)
    if name == "textworld":
      copy_ms = measure_textworld_env_copy(spec, args.repeats)
      both_ms = single["snapshot_ms"] + single["restore_ms"]
      figures["textworld_env_copy_ms"] = copy_ms
      figures["textworld_snapshot_restore_over_step"] = both_ms / single["step_ms"]
      figures["textworld_speedup_vs_env_copy"] = copy_ms / both_ms
      lines.append(
          f"{'':13s} snapshot+restore / step = "
          f"{figures['textworld_snapshot_restore_over_step']:.3f} (target <= 1.0); "
          f"env.copy() {copy_ms:.3f} ms, {figures['textworld_speedup_vs_env_copy']:.1f}x slower "
          f"than snapshot+restore")
    if name == "swe":
      plain_ms = measure_swe_unconfined(spec, args.repeats)
      figures["swe_unconfined_step_ms"] = plain_ms
      figures["swe_confined_over_unconfined"] = single["step_ms"] / plain_ms
      figures["swe_snapshot_restore_over_step"] = (
          single["snapshot_ms"] + single["restore_ms"]) / single["step_ms"]
      lines.append(
          f"{'':13s} the same commands unconfined (subprocess sh -c) {plain_ms:.3f} ms: "
          f"confinement costs {figures['swe_confined_over_unconfined']:.2f}x; "
          f"snapshot+restore / step = {figures['swe_snapshot_restore_over_step']:.3f}")
      import tempfile  # pylint: disable=g-import-not-at-top
      with tempfile.TemporaryDirectory(prefix="bpo_bench_swe_") as root:
        os.chmod(root, 0o755)
        _, inst = measure_sandbox("swe", swe_instance_spec(root), args.repeats)
      for key, value in inst.items():
        figures[f"swe_instance_{key}"] = value
      figures["swe_instance_snapshot_restore_over_step"] = (
          inst["snapshot_ms"] + inst["restore_ms"]) / inst["step_ms"]
      lines.append(
          f"{'':13s} a real-format instance in its own environment: step {inst['step_ms']:.3f} "
          f"ms, snapshot {inst['snapshot_ms']:.3f} ms, restore {inst['restore_ms']:.3f} ms; "
          f"snapshot+restore / step = {figures['swe_instance_snapshot_restore_over_step']:.3f}")
    if name == "alfworld":
      reset_replay_ms, handle_ms = measure_alfworld_reference(spec, args.repeats)
      figures["alfworld_reset_replay_ms"] = reset_replay_ms
      figures["alfworld_handle_restore_ms"] = handle_ms
      figures["alfworld_speedup_vs_reset_replay"] = reset_replay_ms / handle_ms
      lines.append(
          f"{'':13s} PddlEnv.reset() + replay of the prefix {reset_replay_ms:.3f} ms; in-process "
          f"restore {handle_ms:.4f} ms ({figures['alfworld_speedup_vs_reset_replay']:.0f}x faster)"
          f"; the bytes restore above applies the recorded operators in the engine")
  if ratios:
    figures["ray_over_processes_steps_per_second"] = statistics.median(ratios)
  return figures, lines


if __name__ == "__main__":
  main()
