"""Dry run on 8 fake CPU devices: per-device memory of the compiled train and decode steps
against hand-computed shard sizes, the fit check and its message, and bad shapes."""

import dataclasses

import jax
import pytest

from bpo_jax import sharding
from bpo_jax.models import ModelConfig
from bpo_jax.training import config as config_lib
from bpo_jax.training import dry_run as dry_run_lib
from bpo_jax.training import translate
from bpo_jax.training import update

# vocab 256, hidden 64, MLP 128, 2 layers, 4 query heads and 2 KV heads of 16, q/k/v biases.
CONFIG = ModelConfig.tiny()
MESH = sharding.MeshConfig(data=1, fsdp=4, tensor=2)
SHAPES = dict(batch_rows=8, row_length=32, decode_batch=8, cache_length=64)


@pytest.fixture(scope="module")
def report():
  assert jax.device_count() >= 8, "tests/conftest.py sets 8 CPU devices"
  return dry_run_lib.dry_run(CONFIG, MESH, update.UpdateConfig(num_micro_batches=2),
                             chip="v5e", devices=jax.devices()[:8], **SHAPES)


def test_memory_is_per_device_and_matches_the_shard_sizes(report):
  h, i, v, q, kv, layers = 64, 128, 256, 4 * 16, 2 * 16, 2
  matrices = v * h + layers * (2 * h * q + 2 * h * kv + 3 * h * i)  # tied embedding
  biases, norms = layers * (q + 2 * kv), (2 * layers + 1) * h
  # Training layout: every matrix has one "embed" dimension (fsdp, 4) and one heads / MLP /
  # vocabulary dimension (tensor, 2); biases are split over tensor; norms are replicated.
  params = matrices / 8 + biases / 2 + norms
  state = 4 * 3 * params + 4 + 4  # float32 parameters, Adam's mu and nu; two int32 counters
  batch = (8 // 4) * 32 * (8 * 4 + 1)  # rows over fsdp; eight 4-byte fields and a bool mask
  train = report.program("train step")
  assert train.argument_bytes == state + batch
  assert train.alias_bytes == state  # the donated state is updated in place
  assert state < train.output_bytes < state + 1024  # the new state and scalar metrics
  assert train.temp_bytes > 0 and train.resident_bytes == 0
  assert train.total_bytes == (train.argument_bytes + train.output_bytes + train.temp_bytes
                               - train.alias_bytes)
  # Sampling layout: parameters gathered over fsdp, still split over tensor. Per device: 2 of
  # the 8 rows, 1 of the 2 KV heads, all 64 slots for each of the layers' keys and values.
  sample_params = 4 * (matrices / 2 + biases / 2 + norms)
  cache = 2 * layers * 2 * 1 * 64 * 16 * 4
  next_logits, lengths, tokens, new_lengths = 2 * 256 * 4, 2 * 4, 2 * 4, 2 * 4
  decode = report.program("decode step")
  assert decode.argument_bytes == sample_params + cache + next_logits + lengths + tokens + \
      new_lengths
  assert decode.alias_bytes == cache + next_logits + lengths  # the donated decode state
  assert decode.alias_bytes <= decode.output_bytes < decode.alias_bytes + 1024
  assert decode.resident_bytes == state  # the training state stays on the device
  assert report.mesh_shape == {"data": 1, "fsdp": 4, "tensor": 2}
  assert report.fits and report.num_params == CONFIG.num_params()
  text = report.format()
  assert "train step" in text and "decode step" in text and "TPU v5e with 16.00 GiB" in text


def test_oversized_layout_is_rejected_with_the_figures(report):
  need = report.program("train step").total_bytes
  small = dry_run_lib.Chip("test chip", need - 1)
  with pytest.raises(dry_run_lib.DoesNotFitError) as error:
    dry_run_lib.dry_run(CONFIG, MESH, update.UpdateConfig(num_micro_batches=2), chip=small,
                        devices=jax.devices()[:8], **SHAPES)
  message = str(error.value)
  assert message.startswith(f"does not fit on test chip ({dry_run_lib.format_bytes(need - 1)} "
                            "per device) with mesh {'data': 1, 'fsdp': 4, 'tensor': 2}")
  assert f"the train step needs {dry_run_lib.format_bytes(need)} per device" in message
  assert "decode step needs" not in message  # the decode step fits and is not blamed
  assert "DOES NOT FIT" in message and not error.value.report.fits
  # Exactly at the limit it fits.
  assert dataclasses.replace(report, chip=dry_run_lib.Chip("test chip", need)).fits


def test_bad_shapes_and_chips_are_named():
  micro = update.UpdateConfig(num_micro_batches=4)
  with pytest.raises(ValueError, match=r"batch_rows = 8 must be a multiple of num_micro_batches "
                                       r"\(4\) x the batch-sharded mesh axes \(4\) = 16"):
    dry_run_lib.dry_run(CONFIG, MESH, micro, chip="v4", devices=jax.devices()[:8], **SHAPES)
  with pytest.raises(ValueError, match="decode_batch = 6 must be a multiple"):
    dry_run_lib.dry_run(CONFIG, MESH, update.UpdateConfig(), chip="v4",
                        devices=jax.devices()[:8], **{**SHAPES, "decode_batch": 6})
  with pytest.raises(ValueError, match="unknown chip 'v9'; known chips: h100, h200, v4"):
    dry_run_lib.get_chip("v9")
  with pytest.raises(ValueError, match="row_length must be a positive int, got 0"):
    dry_run_lib.dry_run(CONFIG, MESH, update.UpdateConfig(), chip="v4",
                        devices=jax.devices()[:8], **{**SHAPES, "row_length": 0})


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


def test_model_presets_exist():
  for name in config_lib.MODEL_PRESETS:
    assert isinstance(getattr(ModelConfig, name)(), ModelConfig)


def test_fake_devices_cannot_change_once_jax_started():
  jax.devices()  # this process started with the 8 devices of tests/conftest.py
  with pytest.raises(RuntimeError, match="JAX started with 8 cpu devices before the dry run "
                                         "could ask for 16 CPU devices; run it in a fresh process"):
    dry_run_lib.use_fake_cpu_devices(16)
  dry_run_lib.use_fake_cpu_devices(8)  # what it has is fine


def test_dry_run_from_a_config_matches_the_direct_call(report):
  config = config_lib.default_config()
  config.env.max_observation_tokens = 0  # no path-length bound, so short rows are allowed
  config.rollout.tasks_per_iteration, config.rollout.trees_per_task = 8, 1
  config.rollout.max_tree_tokens, config.model.max_length = 32, 64
  config.train.micro_batches, config.train.learning_rate = 2, 1e-4
  s = config.scale
  s.model_preset, s.chip, s.decode_batch = "tiny", "v5e", 8
  s.mesh.data, s.mesh.fsdp, s.mesh.tensor = 1, 4, 2
  assert dry_run_lib.shapes_from_config(config) == SHAPES
  assert translate.preset_model_config(config) == CONFIG
  from_config = dry_run_lib.dry_run_from_config(config, devices=jax.devices()[:8])
  for a, b in zip(from_config.programs, report.programs):
    assert dataclasses.replace(a, compile_seconds=0) == dataclasses.replace(b, compile_seconds=0)


@pytest.mark.parametrize("name,preset,devices,rows,tokens,decode", [
    ("pod_qwen2_5_7b_v5p64", "qwen2_5_7b", 32, 64, 16384, 256),
    ("pod_llama3_1_8b_v4_32", "llama3_1_8b", 16, 16, 4096, 64)])
def test_pod_configs_are_valid_and_say_what_the_dry_run_compiles(name, preset, devices, rows,
                                                                 tokens, decode):
  import importlib  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f"experiments.configs.{name}").get_config()
  config_lib.validate(config)
  s = config.scale
  assert s.num_devices == devices == s.mesh.data * s.mesh.fsdp * s.mesh.tensor * s.mesh.dcn_data
  shapes = dry_run_lib.shapes_from_config(config)
  assert (shapes["batch_rows"], shapes["row_length"], shapes["decode_batch"]) == \
      (rows, tokens, decode)
  # One row per FSDP group per micro-batch.
  assert rows == config.train.micro_batches * s.mesh.data * s.mesh.fsdp
  model = translate.preset_model_config(config)
  assert model == getattr(ModelConfig, preset)(param_dtype="bfloat16", remat="full",
                                               scan_layers=True)
  assert s.master_weights and s.chip in dry_run_lib.CHIPS
