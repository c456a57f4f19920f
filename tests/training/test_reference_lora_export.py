"""The KL term toward a frozen reference, LoRA over a frozen base, HF checkpoints and export.

* A step on the k3 term alone (advantages zero) moves the policy's logprobs toward the
  reference's, with and without adapters.
* `run.py` with `model.lora_rank > 0` and `train.kl_coef > 0`: the checkpoints hold only the
  adapters, their optimiser state and the reference adapters; the run logs `kl_ref`; a run
  stopped after iteration 1 and resumed ends with the uninterrupted run's arrays exactly.
* `--mode=export` writes an HF directory that transformers loads as it is, whose logits equal
  the library's (adapters unmerged) on the same tokens.
* A run from a tiny random Llama 3.2 checkpoint exported with the checkpoint's shape and logits
  (Qwen2's is test_workdir.py's run, through the command line); each malformed checkpoint is refused with one line
  naming what is wrong before anything is written (run.py prints it and exits with status 2:
  one case through the command line, the others through the loop it calls).
"""

import json
import os
import subprocess
import sys
import textwrap

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from bpo_jax import losses
from bpo_jax import packing
from bpo_jax.models import Decoder, ModelConfig, forward, lora
from bpo_jax.testing.model_rounding import forward_roundings, sum_roundings
from bpo_jax.testing.tolerance import assert_close
from bpo_jax.training import update
from bpo_jax.training.settings import from_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
VOCAB = 24


def _trees(rng, num_trees=2):
  trees = []
  for _ in range(num_trees):
    n = int(rng.integers(3, 6))
    parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
    la, lo = rng.integers(1, 4, n), rng.integers(0, 3, n)
    trees.append(packing.TreeTokens(
        prompt=rng.integers(0, VOCAB, 3), parent=parent,
        action_tokens=[rng.integers(0, VOCAB, k) for k in la],
        action_logprobs=[-rng.random(k) for k in la],
        observation_tokens=[rng.integers(0, VOCAB, k) for k in lo]))
  return trees


_KL_CONFIG = ModelConfig.tiny(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)


def _kl_only_step(lora_rank):
  """(policy logprobs before, after, reference logprobs, mask, k3 before, metric) of one SGD
  step on the KL term alone."""
  config = _KL_CONFIG.replace(lora_rank=lora_rank)
  graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))
  if lora_rank:
    trainable, frozen = lora.split_lora(params)
    # The reference: the same base with other adapters (B != 0, so its function differs).
    ref = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(jax.random.key(1), x.shape),
                       trainable)
  else:
    trainable, frozen = params, None
    ref = nnx.split(Decoder(config, rngs=nnx.Rngs(1)))[1]
  trees = _trees(np.random.default_rng(0))
  zeros = [np.zeros(t.num_nodes) for t in trees]
  ones = [np.ones(t.num_nodes) for t in trees]
  batch = jax.tree.map(jnp.asarray, packing.pack_trees(trees, zeros, ones, buckets=(64,)))
  tx = optax.sgd(0.02)
  state = update.TrainState(step=jnp.zeros((), jnp.int32), params=trainable,
                            opt_state=tx.init(trainable))
  step = update.make_train_step(graphdef, tx, update.UpdateConfig(micro_batches=1, kl_coef=1.0),
                                ref_params=ref)
  join = lambda p: p if frozen is None else nnx.merge_state(p, frozen)
  before = update.packed_logprobs(graphdef, join(trainable), batch)[0]
  reference = update.packed_logprobs(graphdef, join(ref), batch)[0]
  k3 = losses.k3_kl(before, reference, batch.loss_mask)
  new_state, metrics = step(state, batch, ref, None, frozen)
  after = update.packed_logprobs(graphdef, join(new_state.params), batch)[0]
  return before, after, reference, batch.loss_mask, k3, metrics


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [0, 2])
def test_a_step_on_the_kl_term_alone_moves_logprobs_toward_the_reference(lora_rank):
  before, after, reference, mask, k3, metrics = _kl_only_step(lora_rank)
  mask = np.asarray(mask, bool)
  gap_before = np.abs(np.asarray(before - reference))[mask]
  gap_after = np.abs(np.asarray(after - reference))[mask]
  assert gap_before.mean() > 0.05  # the two policies differ to start with
  assert gap_after.mean() < 0.9 * gap_before.mean()
  # The logged reference KL is the per-token mean k3 at the step's start (k3_kl is per token).
  k3 = np.asarray(k3, np.float64)[mask]
  # The step recomputes both logprobs in its own program (a forward's roundings at their
  # magnitude, which k3 = exp(r − x) − (r − x) − 1 passes on scaled by |1 − exp(r − x)| in
  # each of x and r), then sums the tokens' k3 in another order.
  before, reference = (np.asarray(x, np.float64)[mask] for x in (before, reference))
  slope = np.abs(1.0 - np.exp(reference - before))
  scale = 2 * np.abs(np.concatenate([before, reference])).max()
  steps = forward_roundings(_KL_CONFIG, 64, logprobs=True) + sum_roundings(k3.size) + 4
  assert_close(metrics["ref_kl"], k3.mean(), steps=steps,
               magnitude=k3.mean() + scale * slope.mean())
  # With advantages zero and weights one, the loss is the KL term summed over the tokens and
  # divided by the 2 trees (per-tree normalisation, kl_coef 1).
  assert_close(metrics["loss"], k3.sum() / 2, steps=steps,
               magnitude=(k3.sum() + scale * slope.sum()) / 2)


# ----------------------------------------------------------------------------- through run.py


def _config_file(tmp_path, body=""):
  path = tmp_path / "config.py"
  path.write_text(textwrap.dedent("""
      from experiments.configs import base

      def get_config():
        config = base.tiny(base.rooms("bpo"), iterations=2)
        config.checkpoint.every = 1
        config.checkpoint.keep = 3
        config.log.progress_bar = False
        config.log.tensorboard = False
      """) + textwrap.indent(textwrap.dedent(body), "  ") + "  return config\n")
  return str(path)


def _run(config_path, workdir, *extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, RUN, f"--config={config_path}", f"--workdir={workdir}",
                         *extra], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def _raw_checkpoint(workdir, step):
  """The arrays of checkpoint `step`, as saved (numpy leaves keyed by their paths)."""
  manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
  try:
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  finally:
    manager.close()
  return {jax.tree_util.keystr(p): np.asarray(v)
          for p, v in jax.tree_util.tree_leaves_with_path(restored.state)}


LORA_KL = """
    config.model.lora_rank = 2
    config.model.lora_alpha = 4.0
    config.train.kl_coef = 0.05
"""


@pytest.fixture(scope="module")
def lora_kl_run(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("lora_kl")
  config_path = _config_file(tmp_path, LORA_KL)
  workdir = str(tmp_path / "run")
  result = _run(config_path, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  return config_path, workdir, tmp_path


@pytest.mark.slow
def test_lora_checkpoints_hold_only_adapters_and_only_adapters_change(lora_kl_run):
  _, workdir, _ = lora_kl_run
  start, end = _raw_checkpoint(workdir, 0), _raw_checkpoint(workdir, 2)
  arrays = {k: v for k, v in end.items() if v.ndim > 0}
  # Parameters, Adam moments and the reference: every array is an adapter's A or B.
  assert arrays and all("_lora_" in k for k in arrays), sorted(arrays)[:5]
  assert any("['ref']" in k for k in arrays) and any("opt_state" in k for k in arrays)
  params = [k for k in arrays if k.startswith("['train']['params']")]
  assert len(params) == 2 * 7 * 1  # A and B of q, k, v, o, gate, up, down in the one layer
  changed = [k for k in params if not np.array_equal(start[k], end[k])]
  assert changed  # the iterations moved adapters
  # The reference stays the parameters the iterations started from.
  for k in params:
    ref_key = k.replace("['train']['params']", "['ref']")
    np.testing.assert_array_equal(end[ref_key], start[k])
  records = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  kl = [r["kl_ref"] for r in records if r.get("phase") == "train"]
  assert len(kl) == 2 and all(np.isfinite(kl)) and min(kl) >= 0


@pytest.mark.slow
def test_lora_kl_run_resumes_exactly(lora_kl_run):
  config_path, workdir, tmp_path = lora_kl_run
  resumed = str(tmp_path / "resumed")
  first = _run(config_path, resumed, "--stop_after=1")
  assert first.returncode == 0, first.stderr[-3000:]
  second = _run(config_path, resumed)
  assert second.returncode == 0, second.stderr[-3000:]
  a, b = _raw_checkpoint(workdir, 2), _raw_checkpoint(resumed, 2)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _load_config(config_path):
  """The configuration a config file written by `_config_file` gives (as run.py loads it)."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("cfg", config_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _export_roundings(model_config, length: int) -> int:
  """Roundings between the library's forward (adapters beside the base) and transformers' on the
  export (adapters merged into the base): a forward's, and per layer each of its seven
  projections' merged kernel W + s·A·B (a sum of rank terms, a product, an addition)."""
  merge = 7 * (sum_roundings(max(model_config.lora_rank, 1)) + 2) if model_config.lora_rank else 0
  return forward_roundings(model_config, length) + model_config.num_layers * merge


def _library_and_hf_logits(config, workdir, export_dir, tokens):
  """The library's logits from `workdir`'s latest checkpoint (`config`, a configuration or the
  file of one) and transformers' from `export_dir`, on `tokens`."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  if isinstance(config, str):
    config = _load_config(config)
  exp, state, _ = loop.load_checkpoint(from_config(config), workdir)
  exp.close()
  ours, _ = forward(exp.graphdef, exp.full_params(state.params), jnp.asarray(tokens))
  model = transformers.AutoModelForCausalLM.from_pretrained(export_dir).eval()
  with torch.no_grad():
    theirs = model(torch.as_tensor(tokens)).logits.float().numpy()
  tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
  return np.asarray(ours), theirs, tokenizer, exp


@pytest.mark.slow
def test_export_loads_in_transformers_with_the_library_logits(lora_kl_run):
  config_path, workdir, tmp_path = lora_kl_run
  export_dir = str(tmp_path / "export")
  result = _run(config_path, workdir, "--mode=export", f"--export_dir={export_dir}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert {"config.json", "model.safetensors", "generation_config.json",
          "tokenizer.json"} <= set(os.listdir(export_dir))
  tokens = np.random.default_rng(0).integers(0, 30, (2, 12))
  ours, theirs, tokenizer, exp = _library_and_hf_logits(config_path, workdir, export_dir,
                                                        tokens)
  assert theirs.shape == ours.shape
  assert_close(theirs, ours, steps=_export_roundings(exp.model_config, tokens.shape[1]))
  assert len(tokenizer) == len(exp.tokenizer)
  # Exporting again into a directory that holds something is refused (exit 2), untouched.
  again = _run(config_path, workdir, "--mode=export", f"--export_dir={export_dir}")
  assert again.returncode == 2 and "not an empty directory" in again.stderr


# ----------------------------------------------------------------------------- HF checkpoints


def _hf_checkpoint(path, variant="qwen2", family="qwen2", template="qwen2_5.jinja", **overrides):
  from bpo_jax.testing import chat_tokenizers  # pylint: disable=g-import-not-at-top
  from bpo_jax.testing import hf_checkpoints  # pylint: disable=g-import-not-at-top
  with open(os.path.join(TEMPLATES, template), encoding="utf-8") as f:
    template_text = f.read()
  tok = chat_tokenizers.family_tokenizer(family, ["go north and open the door"] * 4,
                                         template_text, vocab_size=300)
  hf_checkpoints.make_hf_checkpoint(variant, str(path), vocab_size=max(len(tok), 320),
                                    max_position_embeddings=1024, **overrides)
  chat_tokenizers.save_family_tokenizer(tok, family, str(path))
  return str(path)


def check_export(config, workdir, checkpoint, export_dir):
  """An export of a run from an HF checkpoint: the checkpoint's shape and eos ids (the config's
  tiny model has another hidden size and one layer), and transformers' logits on it the
  library's (`_library_and_hf_logits`) within their roundings."""
  with open(os.path.join(export_dir, "config.json"), encoding="utf-8") as f:
    exported = json.load(f)
  with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as f:
    source = json.load(f)
  for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size",
              "tie_word_embeddings"):
    assert exported[key] == source[key], key
  assert exported["num_hidden_layers"] == 2
  with open(os.path.join(export_dir, "generation_config.json"), encoding="utf-8") as f:
    generation = json.load(f)
  with open(os.path.join(checkpoint, "generation_config.json"), encoding="utf-8") as f:
    assert generation["eos_token_id"] == json.load(f)["eos_token_id"]
  tokens = np.random.default_rng(1).integers(0, source["vocab_size"], (2, 10))
  ours, theirs, _, exp = _library_and_hf_logits(config, workdir, export_dir, tokens)
  assert_close(theirs, ours, steps=_export_roundings(exp.model_config, tokens.shape[1]))


@pytest.mark.slow
def test_run_from_a_tiny_llama3_checkpoint_trains_and_exports(tmp_path):
  """Llama 3.2 (tied, Llama 3 RoPE scaling) through the loop's own export; Qwen2 through the
  command line's, after a resume (test_workdir.py's run from an HF checkpoint)."""
  checkpoint = _hf_checkpoint(tmp_path / "hf", "llama3.2", "llama3", "llama3_1.jinja")
  config_path = _config_file(tmp_path, f"""
      config.model.checkpoint = {checkpoint!r}
      config.model.max_length = 640  # the family's chat template takes more tokens per path
      config.warm_start.num_trajectories = 0
  """)
  workdir = str(tmp_path / "run")
  result = _run(config_path, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  config = _load_config(config_path)
  config.scale.num_devices = 1
  check_export(config, workdir, checkpoint, loop.export(config, workdir, str(tmp_path / "export")))


def _refusal(config_path, workdir) -> str:
  """What `loop.train` refuses the config file with, as run.py reports it with exit status 2:
  one problem of a `ConfigError`, or another input error's one line; nothing was written."""
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from bpo_jax.training import loop  # pylint: disable=g-import-not-at-top
  from experiments import run as run_py  # pylint: disable=g-import-not-at-top
  config = _load_config(config_path)
  config.scale.num_devices = 1  # as a run.py subprocess of the tests sees one CPU device
  config_lib.validate(config, "train", str(workdir))
  with pytest.raises(run_py._input_errors()) as error:  # pylint: disable=protected-access
    loop.train(config, str(workdir))
  if isinstance(error.value, config_lib.ConfigError):
    assert len(error.value.problems) == 1, error.value.problems
    message = error.value.problems[0]
  else:
    message = run_py._first_line(error.value)  # pylint: disable=protected-access
  assert message and "\n" not in message, message
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))
  return message


def test_model_preset_is_a_shape_check_against_the_checkpoint(tmp_path):
  checkpoint = _hf_checkpoint(tmp_path / "hf")
  config_path = _config_file(tmp_path, f"""
      config.model.checkpoint = {checkpoint!r}
      config.model.max_length = 640
      config.scale.model_preset = "qwen2_5_0_5b"
  """)
  message = _refusal(config_path, tmp_path / "run")
  assert "scale.model_preset = 'qwen2_5_0_5b'" in message
  assert "hidden_size 32 (preset 896)" in message


def _break_missing_config(path):
  os.remove(os.path.join(path, "config.json"))


def _break_missing_shard(path):
  os.remove(os.path.join(path, sorted(f for f in os.listdir(path)
                                      if f.endswith(".safetensors"))[0]))


def _break_shape(path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  file = os.path.join(path, "model.safetensors")
  tensors = load_file(file)
  name = "model.layers.0.self_attn.q_proj.weight"
  tensors[name] = np.zeros((tensors[name].shape[0] + 1, tensors[name].shape[1]), np.float32)
  save_file(tensors, file, metadata={"format": "pt"})


def _break_model_type(path):
  file = os.path.join(path, "config.json")
  with open(file, encoding="utf-8") as f:
    config = json.load(f)
  config["model_type"] = "gpt2"
  with open(file, "w", encoding="utf-8") as f:
    json.dump(config, f)


def _break_chat_template(path):
  template_file = os.path.join(path, "chat_template.jinja")
  if os.path.exists(template_file):
    os.remove(template_file)
  file = os.path.join(path, "tokenizer_config.json")
  with open(file, encoding="utf-8") as f:
    config = json.load(f)
  config.pop("chat_template", None)
  with open(file, "w", encoding="utf-8") as f:
    json.dump(config, f)


@pytest.mark.parametrize("name,damage,extra,expected", [
    ("no chat template", _break_chat_template, {}, "chat template"),
    ("no config.json", _break_missing_config, {}, "config.json"),
    ("missing shard", _break_missing_shard, {"max_shard_size": "20KB"}, "shard"),
    ("wrong shape", _break_shape, {}, "q_proj"),
    ("unsupported model_type", _break_model_type, {}, "gpt2"),
    ("LoRA rank too large", None, {}, "lora_rank"),
])
@pytest.mark.slow
def test_malformed_checkpoints_are_refused_with_one_line(tmp_path, name, damage, extra,
                                                         expected):
  checkpoint = _hf_checkpoint(tmp_path / "hf", **extra)
  if damage is not None:
    damage(checkpoint)
  body = f"config.model.checkpoint = {checkpoint!r}\nconfig.model.max_length = 640\n"
  if damage is None:
    body += "config.model.lora_rank = 64\n"
  config_path = _config_file(tmp_path, body)
  workdir = tmp_path / "run"
  if name != "no config.json":
    assert expected in _refusal(config_path, workdir), name
    return
  # Through the command line: one error line, exit status 2, no traceback, nothing written.
  result = _run(config_path, str(workdir))
  assert result.returncode == 2, (name, result.stderr[-2000:])
  errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and expected in errors[0], (name, result.stderr[-2000:])
  assert "Traceback" not in result.stderr
  assert not (workdir / "checkpoints").exists()


@pytest.mark.parametrize("overrides,expected", [
    ({"lora_rank": -1}, "model.lora_rank = -1: must be >= 0"),
    ({"lora_rank": 2, "lora_alpha": 0.0}, "model.lora_alpha = 0.0: must be > 0"),
    ({"checkpoint": "no/such/dir"}, "model.checkpoint = 'no/such/dir': no such directory"),
])
def test_model_section_checks(overrides, expected):
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.default_config()
  for key, value in overrides.items():
    config.model[key] = value
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate(config)
  assert any(p.startswith(expected) for p in error.value.problems), error.value.problems


def test_lora_with_several_processes_is_refused():
  from bpo_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.default_config()
  config.model.lora_rank = 2
  config.scale.distributed.num_processes = 2
  config.scale.distributed.coordinator_address = "localhost:1"
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate(config)
  assert any(p.startswith("model.lora_rank = 2: LoRA runs in one process")
             for p in error.value.problems), error.value.problems
