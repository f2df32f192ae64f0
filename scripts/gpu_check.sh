#!/usr/bin/env bash
# The CUDA backend on a real GPU: build with SL_CUDA=ON, run the conformance suite on "cuda", then
# `suanli bench train --device cuda` for GPT-2 124M at B=16 T=1024 in bf16 (mixed) and in fp32 with TF32
# GEMMs (SUANLI_CUDA_TF32=1), printing one JSON line per run with tokens/s and MFU against the datasheet
# peaks of an H200 SXM (dense: bf16 989, TF32 494, FP32 67 TFLOP/s; override with SL_PEAK_BF16_TFLOPS,
# SL_PEAK_TF32_TFLOPS for another GPU). Fails clearly (exit 1) when no NVIDIA GPU is usable.
#
# Usage: scripts/gpu_check.sh [BUILD_DIR]   (default build-gpu)
#   SL_GPU_STEPS   timed steps per bench run (default 10), SL_GPU_SKIP_BENCH=1 only runs the suite,
#   SL_GPU_FP32=1  also a run with exact fp32 GEMMs (MFU against the FP32 peak, SL_PEAK_FP32_TFLOPS)
# Depends on `bench train --device` (bench/bench_train.c); without it the bench step fails with the
# flag parser's message.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
steps=${SL_GPU_STEPS:-10}

fail() { echo "gpu_check: FAIL: $*" >&2; exit 1; }

# 1. a GPU and a driver
if ! command -v nvidia-smi >/dev/null 2>&1; then
  fail "no nvidia-smi: this machine has no NVIDIA driver (the CUDA backend's tests skip here; run this on a GPU machine)"
fi
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1) ||
  fail "nvidia-smi found no GPU"
[ -n "$gpu" ] || fail "nvidia-smi lists no GPU"
echo "gpu_check: $gpu"

# 2. toolkit + build (library, CLI, tests)
cuda_home=$(bash scripts/cuda_toolkit.sh | sed -n 's/^CUDA_HOME=//p')
[ -n "$cuda_home" ] || fail "scripts/cuda_toolkit.sh found or installed no toolkit"
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSL_WERROR=ON -DSL_CUDA=ON \
  -DSL_CUDA_HOME="$cuda_home" >/dev/null
cmake --build "$build" -j "$(nproc)" --target suanli_cli test_backend_cpu
echo "gpu_check: built in $(( $(date +%s) - t0 )) s"

# 3. conformance suite on cuda: 77 (skipped: "no device") is a failure here
set +e
"$build/tests/backend/test_backend_cpu" cuda
rc=$?
set -e
[ $rc -eq 77 ] && fail "the conformance suite skipped: the CUDA backend found no device although nvidia-smi lists '$gpu' (driver too old for CUDA $("$cuda_home/bin/nvcc" --version | grep -o 'release [0-9.]*')?)"
[ $rc -eq 0 ] || fail "conformance suite on cuda failed (exit $rc)"
echo "gpu_check: conformance suite on cuda passed"
[ "${SL_GPU_SKIP_BENCH:-0}" = 1 ] && exit 0

# 4. bench train: GPT-2 124M, B=16, T=1024, one JSON line per precision
cli=$build/suanli
bench() { # $1: precision label, $2: peak TFLOP/s, $3: SUANLI_CUDA_TF32, rest: extra bench flags
  local label=$1 peak=$2 tf32=$3 out
  shift 3
  out=$(SUANLI_CUDA_TF32=$tf32 "$cli" bench train --device cuda --micro-batch-size 16 --seq-length 1024 \
        --steps "$steps" --warmup 2 --json "$@") ||
    fail "bench train --device cuda ($label) failed (it needs bench train --device, bench/bench_train.c)"
  echo "$out" | python3 -c '
import json, sys
label, peak, gpu = sys.argv[1], float(sys.argv[2]), sys.argv[3]
r = [json.loads(l) for l in sys.stdin if l.startswith("{") and "\"train\"" in l][0]
print(json.dumps({"check": "gpu_bench_train", "gpu": gpu, "precision": label, "B": r["B"], "T": r["T"],
                  "ms_per_step": r["ms_per_step"], "tokens_per_s": r["tokens_per_s"],
                  "achieved_tflops": round(r["gflops"] / 1e3, 2), "peak_tflops": peak,
                  "mfu": round(r["gflops"] / (peak * 1e3), 4), "loss": r["loss"]}))' "$label" "$peak" "$gpu"
}
bench bf16 "${SL_PEAK_BF16_TFLOPS:-989}" 0 --bf16
bench tf32 "${SL_PEAK_TF32_TFLOPS:-494}" 1
[ "${SL_GPU_FP32:-0}" = 1 ] && bench fp32 "${SL_PEAK_FP32_TFLOPS:-67}" 0
exit 0
