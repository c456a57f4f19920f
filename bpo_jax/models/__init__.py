"""The policy model: Llama 3.x / Qwen2.5 decoder in Flax NNX, KV cache, HF checkpoints."""

from bpo_jax.models.config import Llama3RopeScaling
from bpo_jax.models.config import ModelConfig
from bpo_jax.models.decoder import Decoder
from bpo_jax.models.decoder import forward
from bpo_jax.models.decoder import KVCache
from bpo_jax.models.decoder import logprobs_and_entropy_from_logits
from bpo_jax.models.decoder import rope_inverse_frequencies
from bpo_jax.models.decoder import token_logprobs_and_entropy
from bpo_jax.models.params import CheckpointError
from bpo_jax.models.params import hf_tensors
from bpo_jax.models.params import load_hf_checkpoint
from bpo_jax.models.params import load_tokenizer
from bpo_jax.models.params import parameter_names
from bpo_jax.models.params import save_hf_checkpoint
