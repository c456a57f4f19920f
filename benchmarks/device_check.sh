#!/usr/bin/env bash
# The accelerator check of a pretrained checkpoint's shape, for an NVIDIA GPU host, in about
# eight minutes; everything it measures goes to OUT_DIR.
#
#   bash benchmarks/device_check.sh OUT_DIR
#
# 1. the host: nvidia-smi's GPU, JAX's devices (refuses to go on without a JAX GPU backend);
#    then, where pytest imports, the paged cache's tests with the Pallas op itself on the GPU
#    (paged_tests.txt);
# 2. the Qwen2.5-0.5B shape (24 layers, vocabulary 151,936, bfloat16 random weights, rank-16
#    adapters, rooms_qwen2_5's trees), BPO then GRPO, two iterations each (the first compiles):
#    qwen2_5_0_5b.json (pretrained_iteration.py --json: compile seconds per program, compiles in
#    the timed iteration, per-phase times) and qwen2_5_0_5b.log (progress and each slow
#    compile as it happens: what a run cut by the time limit leaves);
# 3. figures.json: decode tokens/s against the memory-bandwidth bound, update tokens/s and
#    model-flops utilisation (device_figures.py);
# 4. with time left, the 0.5B shape again with a paged KV cache of 16-slot pages
#    (qwen2_5_0_5b_paged16.json and its figures), then the Qwen2.5-1.5B shape as in 2.
#
# DEVICE_CHECK_SECONDS sets the time budget (default 460); for a rehearsal of the script on a
# CPU host, DEVICE_CHECK_ALLOW_CPU=1 goes on without a GPU and DEVICE_CHECK_ARGS adds arguments
# to each benchmark run (e.g. "--shape=num_layers=1,vocab_size=4096 --tasks=2").
#
# The runs share a persistent compilation cache in OUT_DIR/jax_cache, so GRPO reads back what
# BPO compiled at the same shapes. Exit status: 0 when the 0.5B figures were written, 1 when its
# run failed or ran out of time (the log says how far it got), 2 for bad usage, 3 without a GPU.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: bash benchmarks/device_check.sh OUT_DIR" >&2
  exit 2
fi
out=$1
mkdir -p "$out" || { echo "error: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
budget=${DEVICE_CHECK_SECONDS:-460}  # the whole check's seconds, set-up included
start=$SECONDS

log() { echo "[device_check $((SECONDS - start)) s] $*" | tee -a "$out/device_check.log" >&2; }

chip=unknown
if nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    > "$out/gpu.txt" 2>&1; then
  chip=$(head -n 1 "$out/gpu.txt" | cut -d, -f1)
else
  log "nvidia-smi failed: $(head -n 1 "$out/gpu.txt")"
fi
python -c 'import jax, sys; print(jax.__version__, jax.devices()); sys.exit(jax.default_backend() != "gpu")' \
  > "$out/jax.txt" 2>&1
if [[ $? -ne 0 && -z "${DEVICE_CHECK_ALLOW_CPU:-}" ]]; then
  log "JAX has no GPU backend (install jax[cuda12]): $(tail -n 1 "$out/jax.txt")"
  exit 3
fi
log "GPU: $chip; $(cat "$out/jax.txt")"

if python -c 'import pytest' 2> /dev/null; then
  timeout 150 python -m pytest -q -p no:cacheprovider tests/models/test_paged.py \
    > "$out/paged_tests.txt" 2>&1
  log "paged cache tests (exit $?): $(tail -n 1 "$out/paged_tests.txt")"
else
  log "pytest does not import: the paged cache's tests were not run"
fi

# One preset's BPO and GRPO iterations within `seconds`, on a paged cache of `page` slots per
# page (0: the dense cache); 0 when its JSON was written.
measure() {
  local preset=$1 seconds=$2 page=${3:-0} name=${1//[.-]/_}
  [[ $page -gt 0 ]] && name="${name}_paged$page"
  log "$preset (page size $page): up to $seconds s"
  timeout --signal=INT --kill-after=20 "$seconds" \
    python benchmarks/pretrained_iteration.py --json --preset="$preset" --iterations=2 \
      --kv_page_size="$page" --compile_cache="$out/jax_cache" ${DEVICE_CHECK_ARGS:-} \
      > "$out/$name.json.part" 2> "$out/$name.log"
  local status=$?
  if [[ $status -ne 0 ]]; then
    log "$preset: failed or out of time (exit $status); the last lines of $name.log:"
    tail -n 5 "$out/$name.log" | tee -a "$out/device_check.log" >&2
    return 1
  fi
  mv "$out/$name.json.part" "$out/$name.json"
  python benchmarks/device_figures.py "$out/$name.json" "$chip" \
    > "$out/figures_$name.json" 2>> "$out/device_check.log"
  log "$preset: done; $(tr -d '\n ' < "$out/figures_$name.json" | cut -c 1-400)"
}

left=$((budget - (SECONDS - start)))
measure qwen2.5-0.5b "$left"
status=$?
[[ $status -eq 0 ]] && cp "$out/figures_qwen2_5_0_5b.json" "$out/figures.json"
left=$((budget - (SECONDS - start)))
if [[ $status -eq 0 && $left -gt 150 ]]; then
  measure qwen2.5-0.5b "$left" 16
else
  log "no time left for the paged cache ($left s)"
fi
left=$((budget - (SECONDS - start)))
if [[ $status -eq 0 && $left -gt 150 ]]; then
  measure qwen2.5-1.5b "$left"
else
  log "no time left for the 1.5B shape ($left s)"
fi
exit $status
