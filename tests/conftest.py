"""Test-wide JAX settings, applied once before JAX starts.

Eight fake CPU devices in the test process let the sharding tests build real meshes; float32 matmuls run at full
precision so parity tests compare like with like; a persistent compilation cache cuts repeated
compiles across test runs and across the runs the tests start (every program, however quick to
compile: the many small ones of a run's start add up to seconds per run). The tests' programs
are tiny, so compiling them costs more than running them: XLA's CPU backend compiles them
unoptimised (`--xla_backend_optimization_level=0`) and emits its fusions with the elemental
emitter rather than the MLIR fusion emitters (`--xla_cpu_use_fusion_emitters=false`, which
compiles the sampler's programs in about half the time), in this process and in the runs it
starts. The tolerances are the dtype's rounding either way.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".jax_cache"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for _flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"):
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), _flag]).strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

# The test processes get eight devices; the runs they start in subprocesses (run.py, the
# experiment scripts) see the one CPU device a laptop has, unless a test asks for more
# (JAX_NUM_CPU_DEVICES in the child's environment, as the mesh and multi-process tests do).
if "JAX_NUM_CPU_DEVICES" not in os.environ:
  jax.config.update("jax_num_cpu_devices", 8)


# The longest file (a warm start, then a run over two processes on a mesh) starts first,
# so that the other worker runs the other long files beside it.
LONGEST_FILE = os.path.join("training", "test_mesh_loop.py")


def pytest_collection_modifyitems(config, items):
  """`LONGEST_FILE` runs first, then the files that hold a `slow` test, in their collected order
  otherwise: with the README's `--dist loadfile --no-loadscope-reorder` the two workers start on
  the long files and the many short ones fill in at the end, instead of one long file running
  alone last."""
  del config
  slow_files = {item.path for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: (not str(item.path).endswith(LONGEST_FILE),
                               item.path not in slow_files))
