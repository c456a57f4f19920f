"""HF checkpoints (config.json + safetensors) <-> the NNX decoder's state.

Loading builds the model shape-first (`nnx.eval_shape`, no memory for weights), then reads and
places one tensor at a time, so a per-parameter sharding can be targeted without ever holding
the whole checkpoint on the host. Both a single `model.safetensors` and a sharded checkpoint
(`model.safetensors.index.json` + shards) are read; saving writes the same layout back.

Name mapping (HF PyTorch `nn.Linear` weights are [out, in]; ours are [in, ...]):

  model.embed_tokens.weight                   [V, h]      embed                 [V, h]
  model.layers.i.input_layernorm.weight       [h]         layers.i.input_norm.weight
  model.layers.i.self_attn.q_proj.weight      [H·D, h]    layers.i.attn.q_kernel [h, H, D]
  model.layers.i.self_attn.q_proj.bias        [H·D]       layers.i.attn.q_bias   [H, D]
  (k_proj, v_proj likewise with Hkv heads)
  model.layers.i.self_attn.o_proj.weight      [h, H·D]    layers.i.attn.o_kernel [H, D, h]
  model.layers.i.post_attention_layernorm.weight          layers.i.post_attn_norm.weight
  model.layers.i.mlp.{gate,up}_proj.weight    [I, h]      layers.i.mlp.{gate,up}_kernel [h, I]
  model.layers.i.mlp.down_proj.weight         [h, I]      layers.i.mlp.down_kernel [I, h]
  model.norm.weight                           [h]         final_norm.weight
  lm_head.weight (untied only)                [V, h]      lm_head               [h, V]
"""

import json
import os
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from bpo_jax.models.config import ModelConfig
from bpo_jax.models.decoder import Decoder

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
  """A checkpoint directory that does not match the model it is loaded into."""


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
  """Maps each parameter's state path to (HF tensor name, layout kind)."""
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


def read_hf_config(path: str) -> dict[str, Any]:
  config_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"no {CONFIG_FILE} in checkpoint directory {path!r}")
  with open(config_path, encoding="utf-8") as f:
    return json.load(f)


def _tensor_files(path: str) -> dict[str, str]:
  """Tensor name -> safetensors file, from the index of a sharded checkpoint or one file."""
  index_path = os.path.join(path, INDEX_FILE)
  if os.path.isfile(index_path):
    with open(index_path, encoding="utf-8") as f:
      weight_map = json.load(f)["weight_map"]
    files = {name: os.path.join(path, file) for name, file in weight_map.items()}
    for file in sorted(set(files.values())):
      if not os.path.isfile(file):
        raise FileNotFoundError(f"shard {os.path.basename(file)!r} listed in {INDEX_FILE} is "
                                f"missing from {path!r}")
    return files
  single = os.path.join(path, SINGLE_FILE)
  if not os.path.isfile(single):
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in checkpoint directory {path!r}")
  with safe_open(single, framework="numpy") as f:
    return {name: single for name in f.keys()}


def load_hf_checkpoint(
    path: str, *, dtype: Optional[str] = None, param_dtype: Optional[str] = None,
    sharding_for: Optional[Callable[[tuple, tuple[int, ...]], Any]] = None,
    strict: bool = True) -> tuple[Decoder, ModelConfig]:
  """Loads an HF Llama / Qwen2 checkpoint directory into a `Decoder`.

  Args:
    path: directory with config.json and model.safetensors (or an index and its shards).
    dtype: compute dtype override ("float32" / "bfloat16"); default the checkpoint's.
    param_dtype: parameter dtype override; default `dtype` if given, else the checkpoint's.
    sharding_for: `(state_path, shape) -> jax.sharding.Sharding | None`, where each parameter is
      placed (default: the default device).
    strict: refuse tensors the model has no place for (False: ignore them).

  Returns:
    (model, config).

  Raises:
    FileNotFoundError: config.json, the safetensors file or a listed shard is missing.
    ValueError: unsupported architecture (from `ModelConfig.from_hf_config`).
    CheckpointError: a missing or unexpected tensor, or a shape mismatch (each named).
  """
  overrides = {}
  if dtype is not None:
    overrides.update(dtype=dtype, param_dtype=param_dtype or dtype)
  elif param_dtype is not None:
    overrides.update(param_dtype=param_dtype)
  config = ModelConfig.from_hf_config(read_hf_config(path), **overrides)
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
  handles = {}

  def place(key_path, leaf):
    state_path = _state_path(key_path)
    hf_name, kind = names[state_path]
    file = files[hf_name]
    if file not in handles:
      handles[file] = safe_open(file, framework="numpy")
    tensor = handles[file].get_tensor(hf_name)
    want = _hf_shape(kind, leaf.shape)
    if tuple(tensor.shape) != want:
      raise CheckpointError(f"tensor {hf_name!r} has shape {tuple(tensor.shape)}, expected "
                            f"{want} for config {config.architecture} in {path!r}")
    array = _from_hf_layout(kind, tensor, leaf.shape).astype(leaf.dtype)
    sharding = sharding_for(state_path, leaf.shape) if sharding_for else None
    return jax.device_put(array, sharding) if sharding is not None else jnp.asarray(array)

  state = jax.tree_util.tree_map_with_path(place, abstract_state)
  return nnx.merge(graphdef, state), config


def hf_tensors(model: Decoder) -> dict[str, np.ndarray]:
  """The model's parameters as HF-named numpy tensors in HF layout (parameter dtype)."""
  names = parameter_names(model.config)
  tensors = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
    hf_name, kind = names[_state_path(key_path)]
    tensors[hf_name] = np.ascontiguousarray(_to_hf_layout(kind, np.asarray(leaf)))
  return tensors


def save_hf_checkpoint(model: Decoder, path: str,
                       max_shard_bytes: Optional[int] = None) -> None:
  """Writes config.json and safetensors (sharded with an index past `max_shard_bytes`)."""
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:
    json.dump(model.config.to_hf_config(), f, indent=2)
  tensors = hf_tensors(model)
  metadata = {"format": "pt"}
  if max_shard_bytes is None or sum(t.nbytes for t in tensors.values()) <= max_shard_bytes:
    save_file(tensors, os.path.join(path, SINGLE_FILE), metadata=metadata)
    return
  shards, current, size = [], {}, 0
  for name, tensor in tensors.items():
    if current and size + tensor.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensor
    size += tensor.nbytes
  shards.append(current)
  weight_map = {}
  for i, shard in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(path, file), metadata=metadata)
    weight_map.update({name: file for name in shard})
  index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
           "weight_map": weight_map}
  with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
    json.dump(index, f, indent=2)


def load_tokenizer(path: str):
  """The checkpoint's tokenizer and chat template, via `transformers.AutoTokenizer` (offline)."""
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  return AutoTokenizer.from_pretrained(path, local_files_only=True)
