"""Dry run on 8 fake CPU devices: it compiles the loop's own train step, sampler and reshard
(the same lowered programs the loop's builders give), their per-device memory against
hand-computed shard sizes, the fit check and its message, and the pod configs' shapes and
checkpoints."""

import dataclasses
import json
import types

import jax
import pytest

from bpo_jax import rollout as rollout_lib
from bpo_jax import sharding
from bpo_jax.models import ModelConfig
from bpo_jax.training import config as config_lib
from bpo_jax.training import dry_run as dry_run_lib
from bpo_jax.training import experiment as experiment_lib
from bpo_jax.training import loop
from bpo_jax.training import translate
from bpo_jax.training import update as update_lib
from bpo_jax.training.settings import from_config

# vocab 256, hidden 64, MLP 128, 2 layers, 4 query heads and 2 KV heads of 16, q/k/v biases.
CONFIG = ModelConfig.tiny()


def tiny_config():
  """The tiny preset on a mesh fsdp 4 x tensor 2: 8 trees of rows bucketed to 128 tokens, 8
  decode rows of 64 cache slots, actions of 5 tokens, a sampling temperature of 0.7."""
  config = config_lib.default_config()
  config.env.max_observation_tokens = 0  # no path-length bound, so short rows are allowed
  config.rollout.tasks_per_iteration, config.rollout.trees_per_task = 8, 1
  config.rollout.max_tree_tokens, config.model.max_length = 32, 64
  config.rollout.temperature = 0.7
  config.train.micro_batches, config.train.learning_rate = 2, 1e-4
  s = config.scale
  s.model_preset, s.chip, s.decode_batch, s.num_devices = "tiny", "v5e", 8, 8
  s.mesh.data, s.mesh.fsdp, s.mesh.tensor = 1, 4, 2
  return config


@pytest.fixture(scope="module")
def report():
  assert jax.device_count() >= 8, "tests/conftest.py sets 8 CPU devices"
  return dry_run_lib.dry_run_from_config(tiny_config())


@pytest.mark.slow
def test_memory_is_per_device_and_matches_the_shard_sizes(report):
  h, i, v, q, kv, layers = 64, 128, 256, 4 * 16, 2 * 16, 2
  matrices = v * h + layers * (2 * h * q + 2 * h * kv + 3 * h * i)  # tied embedding
  biases, norms = layers * (q + 2 * kv), (2 * layers + 1) * h
  # Training layout: every matrix has one "embed" dimension (fsdp, 4) and one heads / MLP /
  # vocabulary dimension (tensor, 2); biases are split over tensor; norms are replicated.
  params = 4 * (matrices / 8 + biases / 2 + norms)
  state = 3 * params + 4 + 4  # float32 parameters, Adam's mu and nu; two int32 counters
  batch = (8 // 4) * 128 * (8 * 4 + 1)  # rows over fsdp; eight 4-byte fields and a bool mask
  train = report.program("train step")
  assert train.argument_bytes == state + batch
  assert train.alias_bytes == state  # the donated state is updated in place
  assert state < train.output_bytes < state + 1024  # the new state and scalar metrics
  assert train.temp_bytes > 0 and train.resident_bytes == 0
  assert train.total_bytes == (train.argument_bytes + train.output_bytes + train.temp_bytes
                               + train.code_bytes - train.alias_bytes)
  # Sampling layout: parameters gathered over fsdp, still split over tensor. Per device: 2 of
  # the 8 rows, 1 of the 2 KV heads, all 64 slots for each of the layers' keys and values.
  sample_params = 4 * (matrices / 2 + biases / 2 + norms)
  cache = 2 * layers * 2 * 1 * 64 * 16 * 4
  next_logits, lengths, keys, active = 2 * 256 * 4, 2 * 4, 2 * 2 * 4, 2
  settings = 4 + 4 + 4 + 1  # temperature, top-p, top-k and greedy: data, not compiled in
  sample = report.program("sample")
  assert sample.argument_bytes == (sample_params + cache + next_logits + lengths + keys + active
                                   + settings)
  # `generate` does not donate the decode state: the new cache is a second buffer, with the
  # [2 rows, 5 tokens] outputs (tokens, logprobs, entropies, mask) and per-row counters.
  assert cache < sample.output_bytes - 2 * 5 * (4 + 4 + 4 + 1) < cache + next_logits + 1024
  assert sample.alias_bytes == 0
  assert sample.resident_bytes == state  # the training state stays on the device
  # The move from one layout to the other: training-layout parameters in, sampling-layout out.
  move = report.program("reshard")
  assert move.argument_bytes == params
  assert sample_params <= move.output_bytes < sample_params + 1024
  assert move.resident_bytes == state - params  # the optimizer state stays where it is
  assert report.mesh_shape == {"data": 1, "fsdp": 4, "tensor": 2}
  assert report.shapes == dict(batch_rows=8, row_length=128, micro_batches=2, decode_batch=8,
                               cache_length=64)
  assert report.fits and report.num_params == CONFIG.num_params()
  text = report.format()
  for name in ("train step", "sample", "reshard", "TPU v5e with 16.00 GiB"):
    assert name in text


@pytest.mark.slow
def test_dry_run_compiles_the_programs_the_loop_builds(monkeypatch):
  """The loop's update (`loop.build_update`) and the rollout engine's sampler, built as
  `loop.train` builds them, lower to the dry run's very programs; the update is built from
  the run's UpdateConfig (its sampling temperature included)."""
  config = tiny_config()
  built = []
  make_train_step = update_lib.make_train_step
  monkeypatch.setattr(update_lib, "make_train_step",
                      lambda *a, **k: built.append(a[2]) or make_train_step(*a, **k))
  programs = dry_run_lib.lower_programs(from_config(config))
  assert built == [translate.update_config(from_config(config))] and built[0].temperature == 0.7
  graphdef, params = dry_run_lib.abstract_model(from_config(config))
  setup = loop.build_update(types.SimpleNamespace(settings=from_config(config),
                                                  graphdef=graphdef), params)
  state = setup.placement.abstract(setup.local_state)
  batch = dry_run_lib.abstract_batch(8, 128, setup.placement.row_sharding)
  train = setup.train_step.jitted.lower(state, batch, None, None, None)
  assert train.as_text() == programs.lowered["train step"].as_text()
  # The engine of `loop.train`, its chat format's stop ids the dry run's stand-in.
  fmt = types.SimpleNamespace(stop_token_ids=dry_run_lib.StopTokens.stop_token_ids)
  engine = rollout_lib.RolloutEngine(graphdef, CONFIG, fmt, None,
                                     translate.rollout_config(from_config(config)))
  sample_sh = sharding.param_shardings(params, setup.placement.mesh, sharding.SAMPLING_RULES)
  decode_state = jax.eval_shape(lambda: engine.sampler.init_state(8))
  decode_sh = sharding.cache_shardings(decode_state, setup.placement.mesh)
  rows = decode_sh.cache.lengths
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), 8))
  sample = engine.sampler.lower_generate(
      sharding.with_shardings(params, sample_sh),
      sharding.with_shardings(decode_state, decode_sh),
      jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=rows), engine.sampling_params,
      jax.ShapeDtypeStruct((8,), bool, sharding=rows))
  assert sample.as_text() == programs.lowered["sample"].as_text()
  moved = sharding.make_reshard(sample_sh).lower(state.params)
  assert moved.as_text() == programs.lowered["reshard"].as_text()


def test_oversized_layout_is_rejected_with_the_figures(report, monkeypatch):
  need = report.program("train step").total_bytes
  small = dry_run_lib.Chip("test chip", need - 1)
  monkeypatch.setattr(dry_run_lib, "get_chip", lambda name: small)
  with pytest.raises(dry_run_lib.DoesNotFitError) as error:
    dry_run_lib.dry_run_from_config(tiny_config())
  message = str(error.value)
  assert message.startswith(f"does not fit on test chip ({dry_run_lib.format_bytes(need - 1)} "
                            "per device) with mesh {'data': 1, 'fsdp': 4, 'tensor': 2}")
  assert f"the train step needs {dry_run_lib.format_bytes(need)} per device" in message
  assert "sample needs" not in message  # the sampler fits and is not blamed
  assert "DOES NOT FIT" in message and not error.value.report.fits
  # Exactly at the limit it fits.
  assert dataclasses.replace(report, chip=dry_run_lib.Chip("test chip", need)).fits


def test_format_bytes():
  assert dry_run_lib.format_bytes(3 << 20) == "3.00 MiB"
  assert dry_run_lib.format_bytes(95 << 30) == "95.00 GiB"
  assert dry_run_lib.format_bytes(1536) == "1.50 KiB"
  assert dry_run_lib.format_bytes(12) == "12 B"


def test_scale_section_is_validated():
  config = config_lib.default_config()
  config_lib.validate(config)
  s = config.scale
  s.mesh.fsdp, s.mesh.tensor = -1, -1
  s.num_devices = -2
  s.param_dtype = "float8"
  s.remat = "some"
  s.chip = "v9"
  s.model_preset = "gpt"
  s.distributed.num_processes = 2
  s.distributed.process_id = 2
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate(config)
  problems = error.value.problems
  for expected in ("scale.mesh: at most one axis may be -1",
                   "scale.num_devices = -2: must be >= 0",
                   "scale.param_dtype = 'float8': must be one of 'float32', 'bfloat16'",
                   "scale.remat = 'some': must be one of 'none', 'full', 'dots'",
                   "scale.chip = 'v9': must be '' or one of h100, h200, v4, v5e, v5p, v6e",
                   "scale.model_preset = 'gpt': must be '' or one of tiny,",
                   "scale.distributed.process_id = 2: must be in [0, 1]",
                   "scale.distributed.coordinator_address = '': must be 'host:port'"):
    assert any(p.startswith(expected) for p in problems), (expected, problems)
  config = config_lib.default_config()
  config.scale.mesh.fsdp, config.scale.mesh.tensor, config.scale.num_devices = 4, 2, 16
  with pytest.raises(config_lib.ConfigError, match="data x fsdp x tensor x dcn_data = 8, but "
                                                   "scale.num_devices = 16"):
    config_lib.validate(config)
  with pytest.raises(ValueError, match="unknown chip 'v9'; known chips: h100, h200, v4"):
    dry_run_lib.get_chip("v9")


def test_model_presets_exist():
  for name in config_lib.MODEL_PRESETS:
    assert isinstance(getattr(ModelConfig, name)(), ModelConfig)


def test_fake_devices_cannot_change_once_jax_started():
  jax.devices()  # this process started with the 8 devices of tests/conftest.py
  with pytest.raises(RuntimeError, match="JAX started with 8 cpu devices before the dry run "
                                         "could ask for 16 CPU devices; run it in a fresh process"):
    dry_run_lib.use_fake_cpu_devices(16)
  dry_run_lib.use_fake_cpu_devices(8)  # what it has is fine


def _pod_config(name: str):
  import importlib  # pylint: disable=g-import-not-at-top
  return importlib.import_module(f"experiments.configs.{name}").get_config()


@pytest.mark.parametrize("name,preset,devices,rows,tokens,decode", [
    ("pod_qwen2_5_7b_v5p64", "qwen2_5_7b", 32, 64, 16384, 256),
    ("pod_llama3_1_8b_v4_32", "llama3_1_8b", 16, 16, 4096, 64)])
def test_pod_configs_are_valid_and_say_what_the_dry_run_compiles(name, preset, devices, rows,
                                                                 tokens, decode):
  config = _pod_config(name)
  config_lib.validate(config)
  s = config.scale
  assert s.num_devices == devices == s.mesh.data * s.mesh.fsdp * s.mesh.tensor * s.mesh.dcn_data
  shapes = dry_run_lib.shapes_from_config(from_config(config))
  assert (shapes["batch_rows"], shapes["row_length"], shapes["decode_batch"]) == \
      (rows, tokens, decode)
  # One row per FSDP group per micro-batch.
  assert rows == config.train.micro_batches * s.mesh.data * s.mesh.fsdp
  model = translate.preset_model_config(from_config(config))
  assert model == getattr(ModelConfig, preset)(param_dtype="bfloat16", remat="full",
                                               scan_layers=True)
  assert dry_run_lib.model_config_for(from_config(config)) == model
  assert s.master_weights and s.chip in dry_run_lib.CHIPS


@pytest.mark.parametrize("name,preset", [("pod_qwen2_5_7b_v5p64", "qwen2_5_7b"),
                                         ("pod_llama3_1_8b_v4_32", "llama3_1_8b")])
def test_pod_configs_take_a_checkpoint_whose_shape_the_preset_checks(name, preset, tmp_path):
  """With `model.checkpoint` the model is the one its config.json describes, loaded with the
  config's remat and scanned layers (only config.json is read: no 7B weights are made); a
  checkpoint of another shape is refused naming the preset and the fields that differ."""
  hf = getattr(ModelConfig, preset)().to_hf_config()
  (tmp_path / "config.json").write_text(json.dumps(hf))
  config = _pod_config(name)
  config.model.checkpoint = str(tmp_path)
  # A pod's sizes, checked as the dry run checks them (not against this host's memory).
  config_lib.validate(config, "train", str(tmp_path / "workdir"), host_memory=False)
  settings = from_config(config)
  assert dry_run_lib.model_config_for(settings) == translate.preset_model_config(settings)
  (tmp_path / "config.json").write_text(json.dumps(CONFIG.to_hf_config()))
  with pytest.raises(config_lib.ConfigError, match=rf"scale.model_preset = '{preset}': the "
                                                   r"checkpoint .* has another shape: .*"
                                                   r"hidden_size 64 \(preset \d+\)"):
    dry_run_lib.model_config_for(from_config(config))


@pytest.mark.slow
def test_the_command_line_names_what_the_dry_run_cannot_use(tmp_path):
  """experiments/run.py --dry_run: a config without a target chip, and a pod config whose
  checkpoint has another shape, each fail in one line with exit status 2 before compiling."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  (tmp_path / "config.json").write_text(json.dumps(CONFIG.to_hf_config()))
  for args, expected in (
      (["--config=experiments/configs/quickstart.py", "--config.scale.num_devices=1"],
       "error: invalid configuration: scale.chip: the dry run needs a target chip, one of "
       "h100, h200"),
      (["--config=experiments/configs/pod_qwen2_5_7b_v5p64.py",
        f"--config.model.checkpoint={tmp_path}"],
       "error: invalid configuration: scale.model_preset = 'qwen2_5_7b': the checkpoint")):
    result = subprocess.run([sys.executable, "experiments/run.py", "--dry_run", *args],
                            cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert expected in result.stderr, result.stderr


def test_a_checkpoint_run_takes_the_scale_sections_remat_and_scan(tmp_path):
  """The training run loads `model.checkpoint` with `scale.remat` and `scale.scan_layers`, as
  the dry run compiles it."""
  from bpo_jax import models  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  models.save_hf_checkpoint(models.Decoder(CONFIG, rngs=nnx.Rngs(0)), str(tmp_path))
  config = config_lib.default_config()
  config.model.checkpoint = str(tmp_path)
  config.scale.remat, config.scale.scan_layers = "full", True
  model = experiment_lib.initial_model(config, CONFIG.vocab_size)
  assert (model.config.remat, model.config.scan_layers) == ("full", True)
  assert dry_run_lib.model_config_for(from_config(config)) == model.config
