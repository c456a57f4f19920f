"""HF checkpoints (config.json + safetensors + generation_config.json) <-> the NNX decoder.

Loading builds the model shape-first (`nnx.eval_shape`, no memory for weights), then reads and
places one tensor at a time (memory-mapped, so a shard is never read whole), so a per-parameter
sharding can be targeted without ever holding the whole checkpoint on the host. Both a single
`model.safetensors` and a sharded checkpoint (`model.safetensors.index.json` + shards) are
read, in any float dtype (bfloat16 included); saving writes the same layout back, with the
adapters of a LoRA model merged into its kernels. The checkpoint's config.json decides the
model's shape. Anything malformed (a missing file or field, a file that is not safetensors, a
tensor of the wrong shape or with NaN or Inf values, an unsupported model) raises a
`CheckpointError` (a `ValueError`) with one line naming it.

Name mapping (HF PyTorch `nn.Linear` weights are [out, in]; ours are [in, ...]):

  model.embed_tokens.weight                   [V, h]      embed                 [V, h]
  model.layers.i.input_layernorm.weight       [h]         layers.i.input_norm.weight
  model.layers.i.self_attn.q_proj.weight      [H·D, h]    layers.i.attn.q_kernel [h, H, D]
  model.layers.i.self_attn.q_proj.bias        [H·D]       layers.i.attn.q_bias   [H, D]
  (k_proj, v_proj likewise with Hkv heads)
  model.layers.i.self_attn.q_norm.weight      [D]         layers.i.attn.q_norm.weight (Qwen3;
  model.layers.i.self_attn.k_norm.weight      [D]         layers.i.attn.k_norm.weight  likewise)
  model.layers.i.self_attn.o_proj.weight      [h, H·D]    layers.i.attn.o_kernel [H, D, h]
  model.layers.i.post_attention_layernorm.weight          layers.i.post_attn_norm.weight
  model.layers.i.mlp.{gate,up}_proj.weight    [I, h]      layers.i.mlp.{gate,up}_kernel [h, I]
  model.layers.i.mlp.down_proj.weight         [h, I]      layers.i.mlp.down_kernel [I, h]
  model.norm.weight                           [h]         final_norm.weight
  lm_head.weight (untied only)                [V, h]      lm_head               [h, V]

Adapters (`*_lora_a`, `*_lora_b`) have no HF name: a loaded LoRA model starts from fresh
adapters (B = 0, so it computes the checkpoint's function) and is merged when saved.
"""

import json
import math
import os
import shutil
import struct
import tempfile
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from bpo_jax.models import lora
from bpo_jax.models.config import ModelConfig
from bpo_jax.models.decoder import Decoder

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# The safetensors format's largest header (its reference reader refuses longer ones).
MAX_HEADER_BYTES = 100_000_000
# safetensors dtype names -> numpy dtypes (bfloat16 from ml_dtypes).
_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                       "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32,
                       "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be loaded into (or does not match) the model."""


class SafetensorsFile:
  """A safetensors file read lazily: its header at once, each tensor from a memory map.

  The format is an 8-byte little-endian header size, a JSON header mapping each tensor name to
  its dtype, shape and byte range, then the bytes. Reading it here (rather than with
  `safetensors.safe_open(framework="numpy")`) also reads bfloat16, which numpy lacks. The header
  size is checked against the file's size and `MAX_HEADER_BYTES` before it is read (a file of
  other bytes gives a size of up to 2^64).
  """

  def __init__(self, path: str):
    self.path = path
    try:
      with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        limit = min(os.fstat(f.fileno()).st_size - 8, MAX_HEADER_BYTES)
        header = json.loads(f.read(size)) if size <= limit else None
    except (OSError, struct.error, ValueError, RecursionError) as e:
      raise CheckpointError(f"cannot read the safetensors header of {path!r}: {e}") from None
    if size > limit:
      raise CheckpointError(f"{path!r} is not a safetensors file: its header length {size} "
                            f"exceeds the {limit} bytes the file and format allow")
    if not isinstance(header, dict) or not all(isinstance(v, dict) for v in header.values()):
      raise CheckpointError(f"{path!r} is not a safetensors file: its header is not a JSON "
                            "object of tensor entries")
    header.pop("__metadata__", None)
    self._header, self._offset = header, 8 + size
    self._data = None

  def keys(self) -> list[str]:
    return list(self._header)

  def shape(self, name: str) -> tuple[int, ...]:
    try:
      return tuple(int(x) for x in self._header[name]["shape"])
    except (KeyError, TypeError, ValueError):
      raise CheckpointError(f"tensor {name!r} in {self.path!r} has a malformed header entry "
                            f"{self._header[name]!r}") from None

  def get(self, name: str) -> np.ndarray:
    """The tensor `name` as a read-only array over the file's memory map."""
    info = self._header[name]
    try:
      dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
      begin, end = (int(x) for x in info["data_offsets"])
      shape = tuple(int(x) for x in info["shape"])
    except (KeyError, TypeError, ValueError):
      raise CheckpointError(f"tensor {name!r} in {self.path!r} has a malformed header entry "
                            f"{info!r}") from None
    if dtype is None:
      raise CheckpointError(f"tensor {name!r} in {self.path!r} has unsupported dtype "
                            f"{info['dtype']!r}")
    if end - begin != math.prod(shape) * np.dtype(dtype).itemsize:
      raise CheckpointError(f"tensor {name!r} in {self.path!r}: byte range {begin}..{end} does "
                            f"not hold a {info['dtype']} array of shape {shape}")
    if self._data is None:
      self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
    if self._offset + end > self._data.size:
      raise CheckpointError(f"safetensors file {self.path!r} is truncated (tensor {name!r})")
    raw = self._data[self._offset + begin:self._offset + end]
    return raw.view(dtype).reshape(shape)


def _to_hf_layout(kind: str, array: np.ndarray) -> np.ndarray:
  """Our parameter layout -> HF tensor layout."""
  if kind in ("qkv_kernel",):      # [h, H, D] -> [H·D, h]
    return array.reshape(array.shape[0], -1).T
  if kind == "o_kernel":           # [H, D, h] -> [h, H·D]
    return array.reshape(-1, array.shape[-1]).T
  if kind == "qkv_bias":           # [H, D] -> [H·D]
    return array.reshape(-1)
  if kind == "linear":             # [in, out] -> [out, in]
    return array.T
  return array


def _from_hf_layout(kind: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """HF tensor layout -> our parameter layout of `shape`."""
  if kind == "qkv_kernel":
    return array.T.reshape(shape)
  if kind == "o_kernel":
    return array.T.reshape(shape)
  if kind == "qkv_bias":
    return array.reshape(shape)
  if kind == "linear":
    return array.T
  return array


def parameter_names(config: ModelConfig) -> dict[tuple, tuple[str, str]]:
  """Maps each base parameter's state path to (HF tensor name, layout kind); adapters have
  none."""
  names = {("embed",): ("model.embed_tokens.weight", "same"),
           ("final_norm", "weight"): ("model.norm.weight", "same")}
  if not config.tie_word_embeddings:
    names[("lm_head",)] = ("lm_head.weight", "linear")
  for i in range(config.num_layers):
    hf = f"model.layers.{i}"
    names[("layers", i, "input_norm", "weight")] = (f"{hf}.input_layernorm.weight", "same")
    names[("layers", i, "post_attn_norm", "weight")] = (
        f"{hf}.post_attention_layernorm.weight", "same")
    for proj in ("q", "k", "v"):
      names[("layers", i, "attn", f"{proj}_kernel")] = (f"{hf}.self_attn.{proj}_proj.weight",
                                                        "qkv_kernel")
      if config.qkv_bias:
        names[("layers", i, "attn", f"{proj}_bias")] = (f"{hf}.self_attn.{proj}_proj.bias",
                                                        "qkv_bias")
    if config.qk_norm:
      for proj in ("q", "k"):
        names[("layers", i, "attn", f"{proj}_norm", "weight")] = (
            f"{hf}.self_attn.{proj}_norm.weight", "same")
    names[("layers", i, "attn", "o_kernel")] = (f"{hf}.self_attn.o_proj.weight", "o_kernel")
    for proj in ("gate", "up", "down"):
      names[("layers", i, "mlp", f"{proj}_kernel")] = (f"{hf}.mlp.{proj}_proj.weight", "linear")
  return names


def _hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  return _to_hf_layout(kind, np.empty(shape, np.int8)).shape


def _state_path(key_path) -> tuple:
  """`(DictKey('layers'), DictKey(0), ..., GetAttrKey('value'))` -> `('layers', 0, ...)`."""
  path = []
  for key in key_path:
    if isinstance(key, jax.tree_util.DictKey):
      path.append(key.key)
    elif isinstance(key, jax.tree_util.SequenceKey):
      path.append(key.idx)
  return tuple(path)


def _read_json(path: str, what: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"cannot read {what} {path!r}: {e}") from None


def read_hf_config(path: str) -> dict[str, Any]:
  """The checkpoint directory's config.json."""
  if not os.path.isdir(path):
    raise CheckpointError(f"checkpoint directory {path!r} does not exist")
  config_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_path):
    raise CheckpointError(f"no {CONFIG_FILE} in checkpoint directory {path!r}")
  return _read_json(config_path, "the model config")


def read_generation_config(path: str) -> dict[str, Any]:
  """The checkpoint directory's generation_config.json (bos / eos / pad token ids, sampling
  defaults), or {} if it has none."""
  file = os.path.join(path, GENERATION_CONFIG_FILE)
  if not os.path.isfile(file):
    return {}
  config = _read_json(file, "the generation config")
  if not isinstance(config, dict):
    raise CheckpointError(f"{file!r} must hold a JSON object, got {type(config).__name__}")
  return config


def _tensor_files(path: str) -> dict[str, SafetensorsFile]:
  """Tensor name -> its safetensors file, from the index of a sharded checkpoint or one file."""
  index_path = os.path.join(path, INDEX_FILE)
  if os.path.isfile(index_path):
    index = _read_json(index_path, "the shard index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{INDEX_FILE} in {path!r} has no weight_map object")
    shards = {}
    for file in sorted(set(weight_map.values())):
      if not os.path.isfile(os.path.join(path, file)):
        raise CheckpointError(f"shard {file!r} listed in {INDEX_FILE} is missing from {path!r}")
      shards[file] = SafetensorsFile(os.path.join(path, file))
    for name, file in weight_map.items():
      if name not in shards[file].keys():
        raise CheckpointError(f"tensor {name!r} is not in shard {file!r}, where {INDEX_FILE} "
                              f"places it ({path!r})")
    return {name: shards[file] for name, file in weight_map.items()}
  single = os.path.join(path, SINGLE_FILE)
  if not os.path.isfile(single):
    raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in checkpoint directory {path!r}")
  handle = SafetensorsFile(single)
  return {name: handle for name in handle.keys()}


def checkpoint_config(path: str, **overrides) -> ModelConfig:
  """The model config a checkpoint's config.json describes (with `overrides`, e.g. the
  `lora_rank`, `remat` and `scan_layers` a run loads it with); reads no weights."""
  try:
    return ModelConfig.from_hf_config(read_hf_config(path), **overrides)
  except CheckpointError:
    raise
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"checkpoint {path!r}: {e}") from None


def _read_parameter(files, path, hf_name, kind, leaf, config) -> np.ndarray:
  """The checkpoint tensor `hf_name` in our layout and `leaf`'s dtype, checked."""
  handle = files[hf_name]
  want = _hf_shape(kind, leaf.shape)
  if handle.shape(hf_name) != want:
    raise CheckpointError(f"tensor {hf_name!r} has shape {handle.shape(hf_name)}, expected "
                          f"{want} for config {config.architecture} in {path!r}")
  tensor = handle.get(hf_name)
  if not jnp.issubdtype(tensor.dtype, jnp.floating):
    raise CheckpointError(f"tensor {hf_name!r} has dtype {tensor.dtype}, expected a float "
                          f"dtype, in {path!r}")
  with np.errstate(over="ignore"):  # a value past the dtype's range is counted just below
    array = _from_hf_layout(kind, tensor, leaf.shape).astype(leaf.dtype)
  bad = count_nonfinite(array)
  if bad:
    raise CheckpointError(f"tensor {hf_name!r} in {handle.path!r} has {bad} NaN or Inf "
                          f"value(s) of {array.size} as {array.dtype}")
  return array


def count_nonfinite(array: np.ndarray, chunk: int = 1 << 22) -> int:
  """The NaN and Inf values of `array`, counted `chunk` values at a time (so a checkpoint's
  largest tensor needs no second array of its size)."""
  flat = array.reshape(-1)
  return sum(int(flat[i:i + chunk].size - np.count_nonzero(np.isfinite(flat[i:i + chunk])))
             for i in range(0, flat.size, chunk))


def _fresh_adapter(state_path: tuple, leaf, key: jax.Array) -> np.ndarray:
  """A new adapter leaf: A ~ N(0, 1/in) [in..., r], B = 0 (see `models.lora`)."""
  if state_path[-1].endswith("_lora_b"):
    return np.zeros(leaf.shape, leaf.dtype)
  fan_in = math.prod(leaf.shape[:-1])
  a = jax.random.normal(key, leaf.shape, jnp.float32) / math.sqrt(fan_in)
  return np.asarray(a).astype(leaf.dtype)


def load_hf_checkpoint(
    path: str, *, dtype: Optional[str] = None, param_dtype: Optional[str] = None,
    sharding_for: Optional[Callable[[tuple, tuple[int, ...]], Any]] = None,
    strict: bool = True, lora_rank: int = 0, lora_alpha: float = 16.0,
    seed: int = 0, remat: str = "none", scan_layers: bool = False
    ) -> tuple[Decoder, ModelConfig]:
  """Loads an HF Llama 3.x / Qwen2(.5) / Qwen3 checkpoint directory into a `Decoder`.

  Args:
    path: directory with config.json and model.safetensors (or an index and its shards).
    dtype: compute dtype override ("float32" / "bfloat16"); default the checkpoint's.
    param_dtype: parameter dtype override; default `dtype` if given, else the checkpoint's.
    sharding_for: `(state_path, shape) -> jax.sharding.Sharding | None`, where each parameter is
      placed (default: the default device).
    strict: refuse tensors the model has no place for (False: ignore them).
    lora_rank, lora_alpha: adapters to add (`ModelConfig.lora_rank`; 0 = none), freshly
      initialised from `seed` (B = 0: the loaded model computes the checkpoint's function).
    remat, scan_layers: how the layer loop runs (`ModelConfig`; the parameters are the same).

  Returns:
    (model, config), the config read from config.json with the overrides above.

  Raises:
    CheckpointError: no config.json, safetensors file or listed shard; a file that is not
      safetensors; an unsupported model_type or feature; a missing or unexpected tensor, a shape
      mismatch, or NaN or Inf values (after the conversion to the parameter dtype); a LoRA rank
      the model cannot take (each named in one line).
  """
  overrides = dict(lora_rank=lora_rank, lora_alpha=lora_alpha, remat=remat,
                   scan_layers=scan_layers)
  if dtype is not None:
    overrides.update(dtype=dtype, param_dtype=param_dtype or dtype)
  elif param_dtype is not None:
    overrides.update(param_dtype=param_dtype)
  config = checkpoint_config(path, **overrides)
  files = _tensor_files(path)
  names = parameter_names(config)

  expected = {hf_name for hf_name, _ in names.values()}
  missing = sorted(expected - files.keys())
  if missing:
    raise CheckpointError(f"checkpoint {path!r} is missing tensors: {missing}")
  unexpected = sorted(files.keys() - expected)
  if unexpected and strict:
    raise CheckpointError(f"checkpoint {path!r} has unexpected tensors: {unexpected}")

  abstract_model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract_model)
  adapter_keys = iter(jax.random.split(jax.random.key(seed), 2 * config.num_layers * 7))

  def place(key_path, leaf):
    state_path = _state_path(key_path)
    if state_path in names:
      array = _read_parameter(files, path, *names[state_path], leaf, config)
    else:  # an adapter leaf, A or B (the only leaves without an HF name)
      array = _fresh_adapter(state_path, leaf, next(adapter_keys))
    sharding = sharding_for(state_path, leaf.shape) if sharding_for else None
    return jax.device_put(array, sharding) if sharding is not None else jnp.asarray(array)

  state = jax.tree_util.tree_map_with_path(place, abstract_state)
  return nnx.merge(graphdef, state), config


def merged_model(model: Decoder) -> Decoder:
  """The model with its adapters folded into the kernels (`lora.merge_lora`); a model without
  adapters is returned as it is."""
  if model.config.lora_rank == 0:
    return model
  plain_config = model.config.without_lora()
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: Decoder(plain_config, rngs=nnx.Rngs(0))))
  return nnx.merge(graphdef, lora.merge_lora(nnx.state(model), model.config))


def hf_tensors(model: Decoder) -> dict[str, np.ndarray]:
  """The model's parameters as HF-named numpy tensors in HF layout (parameter dtype), adapters
  merged."""
  model = merged_model(model)
  names = parameter_names(model.config)
  tensors = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
    hf_name, kind = names[_state_path(key_path)]
    tensors[hf_name] = np.ascontiguousarray(_to_hf_layout(kind, np.asarray(leaf)))
  return tensors


def _shards(tensors: dict[str, np.ndarray], max_shard_bytes: Optional[int]) -> list[dict]:
  """Tensors grouped in order into shards of at most `max_shard_bytes` (a larger tensor alone)."""
  if max_shard_bytes is None or sum(t.nbytes for t in tensors.values()) <= max_shard_bytes:
    return [tensors]
  shards, current, size = [], {}, 0
  for name, tensor in tensors.items():
    if current and size + tensor.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensor
    size += tensor.nbytes
  shards.append(current)
  return shards


def _write_checkpoint_files(model: Decoder, out: str, max_shard_bytes, generation_config):
  """config.json, generation_config.json and the safetensors files of `model` into `out`."""
  with open(os.path.join(out, CONFIG_FILE), "w", encoding="utf-8") as f:
    json.dump(model.config.to_hf_config(), f, indent=2)
  generation = {"_from_model_config": True} if generation_config is None else generation_config
  with open(os.path.join(out, GENERATION_CONFIG_FILE), "w", encoding="utf-8") as f:
    json.dump(dict(generation), f, indent=2)
  tensors = hf_tensors(model)
  metadata = {"format": "pt"}
  shards = _shards(tensors, max_shard_bytes)
  if len(shards) == 1:
    save_file(tensors, os.path.join(out, SINGLE_FILE), metadata=metadata)
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(out, file), metadata=metadata)
    weight_map.update({name: file for name in shard})
  index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
           "weight_map": weight_map}
  with open(os.path.join(out, INDEX_FILE), "w", encoding="utf-8") as f:
    json.dump(index, f, indent=2)


def save_hf_checkpoint(model: Decoder, path: str, max_shard_bytes: Optional[int] = None,
                       generation_config: Optional[dict[str, Any]] = None) -> None:
  """Writes `model` as an HF checkpoint directory that transformers loads as it is.

  config.json (architecture, model_type, dtype), generation_config.json (`generation_config`,
  e.g. the loaded checkpoint's `read_generation_config`; default `{"_from_model_config":
  true}`: transformers then takes its defaults from config.json) and model.safetensors, or
  shards of at most `max_shard_bytes` with their index. A LoRA model is saved merged. The
  tokenizer is the caller's (`tokenizer.save_pretrained(path)`).

  The files are written to a temporary directory beside `path` and moved in once all are
  complete; weight files of an earlier checkpoint in `path` are removed, so a half-written or
  mixed checkpoint is never left behind.
  """
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  if os.path.exists(path) and not os.path.isdir(path):
    raise CheckpointError(f"cannot save a checkpoint to {path!r}: it is a file")
  staging = tempfile.mkdtemp(prefix=".checkpoint-", dir=parent)
  try:
    _write_checkpoint_files(model, staging, max_shard_bytes, generation_config)
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
      if name == INDEX_FILE or (name.startswith("model") and name.endswith(".safetensors")):
        os.remove(os.path.join(path, name))
    for name in os.listdir(staging):
      os.replace(os.path.join(staging, name), os.path.join(path, name))
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def load_tokenizer(path: str):
  """The checkpoint's tokenizer and chat template, via `transformers.AutoTokenizer` (offline)."""
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  return AutoTokenizer.from_pretrained(path, local_files_only=True)
