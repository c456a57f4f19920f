"""Tiny random Hugging Face checkpoints of each supported family, built with transformers.

Parity tests compare the NNX decoder against transformers' PyTorch models on these (no
downloads): `make_hf_checkpoint(variant, path)` builds one with `save_pretrained` and returns
the PyTorch model. Norm weights and biases are drawn at random too (transformers initialises
them to one and zero), so a wrongly mapped norm or bias would show in the logits.

Variants: Qwen2 (q/k/v biases) tied and untied; Qwen3 (per-head q/k norms, head_dim 24, not
hidden / heads = 8) untied and tied; Llama 3.1 (untied) and 3.2 (tied) with Llama 3 RoPE
scaling over an original context of 16, so a 40-token prompt reaches every branch of the
frequency rescaling (kept, blended and stretched frequencies).
"""

import numpy as np
import torch
import transformers

VOCAB = 97
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
               max_position_embeddings=128, bos_token_id=1, eos_token_id=[2, 3])
_LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=16, rope_theta=500000.0)

# variant -> (config class, model class, fields beyond the common ones)
VARIANTS = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=True)),
    "qwen2-untied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                     dict(tie_word_embeddings=False)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(tie_word_embeddings=False, head_dim=24)),
    "qwen3-tied": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                   dict(tie_word_embeddings=True, head_dim=24)),
    "llama3.1": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                 dict(tie_word_embeddings=False, rope_parameters=_LLAMA3_ROPE,
                      rms_norm_eps=1e-5)),
    "llama3.2": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                 dict(tie_word_embeddings=True, rope_parameters=_LLAMA3_ROPE,
                      rms_norm_eps=1e-5)),
}


def family(variant: str) -> str:
  """The `model_type` of a variant: "qwen2", "qwen3" or "llama"."""
  return variant.split("-")[0].split(".")[0].replace("llama3", "llama")


def hf_config(variant: str, **overrides):
  config_class, _, fields = VARIANTS[variant]
  return config_class(**{**_COMMON, **fields, **overrides})


def make_hf_checkpoint(variant: str, path: str, *, seed: int = 0, dtype=torch.float32,
                       max_shard_size=None, **overrides):
  """Builds a random `variant` model, saves it to `path` (sharded past `max_shard_size`, e.g.
  "30KB"), and returns it in eval mode."""
  torch.manual_seed(seed)
  _, model_class, _ = VARIANTS[variant]
  model = model_class(hf_config(variant, **overrides)).eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      if name.endswith("norm.weight"):
        parameter.normal_(1.0, 0.3)
      elif name.endswith("bias"):
        parameter.normal_(0.0, 0.2)
  model = model.to(dtype)
  kwargs = {} if max_shard_size is None else dict(max_shard_size=max_shard_size)
  model.save_pretrained(path, **kwargs)
  return model


def hf_logits(model, tokens):
  """transformers' float32 logits [B, T, V] of token ids [B, T] (a numpy array)."""
  with torch.no_grad():
    return model(torch.as_tensor(np.array(tokens))).logits.float().numpy()
