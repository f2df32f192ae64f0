#!/usr/bin/env bash
# Provide a CUDA toolkit (nvcc, cuda_runtime.h, libcudart, cuBLAS/cuBLASLt, NCCL) for building the CUDA
# backend (src/device/cuda, cmake/cuda.cmake), and print where it is.
#
# Debian 12 has no nvidia-cuda-toolkit candidate here, so the toolkit comes from NVIDIA's PyPI wheels. Only the
# CUDA 13 wheels carry nvcc itself (nvidia-cuda-nvcc-cu12 12.x holds ptxas and libnvvm but no nvcc or
# cicc), so the set is the CUDA 13.0 one, pinned to the versions below (the same set as /usr/local/cuda-13.0
# on the project's machines):
#   nvidia-cuda-nvcc (nvcc, ptxas, fatbinary, nvlink), nvidia-cuda-crt (crt/ headers), nvidia-nvvm (cicc,
#   libdevice), nvidia-cuda-runtime (headers, libcudart), nvidia-cublas (cuBLAS + cuBLASLt), nvidia-nccl-cu13.
# Measured 2026-12-01: 721 MB of wheels (cuBLAS 423, NCCL 196, nvvm 62, nvcc 37), 7 s to download here,
# ~1.7 GB installed. Running binaries built with CUDA 13 needs an NVIDIA driver >= 580.
#
# Usage: scripts/cuda_toolkit.sh [--print]   (idempotent; prints CUDA_HOME=... and the paths found)
#   SL_CUDA_HOME   use this toolkit instead (must have bin/nvcc, include/cuda_runtime.h, lib{,64}/libcudart*)
#   SL_CUDA_PREFIX where to install the wheels (default /opt/suanli-cuda)
#   SL_CUDA_REUSE  0: never reuse an existing /usr/local/cuda (default 1: reuse it when it is complete)
# The layout made under $SL_CUDA_PREFIX/cuda is CUDA_HOME-like: bin/ include/ lib64/ nvvm/, with the
# unversioned .so links (libcudart.so etc.) the wheels lack and NCCL's header and library linked in.
set -euo pipefail
[ $# = 0 ] || [ "$*" = --print ] || { echo "usage: $0 [--print]" >&2; exit 2; }
PREFIX=${SL_CUDA_PREFIX:-/opt/suanli-cuda}
WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96
        nvidia-cublas==13.1.0.3 nvidia-nccl-cu13==2.28.9)
STAMP_WANT="${WHEELS[*]}"

complete() { # $1: a CUDA_HOME candidate
  local h=$1
  [ -x "$h/bin/nvcc" ] && [ -f "$h/include/cuda_runtime.h" ] && [ -f "$h/include/cublas_v2.h" ] &&
    [ -f "$h/include/nccl.h" ] &&
    { [ -e "$h/lib64/libcudart.so" ] || [ -e "$h/lib/libcudart.so" ]; } &&
    { [ -e "$h/lib64/libcublasLt.so" ] || [ -e "$h/lib/libcublasLt.so" ]; } &&
    { [ -e "$h/lib64/libnccl.so" ] || [ -e "$h/lib/libnccl.so" ]; }
}

report() { # $1: CUDA_HOME
  local h=$1 lib=$1/lib64
  [ -d "$lib" ] || lib=$1/lib
  echo "CUDA_HOME=$h"
  echo "nvcc=$h/bin/nvcc ($("$h/bin/nvcc" --version | grep -o 'release [0-9.]*'))"
  echo "include=$h/include"
  echo "lib=$lib"
  for l in libcudart.so libcublas.so libcublasLt.so libnccl.so; do echo "  $l -> $(readlink -f "$lib/$l")"; done
  echo "cmake: -DSL_CUDA=ON -DSL_CUDA_HOME=$h"
}

if [ -n "${SL_CUDA_HOME:-}" ]; then
  complete "$SL_CUDA_HOME" || { echo "cuda_toolkit.sh: SL_CUDA_HOME=$SL_CUDA_HOME is not a complete toolkit" >&2; exit 1; }
  report "$SL_CUDA_HOME"
  exit 0
fi
if [ "${SL_CUDA_REUSE:-1}" = 1 ] && complete /usr/local/cuda; then
  report /usr/local/cuda
  exit 0
fi
HOME_DIR=$PREFIX/cuda
if [ -f "$PREFIX/.stamp" ] && [ "$(cat "$PREFIX/.stamp")" = "$STAMP_WANT" ] && complete "$HOME_DIR"; then
  report "$HOME_DIR"
  exit 0
fi

PY=${PYTHON:-python3}
"$PY" -m pip --version >/dev/null 2>&1 || { echo "cuda_toolkit.sh: needs python3 with pip" >&2; exit 1; }
echo "cuda_toolkit.sh: installing ${WHEELS[*]} into $PREFIX/site" >&2
rm -rf "$PREFIX/site.tmp"
mkdir -p "$PREFIX"
t0=$(date +%s)
"$PY" -m pip install --quiet --no-deps --no-compile --disable-pip-version-check --root-user-action=ignore --target "$PREFIX/site.tmp" "${WHEELS[@]}"
echo "cuda_toolkit.sh: installed in $(( $(date +%s) - t0 )) s ($(du -sh "$PREFIX/site.tmp" | cut -f1))" >&2
rm -rf "$PREFIX/site" "$HOME_DIR"
mv "$PREFIX/site.tmp" "$PREFIX/site"
CU=$PREFIX/site/nvidia/cu13   # every CUDA 13 wheel installs into this one tree
NC=$PREFIX/site/nvidia/nccl
[ -x "$CU/bin/nvcc" ] || { echo "cuda_toolkit.sh: no nvcc in $CU/bin (wheel layout changed?)" >&2; exit 1; }
chmod +x "$CU"/bin/* "$CU"/nvvm/bin/* 2>/dev/null || true
# CUDA_HOME-like view: the cu13 tree itself plus lib64, unversioned .so links and NCCL
ln -s "$CU" "$HOME_DIR"
[ -e "$CU/lib64" ] || ln -s lib "$CU/lib64"
for l in "$CU"/lib/lib*.so.[0-9]*; do
  base=${l##*/}
  ln -sf "$base" "$CU/lib/${base%%.so.*}.so"
done
ln -sf "$NC/include/nccl.h" "$CU/include/nccl.h"
ln -sf "$NC/lib/libnccl.so.2" "$CU/lib/libnccl.so.2"
ln -sf libnccl.so.2 "$CU/lib/libnccl.so"
echo "$STAMP_WANT" > "$PREFIX/.stamp"
complete "$HOME_DIR" || { echo "cuda_toolkit.sh: the installed toolkit in $HOME_DIR is incomplete" >&2; exit 1; }
report "$HOME_DIR"
