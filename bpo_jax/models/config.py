"""Model configuration for the Llama 3.x / Qwen2.5 / Qwen3 decoder family.

One dataclass describes every supported checkpoint. The families differ only in a few switches:
Qwen2 puts a bias on the q/k/v projections, Qwen3 normalises each query and key head (RMSNorm
over head_dim, before RoPE) instead, Llama 3.1+ rescales the RoPE frequencies, and the small
checkpoints of each tie the output projection to the token embedding. Low-rank adapters (LoRA)
on the attention and MLP projections are a switch too (`lora_rank`); they are not part of an
HF checkpoint, whose config.json decides everything else.

Example:

  config = ModelConfig.qwen2_5_0_5b()
  config.num_params()            # 494032768
  tiny = ModelConfig.tiny(dtype="float32")
  ModelConfig.qwen3_0_6b(lora_rank=16).num_lora_params()   # 10092544 adapter parameters
"""

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
REMAT_POLICIES = ("none", "full", "dots")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """Llama 3.1 frequency rescaling of RoPE (`rope_type: llama3` in HF configs).

  With wavelength `λ_i = 2π / f_i` of frequency `f_i`: frequencies whose wavelength is shorter
  than `original_max_position_embeddings / high_freq_factor` are kept, those longer than
  `original_max_position_embeddings / low_freq_factor` are divided by `factor`, and the ones in
  between are blended linearly in `original_max_position_embeddings / λ_i`.
  """
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder.

  Attributes:
    architecture: "llama", "qwen2" or "qwen3" (the HF `model_type`; the checkpoint format and
      defaults differ).
    vocab_size: number of token ids.
    hidden_size: model width.
    intermediate_size: SwiGLU hidden width.
    num_layers: number of decoder blocks.
    num_heads: query heads.
    num_kv_heads: key/value heads (grouped-query attention; divides num_heads).
    head_dim: width of one head.
    rope_theta: RoPE base.
    rope_scaling: Llama 3 frequency rescaling, or None.
    rms_norm_eps: epsilon of RMSNorm.
    qkv_bias: whether q/k/v projections have a bias (Qwen2).
    qk_norm: whether each query and key head is RMS-normalised over head_dim before RoPE
      (Qwen3), with its own weight [head_dim] per layer.
    tie_word_embeddings: whether the output projection is the transposed token embedding.
    max_position_embeddings: the context length the checkpoint was trained for (informative).
    dtype: compute dtype name ("float32", "bfloat16").
    param_dtype: parameter dtype name.
    remat: recomputation of each layer's activations in the backward pass, to trade compute for
      memory: "none"; "full" (keep only each layer's input); "dots" (also keep the outputs of
      matmuls without batch dimensions, i.e. the weight projections).
    scan_layers: run the layers as one `lax.scan` over their stacked weights, so compile time
      does not grow with depth: a cache-free forward (training) and a dense cache's (sampling:
      the layers' caches stacked in the scan's carry); a paged cache's runs the layer loop.
      Numbers are unchanged up to rounding.
    lora_rank: r > 0 adds a low-rank adapter `W + (alpha / r) · A B` to each attention (q, k,
      v, o) and MLP (gate, up, down) projection, A [in, r] random normal, B [r, out] zeros (see
      `models.lora`); 0 (the default) adds none. At most the smallest dimension of any
      projection.
    lora_alpha: the adapters' scale numerator, `alpha / r` (PEFT's convention).
  """
  architecture: str = "qwen2"
  vocab_size: int = 256
  hidden_size: int = 64
  intermediate_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  rope_theta: float = 10000.0
  rope_scaling: Optional[Llama3RopeScaling] = None
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = True
  tie_word_embeddings: bool = True
  max_position_embeddings: int = 4096
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = False
  qk_norm: bool = False
  lora_rank: int = 0
  lora_alpha: float = 16.0

  def __post_init__(self):
    if self.architecture not in SUPPORTED_ARCHITECTURES.values():
      raise ValueError(
          f"architecture must be one of {sorted(SUPPORTED_ARCHITECTURES.values())}, "
          f"got {self.architecture!r}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                       f"({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"{name} must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
    self._check_lora()

  def projection_shapes(self) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection an adapter can go on."""
    h, i = self.hidden_size, self.intermediate_size
    q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    return {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, i), "up": (h, i),
            "down": (i, h)}

  def _check_lora(self):
    rank = self.lora_rank
    if isinstance(rank, bool) or not isinstance(rank, int):
      raise ValueError(f"lora_rank must be an int (0 = no adapters), got {rank!r}")
    if rank < 0:
      raise ValueError(f"lora_rank must be >= 0 (0 = no adapters), got {rank}")
    if rank and not self.lora_alpha > 0:
      raise ValueError(f"lora_alpha must be positive, got {self.lora_alpha}")
    for name, (fan_in, fan_out) in self.projection_shapes().items():
      if rank > min(fan_in, fan_out):
        raise ValueError(f"lora_rank {rank} exceeds the {name} projection's smaller dimension "
                         f"({fan_in} -> {fan_out}): an adapter there cannot have that rank")

  def without_lora(self) -> "ModelConfig":
    """The same model without adapters (what a LoRA model is once merged)."""
    default_alpha = ModelConfig.__dataclass_fields__["lora_alpha"].default
    return self.replace(lora_rank=0, lora_alpha=default_alpha)

  @property
  def lora_scale(self) -> float:
    """`alpha / r`, the factor of the adapters' product (0 without adapters)."""
    return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def params_dtype(self):
    return _DTYPES[self.param_dtype]

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Number of base parameters (tied embeddings counted once; adapters not counted, see
    `num_lora_params`)."""
    h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    attention = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
    attention += 2 * self.head_dim if self.qk_norm else 0
    mlp = 3 * h * self.intermediate_size
    per_layer = attention + mlp + 2 * h
    embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
    return self.num_layers * per_layer + embeddings + h

  def num_lora_params(self) -> int:
    """Number of adapter parameters: `r · (in + out)` per adapted projection and layer."""
    per_layer = sum(self.lora_rank * (a + b) for a, b in self.projection_shapes().values())
    return self.num_layers * per_layer

  # ----- named presets -----

  @classmethod
  def tiny(cls, **overrides) -> "ModelConfig":
    """A Qwen2-style test model (qkv bias, tied embeddings), ~60k parameters."""
    return cls(**overrides)

  @classmethod
  def tiny_llama(cls, **overrides) -> "ModelConfig":
    """A Llama-3-style test model (no bias, untied, Llama 3 RoPE scaling with a short context)."""
    base = dict(architecture="llama", qkv_bias=False, tie_word_embeddings=False, rope_theta=500000.0,
                rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 32), rms_norm_eps=1e-5,
                max_position_embeddings=256)
    return cls(**{**base, **overrides})

  @classmethod
  def _qwen2_5(cls, **fields) -> "ModelConfig":
    base = dict(architecture="qwen2", vocab_size=151936, head_dim=128, rope_theta=1000000.0,
                rms_norm_eps=1e-6, qkv_bias=True, max_position_embeddings=32768,
                dtype="bfloat16", param_dtype="bfloat16")
    return cls(**{**base, **fields})

  @classmethod
  def qwen2_5_0_5b(cls, **overrides) -> "ModelConfig":
    return cls._qwen2_5(**{**dict(hidden_size=896, intermediate_size=4864, num_layers=24,
                                  num_heads=14, num_kv_heads=2, head_dim=64,
                                  tie_word_embeddings=True), **overrides})

  @classmethod
  def qwen2_5_1_5b(cls, **overrides) -> "ModelConfig":
    return cls._qwen2_5(**{**dict(hidden_size=1536, intermediate_size=8960, num_layers=28,
                                  num_heads=12, num_kv_heads=2, tie_word_embeddings=True),
                           **overrides})

  @classmethod
  def qwen2_5_3b(cls, **overrides) -> "ModelConfig":
    return cls._qwen2_5(**{**dict(hidden_size=2048, intermediate_size=11008, num_layers=36,
                                  num_heads=16, num_kv_heads=2, tie_word_embeddings=True),
                           **overrides})

  @classmethod
  def qwen2_5_7b(cls, **overrides) -> "ModelConfig":
    return cls._qwen2_5(**{**dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                  num_layers=28, num_heads=28, num_kv_heads=4,
                                  tie_word_embeddings=False), **overrides})

  @classmethod
  def tiny_qwen3(cls, **overrides) -> "ModelConfig":
    """A Qwen3-style test model (per-head q/k norms, no bias, head_dim not hidden / heads)."""
    base = dict(architecture="qwen3", qkv_bias=False, qk_norm=True, head_dim=24,
                rope_theta=1000000.0, max_position_embeddings=256)
    return cls(**{**base, **overrides})

  @classmethod
  def qwen3_0_6b(cls, **overrides) -> "ModelConfig":
    base = dict(architecture="qwen3", vocab_size=151936, hidden_size=1024,
                intermediate_size=3072, num_layers=28, num_heads=16, num_kv_heads=8,
                head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=False,
                qk_norm=True, tie_word_embeddings=True, max_position_embeddings=40960,
                dtype="bfloat16", param_dtype="bfloat16")
    return cls(**{**base, **overrides})

  @classmethod
  def llama3_2_1b(cls, **overrides) -> "ModelConfig":
    base = dict(architecture="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0,
                rope_scaling=Llama3RopeScaling(32.0, 1.0, 4.0, 8192), rms_norm_eps=1e-5,
                qkv_bias=False, tie_word_embeddings=True, max_position_embeddings=131072,
                dtype="bfloat16", param_dtype="bfloat16")
    return cls(**{**base, **overrides})

  @classmethod
  def llama3_1_8b(cls, **overrides) -> "ModelConfig":
    base = dict(architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 8192), rms_norm_eps=1e-5,
                qkv_bias=False, tie_word_embeddings=False, max_position_embeddings=131072,
                dtype="bfloat16", param_dtype="bfloat16")
    return cls(**{**base, **overrides})

  # ----- HF config.json -----

  @classmethod
  def from_hf_config(cls, hf: dict[str, Any], **overrides) -> "ModelConfig":
    """Builds a config from the fields of an HF `config.json` (transformers 4.x or 5.x layout).

    Raises:
      ValueError: for a `model_type` / architecture other than llama / qwen2 / qwen3 causal LMs,
        a feature this decoder does not implement (sliding-window attention, other RoPE types,
        MLP or output-projection biases), or a missing or malformed shape field.
    """
    family = _hf_family(hf)
    _check_hf_features(hf, family)
    try:
      num_heads = int(hf["num_attention_heads"])
      head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // num_heads
      rope_theta, rope_scaling = _hf_rope(hf)
      hf_dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
      dtype = hf_dtype if hf_dtype in _DTYPES else "float32"
      fields = dict(
          architecture=family,
          vocab_size=int(hf["vocab_size"]),
          hidden_size=int(hf["hidden_size"]),
          intermediate_size=int(hf["intermediate_size"]),
          num_layers=int(hf["num_hidden_layers"]),
          num_heads=num_heads,
          num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
          head_dim=int(head_dim),
          rope_theta=rope_theta,
          rope_scaling=rope_scaling,
          rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
          # Qwen2 always has q/k/v biases; Llama and Qwen3 have none (attention_bias=True, which
          # also biases o_proj, is refused above).
          qkv_bias=family == "qwen2",
          qk_norm=family == "qwen3",
          tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
          max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
          dtype=dtype,
          param_dtype=dtype,
      )
    except KeyError as e:
      raise ValueError(f"config.json has no {e.args[0]!r} field") from None
    except (TypeError, ValueError) as e:
      raise ValueError(f"config.json has a malformed field: {e}") from None
    return cls(**{**fields, **overrides})

  def to_hf_config(self) -> dict[str, Any]:
    """The HF `config.json` fields for this config (loadable by transformers 4.x and 5.x).

    Adapters are not part of it: a model with `lora_rank > 0` is saved merged.
    """
    arch_name = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}[self.architecture]
    rope_scaling = None
    if self.rope_scaling is not None:
      rope_scaling = dict(rope_type="llama3", **dataclasses.asdict(self.rope_scaling))
    hf = dict(
        architectures=[arch_name],
        model_type=self.architecture,
        vocab_size=self.vocab_size,
        hidden_size=self.hidden_size,
        intermediate_size=self.intermediate_size,
        num_hidden_layers=self.num_layers,
        num_attention_heads=self.num_heads,
        num_key_value_heads=self.num_kv_heads,
        head_dim=self.head_dim,
        hidden_act="silu",
        rms_norm_eps=self.rms_norm_eps,
        rope_theta=self.rope_theta,
        rope_scaling=rope_scaling,
        rope_parameters=dict(rope_theta=self.rope_theta,
                             **(rope_scaling or {"rope_type": "default"})),
        tie_word_embeddings=self.tie_word_embeddings,
        max_position_embeddings=self.max_position_embeddings,
        torch_dtype=self.param_dtype,
        dtype=self.param_dtype,
    )
    bias, norm = {"llama": (False, False), "qwen2": (True, False), "qwen3": (False, True)}[
        self.architecture]
    if (self.qkv_bias, self.qk_norm) != (bias, norm):
      raise ValueError(f"a {self.architecture} checkpoint has qkv_bias={bias}, qk_norm={norm}; "
                       f"this config has {self.qkv_bias}, {self.qk_norm}")
    if self.architecture == "llama":
      hf.update(attention_bias=False, mlp_bias=False)
    elif self.architecture == "qwen2":
      hf.update(use_sliding_window=False, sliding_window=None)
    else:
      hf.update(attention_bias=False, use_sliding_window=False, sliding_window=None)
    return hf


def _hf_family(hf: dict[str, Any]) -> str:
  """The decoder family of an HF config: its `model_type`, checked against `architectures`."""
  if not isinstance(hf, dict):
    raise ValueError(f"config.json must hold a JSON object, got {type(hf).__name__}")
  model_type = hf.get("model_type")
  architectures = hf.get("architectures") or []
  supported = sorted(SUPPORTED_ARCHITECTURES.values())
  if model_type is not None and model_type not in supported:
    raise ValueError(f"unsupported model_type {model_type!r} (architectures {architectures}): "
                     f"supported are {supported}")
  families = {SUPPORTED_ARCHITECTURES[a] for a in architectures if a in SUPPORTED_ARCHITECTURES}
  if architectures and not families:
    raise ValueError(f"unsupported architecture {architectures!r}: supported are "
                     f"{sorted(SUPPORTED_ARCHITECTURES)}")
  if model_type is None and len(families) != 1:
    raise ValueError(f"config.json names no model_type and architectures {architectures!r}: "
                     f"supported are {sorted(SUPPORTED_ARCHITECTURES)}")
  family = model_type or families.pop()
  if families and family not in families:
    raise ValueError(f"model_type {model_type!r} does not match architectures {architectures}")
  return family


def _check_hf_features(hf: dict[str, Any], family: str) -> None:
  """Refuses what the decoder does not compute (one line naming the feature)."""
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}: only 'silu' (SwiGLU)")
  if hf.get("mlp_bias", False):
    raise ValueError("unsupported: mlp_bias=True")
  if family in ("llama", "qwen3") and hf.get("attention_bias", False):
    raise ValueError(f"unsupported: {family} attention_bias=True (it also adds an o_proj bias)")
  if family in ("qwen2", "qwen3") and hf.get("use_sliding_window", False):
    raise ValueError("unsupported: sliding-window attention (use_sliding_window=True)")
  layer_types = set(hf.get("layer_types") or ["full_attention"])
  if layer_types != {"full_attention"}:
    raise ValueError(f"unsupported layer_types {sorted(layer_types)}: only full_attention")


def _hf_rope(hf: dict[str, Any]) -> tuple[float, Optional[Llama3RopeScaling]]:
  """(rope_theta, Llama 3 scaling or None) of an HF config.

  transformers 5 writes `rope_parameters` (with rope_theta inside); 4.x writes `rope_scaling`
  and a top-level `rope_theta`.
  """
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  rope_theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type == "default":
    return rope_theta, None
  if rope_type != "llama3":
    raise ValueError(f"unsupported rope_type {rope_type!r}: only 'default' and 'llama3'")
  return rope_theta, Llama3RopeScaling(
      factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
      high_freq_factor=float(rope["high_freq_factor"]),
      original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
