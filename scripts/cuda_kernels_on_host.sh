#!/usr/bin/env bash
# Some of the CUDA backend's kernel bodies run on the CPU, without a GPU: src/device/cuda/kernels/*.cu (their
# extern "C" launchers removed) are compiled as plain C++ with CU_LOOP as a sequential loop and host shims for
# the intrinsics they use (__float_as_uint, __uint_as_float, __umulhi; inert ones for threadIdx, __shared__,
# __syncthreads, atomics and the warp shuffles of kernels not checked here), then checked against the CPU's
# own definitions by tests/backend/test_cuda_kernels_host.cpp: Philox-4x32-10, the f16 / bf16 conversions
# (and cu_ew16's casts), DROPOUT, the f32 attention with dropout and TP head offsets, the eager half
# attention's parallel backward against its serial reference, RoPE's half numerics, the vocabulary-parallel
# ops. Kernels that need warps, shared memory or atomics compile against inert shims and are not checked. This checks the arithmetic and indexing of those bodies as written; it does
# not check launches, memory, warps or nvcc's code generation (--fmad=false is mirrored by
# -ffp-contract=off). Registered as test_cuda_kernels_host when the CUDA backend is built.
#
# Usage: scripts/cuda_kernels_on_host.sh OUT_DIR [CXX] [CUDA_INCLUDE_DIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: cuda_kernels_on_host.sh OUT_DIR [CXX] [CUDA_INCLUDE_DIR]}
cxx=${2:-g++}
cuda_inc=${3:-/usr/local/cuda/include}
cc=${CC:-gcc}
mkdir -p "$out"
python3 - "$src/src/device/cuda/kernels/" "$out" <<'PY'
import re, sys
kd, out = sys.argv[1], sys.argv[2]
def strip_launchers(s):  # drop the extern "C" launchers (<<<>>> is nvcc's syntax)
    res, lines, i = [], s.split('\n'), 0
    while i < len(lines):
        if lines[i].startswith('extern "C"'):
            while lines[i] != '}':
                i += 1
            i += 1
            continue
        res.append(lines[i])
        i += 1
    return '\n'.join(res)
c = open(kd + 'common.cuh').read()
c = c.replace('#include <cuda_runtime.h>\n', '')
c = re.sub(r'#define CU_LOOP\(i, n\).*\n', '', c)
c = re.sub(r'__device__ __forceinline__ float warp_(sum|max).*?\n}\n', '', c, flags=re.S)
open(out + '/common_host.h', 'w').write(c)
for name in ['attention', 'attention_half', 'dropout', 'elementwise', 'llama', 'loss']:
    s = open(kd + name + '.cu').read().replace('#include "common.cuh"', '')
    s = s.replace('#include "attention_half.cuh"', '#include "%sattention_half.cuh"' % kd)
    open(out + '/' + name + '.inc', 'w').write(strip_launchers(s))
PY
"$cc" -std=gnu11 -O2 -ffp-contract=off -I"$src/include" -I"$src/src" -c "$src/src/base/rng.c" -o "$out/rng.o"
"$cxx" -std=c++17 -O2 -ffp-contract=off -Wall -Wextra -Wno-unused-function -I"$out" -I"$src/include" \
  -I"$src/src" -I"$cuda_inc" "$src/tests/backend/test_cuda_kernels_host.cpp" "$out/rng.o" -o "$out/check"
"$out/check"
