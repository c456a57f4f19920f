"""The persistent compilation cache: where it lives, and that a second process on the same
directory compiles (almost) nothing that the first compiled."""

import json
import os
import subprocess
import sys

import pytest

from bpo_jax.training import compile_cache
from bpo_jax.training import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_directory_is_the_key_then_jax_variable_then_the_user_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  assert compile_cache.resolve_directory("") == str(tmp_path / "xdg" / "bpo_jax" / "jax")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jaxvar"))
  assert compile_cache.resolve_directory("") == str(tmp_path / "jaxvar")
  assert compile_cache.resolve_directory(str(tmp_path / "key")) == str(tmp_path / "key")
  assert compile_cache.resolve_directory("none") is None
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  assert compile_cache.resolve_directory("") == os.path.join(
      os.path.expanduser("~"), ".cache", "bpo_jax", "jax")


def test_the_cache_is_on_by_default():
  assert config_lib.default_config().scale.compile_cache_dir == ""


def run_counted(spec: dict) -> dict:
  """`tests/training/compile_worker.py` on `spec` in a process of its own."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, "-m", "tests.training.compile_worker", json.dumps(spec)],
                        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def _bfloat16_checkpoint(path) -> str:
  """A tiny random Qwen2 checkpoint saved in bfloat16, with a Qwen2-family tokenizer."""
  import torch  # pylint: disable=g-import-not-at-top
  from bpo_jax.testing import chat_tokenizers  # pylint: disable=g-import-not-at-top
  from bpo_jax.testing import hf_checkpoints  # pylint: disable=g-import-not-at-top
  template = os.path.join(ROOT, "tests", "fixtures", "chat_templates", "qwen2_5.jinja")
  with open(template, encoding="utf-8") as f:
    tokenizer = chat_tokenizers.family_tokenizer("qwen2", ["go north and open the door"] * 4,
                                                 f.read(), vocab_size=300)
  hf_checkpoints.make_hf_checkpoint("qwen2", str(path), vocab_size=max(len(tokenizer), 320),
                                    max_position_embeddings=1024, dtype=torch.bfloat16)
  chat_tokenizers.save_family_tokenizer(tokenizer, "qwen2", str(path))
  return str(path)


def _adapter_run(tmp_path, estimator: str, cache_dir: str) -> dict:
  """Rank-16 adapters on a bfloat16 checkpoint, three iterations with a greedy evaluation
  after each: the spec and the compile counts of its run."""
  spec = dict(cache_dir=cache_dir, estimator=estimator, iterations=3, lora_rank=16,
              eval_every=1, checkpoint=_bfloat16_checkpoint(tmp_path / "hf"))
  return spec, run_counted(dict(spec, workdir=str(tmp_path / "first")))


@pytest.fixture(scope="module")
def bpo_on_a_fresh_cache(tmp_path_factory):
  """BPO's adapter run, the first process on a fresh cache directory."""
  tmp = tmp_path_factory.mktemp("bpo_cache")
  return tmp, *_adapter_run(tmp, "bpo", str(tmp / "cache"))


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["bpo", "grpo"])
def test_nothing_compiles_after_the_first_iteration(tmp_path, request, estimator):
  """Every program the run executes after its first iteration was compiled by then (the
  optimiser state keeps its dtypes, the evaluation shares the rollout's decode programs, shapes
  fall in the same buckets). BPO's run is the first on its cache directory; GRPO's has none."""
  if estimator == "bpo":
    _, _, counts = request.getfixturevalue("bpo_on_a_fresh_cache")
  else:
    _, counts = _adapter_run(tmp_path, estimator, "none")
  first, second = counts["at_iteration"][:2]
  assert first["requests"] >= 20 and second["requests"] > first["requests"], counts
  after_first = counts["log"][second["requests"]:]
  assert counts["at_end"]["requests"] == second["requests"], after_first
  # The evaluation after the first update merges its adapters with the initial one's program.
  during = {name for name, _ in counts["log"][first["requests"]:]}
  assert not during & OF_THE_PARAMETERS, sorted(during)
  assert counts["at_end"]["cache_hits"] == 0


@pytest.mark.slow
def test_a_second_process_on_the_same_cache_compiles_at_most_a_tenth(bpo_on_a_fresh_cache):
  tmp, spec, first = bpo_on_a_fresh_cache
  first = first["at_end"]
  second = run_counted(dict(spec, workdir=str(tmp / "second")))["at_end"]
  assert first["compiles"] >= 20, first  # a run compiles dozens of programs
  assert second["requests"] == first["requests"], (first, second)  # the same programs ...
  assert second["compiles"] <= 0.1 * first["compiles"], (first, second)  # ... read back



# What the first iteration of a run with its start-up set still compiles: the fork's row
# gather, a small program, on its first use (host arrays reach the device by transfers, which
# compile nothing). None of the set's programs (the sampler's, the update's, the estimator's,
# the fork threshold's), and nothing after the first iteration.
HEAVY = {"jit(append_tokens)", "jit(generate)", "jit(train_step)",
         "jit(advantages_and_weights)", "jit(update_quantile_threshold)"}
FIRST_USE = {"jit(_gather_rows)"}
# A paged cache's: pages copied (a fork's partly filled last page; one program for the run's
# pool).
FIRST_USE_PAGED = {"jit(_copy_pages)"}
# On a mesh: the rows' gather that keeps the cache's layout.
FIRST_USE_MESH = {"jit(_take_rows_on_mesh)"}
# Programs of the policy's parameters, first compiled by the initial evaluation: the adapters'
# merge and the CPU's transposed embedding. Compiled again, the update returned parameters
# placed otherwise than the initial ones.
OF_THE_PARAMETERS = {"jit(merge_lora)", "jit(transpose)"}


@pytest.mark.slow
@pytest.mark.parametrize("kv_page_size, mesh", [(0, None), (16, None),
                                                (0, {"fsdp": 2, "tensor": 2})])
def test_with_the_start_up_set_the_iterations_compile_no_sampler_or_update_program(
    tmp_path, kv_page_size, mesh):
  """The world's tiny model with rank-4 adapters and 256 cache slots, two iterations with an
  evaluation after each, its program set compiled at start-up: the iterations run every append,
  decode loop and update from the set (no miss) and compile none of them, nor the merge of the
  updated adapters (the set's update returns the state placed as it came in); the first
  iteration compiles only `FIRST_USE`'s small programs (a paged cache's too), the second
  nothing. The same with a paged cache (its pool has one size for the run) and on a mesh of
  fsdp 2 x tensor 2 (the decode programs take the parameters in the sampling layout and the
  cache in its own, the update the train state's and the rows' layouts)."""
  counts = run_counted(dict(cache_dir="none", estimator="bpo", iterations=2, eval_every=1,
                            startup_compile="on", max_length=256, lora_rank=4,
                            kv_page_size=kv_page_size, mesh=mesh,
                            workdir=str(tmp_path / "run")))
  first = counts["at_iteration"][0]["requests"]
  during = {name for name, _ in counts["log"][first:]}
  assert not during & (HEAVY | OF_THE_PARAMETERS), sorted(during)
  allowed = FIRST_USE_MESH if mesh else FIRST_USE | (FIRST_USE_PAGED if kv_page_size else set())
  assert during <= allowed, sorted(during)
  if mesh:  # the rows were decoded on the mesh: their forks gathered there
    assert during == FIRST_USE_MESH, sorted(during)
  assert counts["at_end"]["requests"] == counts["at_iteration"][1]["requests"], counts
  with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  startup = [r for r in records if r["phase"] == "startup"]
  # Batches of 8 rows (4 decode at once), 256 slots: one window (256); prompts of at most
  # 85 tokens (the template's 45 and 40 of the observation) pad to 16..128, observations of
  # at most 50 to 16..64: 4 appends, and 1 decode loop; trees of 2 leaves x 256 tokens fill
  # packed rows of 128..512: 3 update steps; the estimator on the iteration's 2 trees, and
  # the threshold's update on their at most 2 x 8 decisions (padded to 16).
  assert len(startup) == 1, records
  startup = startup[0]
  assert (startup["startup_longest_prompt"], startup["startup_longest_observation"]) == (85, 50)
  # A paged cache: one more, forks' next logits placed on the batch of 8.
  assert startup["startup_programs"] == 4 + 1 + 3 + 1 + 1 + bool(kv_page_size), startup
  assert [r["compile_misses"] for r in records if r["phase"] == "train"] == [0, 0]
