#!/usr/bin/env bash
# Install the Debian 12 packages suanli needs (only those missing). Run as root.
set -euo pipefail
[ $# = 0 ] || [ "$*" = demo ] || { echo "usage: $0 [demo]" >&2; exit 2; }
# demo: only what building and training needs; tests: also a CUDA toolkit (below) and MPI (OpenMPI, and MPICH beside it), Slurm + munge (tests/comm/slurm_local.sh), netns tools, clang/libFuzzer, SIMDe, OpenCL (ICD loader + headers, PoCL's CPU device)
core=(build-essential cmake ninja-build pkg-config libcjson-dev libxxhash-dev libpcre2-dev libutf8proc-dev libisal-dev libhwloc-dev)
pkgs=(build-essential cmake ninja-build pkg-config libcjson-dev libxxhash-dev libpcre2-dev libutf8proc-dev libisal-dev libhwloc-dev openmpi-bin libopenmpi-dev mpich libmpich-dev slurm-wlm munge iproute2 libsimde-dev clang libclang-rt-14-dev libomp-14-dev ocl-icd-opencl-dev pocl-opencl-icd)
[ "${1:-}" = demo ] && pkgs=("${core[@]}")
[ "${SL_BENCH_DEPS:-0}" = 1 ] && pkgs+=(libopenblas-dev libdnnl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# CUDA toolkit for building the CUDA backend (tests only; SL_CUDA=0 skips it): reuses a complete
# /usr/local/cuda, else installs NVIDIA's CUDA 13.0 PyPI wheels into /opt/suanli-cuda (721 MB download,
# 7 s measured; scripts/cuda_toolkit.sh). A failed download only leaves the backend unbuilt (SL_CUDA=AUTO).
if [ "${1:-}" != demo ] && [ "${SL_CUDA:-1}" != 0 ] && [ "${SL_CUDA:-1}" != OFF ]; then
  bash "$(dirname "$0")/cuda_toolkit.sh" >/dev/null || echo "deps.sh: no CUDA toolkit (scripts/cuda_toolkit.sh failed); the CUDA backend will not be built" >&2
fi
