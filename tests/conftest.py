"""Test-wide JAX settings, applied once before JAX starts.

Eight fake CPU devices let the sharding tests build real meshes; float32 matmuls run at full
precision so parity tests compare like with like; a persistent compilation cache cuts repeated
compiles across test runs.
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".jax_cache"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
