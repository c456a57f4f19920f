"""The policy model: Llama 3.x / Qwen2.5 / Qwen3 decoder in Flax NNX, KV cache, HF checkpoints,
LoRA adapters.

  model, config = load_hf_checkpoint("path/to/Qwen2.5-0.5B-Instruct")   # or Decoder(config, rngs=…)
  tokenizer = load_tokenizer("path/to/Qwen2.5-0.5B-Instruct")
  graphdef, state = nnx.split(model)
  logits, _ = jax.jit(forward, static_argnums=0)(graphdef, state, tokens)        # [B, T, V]
  logprobs, entropies = token_logprobs_and_entropy(graphdef, state, tokens, targets,
                                                   positions=…, attention_mask=…)  # packed trees
  save_hf_checkpoint(model, "out/", max_shard_bytes=5 * 2**30,
                     generation_config=read_generation_config("path/to/Qwen2.5-0.5B-Instruct"))

LoRA: `load_hf_checkpoint(path, lora_rank=16)` (or `ModelConfig(lora_rank=16)`) adds adapters;
`LoRAParam` selects them (`nnx.Optimizer(model, tx, wrt=LoRAParam)`, `split_lora(state)`),
`merge_lora` folds them into the kernels and `save_hf_checkpoint` saves a LoRA model merged.

Sampling (prefill, decode loop, fork, continued prefill) lives in `bpo_jax.sampling`.
"""

from bpo_jax.models.config import Llama3RopeScaling
from bpo_jax.models.config import ModelConfig
from bpo_jax.models.decoder import Decoder
from bpo_jax.models.decoder import forward
from bpo_jax.models.decoder import ForwardOptions
from bpo_jax.models.decoder import logprobs_and_entropy_from_logits
from bpo_jax.models.decoder import rope_inverse_frequencies
from bpo_jax.models.decoder import token_logprobs_and_entropy
from bpo_jax.models.kv_cache import KVCache
from bpo_jax.models.lora import BASE_PARAMS
from bpo_jax.models.lora import LoRAParam
from bpo_jax.models.lora import merge_lora
from bpo_jax.models.lora import split_lora
from bpo_jax.models.lora import trainable_filter
from bpo_jax.models.params import CheckpointError
from bpo_jax.models.params import hf_tensors
from bpo_jax.models.params import load_hf_checkpoint
from bpo_jax.models.params import load_tokenizer
from bpo_jax.models.params import merged_model
from bpo_jax.models.params import parameter_names
from bpo_jax.models.params import read_generation_config
from bpo_jax.models.params import save_hf_checkpoint
