"""Model configuration for the Llama 3.x / Qwen2.5 decoder family.

One dataclass describes every supported checkpoint. The two families differ only in a few
switches: Qwen2 puts a bias on the q/k/v projections, Llama 3.1+ rescales the RoPE frequencies,
and the small checkpoints of both tie the output projection to the token embedding.

Example:

  config = ModelConfig.qwen2_5_0_5b()
  config.num_params()            # 494032768
  tiny = ModelConfig.tiny(dtype="float32")
"""

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
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
    architecture: "llama" or "qwen2" (only the checkpoint format and defaults differ).
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
    tie_word_embeddings: whether the output projection is the transposed token embedding.
    max_position_embeddings: the context length the checkpoint was trained for (informative).
    dtype: compute dtype name ("float32", "bfloat16").
    param_dtype: parameter dtype name.
    remat: recomputation of each layer's activations in the backward pass, to trade compute for
      memory: "none"; "full" (keep only each layer's input); "dots" (also keep the outputs of
      matmuls without batch dimensions, i.e. the weight projections).
    scan_layers: run the layers of a cache-free forward (training) as one `lax.scan` over
      their stacked weights, so compile time does not grow with depth. Numbers are unchanged.
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

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def params_dtype(self):
    return _DTYPES[self.param_dtype]

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Number of parameters (tied embeddings counted once)."""
    h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    attention = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
    mlp = 3 * h * self.intermediate_size
    per_layer = attention + mlp + 2 * h
    embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
    return self.num_layers * per_layer + embeddings + h

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
      ValueError: for an architecture other than LlamaForCausalLM / Qwen2ForCausalLM, or a
        feature this decoder does not implement (sliding-window attention, other RoPE types,
        MLP or output-projection biases).
    """
    architectures = hf.get("architectures") or []
    model_type = hf.get("model_type")
    architecture = None
    for name in architectures:
      architecture = SUPPORTED_ARCHITECTURES.get(name, architecture)
    if architecture is None and not architectures and model_type in ("llama", "qwen2"):
      architecture = model_type
    if architecture is None:
      raise ValueError(
          f"unsupported architecture {architectures or model_type!r}: supported are "
          f"{sorted(SUPPORTED_ARCHITECTURES)}")
    if hf.get("hidden_act", "silu") != "silu":
      raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}: only 'silu' (SwiGLU)")
    if hf.get("mlp_bias", False):
      raise ValueError("unsupported: mlp_bias=True")
    if architecture == "llama" and hf.get("attention_bias", False):
      raise ValueError("unsupported: Llama attention_bias=True (it also adds an o_proj bias)")
    if architecture == "qwen2" and hf.get("use_sliding_window", False):
      raise ValueError("unsupported: sliding-window attention (use_sliding_window=True)")
    # transformers 5 writes `rope_parameters` (with rope_theta inside); 4.x writes `rope_scaling`
    # and a top-level `rope_theta`.
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope_theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3":
      rope_scaling = Llama3RopeScaling(
          factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
          high_freq_factor=float(rope["high_freq_factor"]),
          original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
    elif rope_type == "default":
      rope_scaling = None
    else:
      raise ValueError(f"unsupported rope_type {rope_type!r}: only 'default' and 'llama3'")
    num_heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // num_heads
    hf_dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    dtype = hf_dtype if hf_dtype in _DTYPES else "float32"
    fields = dict(
        architecture=architecture,
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
        # Qwen2 always has q/k/v biases; Llama has none (attention_bias=True is refused above).
        qkv_bias=architecture == "qwen2",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        dtype=dtype,
        param_dtype=dtype,
    )
    return cls(**{**fields, **overrides})

  def to_hf_config(self) -> dict[str, Any]:
    """The HF `config.json` fields for this config (loadable by transformers 4.x and 5.x)."""
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
    if self.architecture == "llama":
      if self.qkv_bias:
        raise ValueError("a Llama checkpoint cannot hold q/k/v biases alone; set qkv_bias=False")
      hf.update(attention_bias=False, mlp_bias=False)
    elif not self.qkv_bias:
      raise ValueError("a Qwen2 checkpoint always has q/k/v biases; set qkv_bias=True")
    else:
      hf.update(use_sliding_window=False, sliding_window=None)
    return hf
