#!/usr/bin/env bash
# Install the Debian 12 packages suanli needs (only those missing). Run as root.
set -euo pipefail
# demo: only what building and training needs; tests: also MPI (OpenMPI, and MPICH beside it), Slurm + munge (tests/comm/slurm_local.sh), netns tools, clang/libFuzzer, SIMDe, OpenCL (ICD loader + headers, PoCL's CPU device)
core=(build-essential cmake ninja-build pkg-config libcjson-dev libxxhash-dev libpcre2-dev libutf8proc-dev)
pkgs=(build-essential cmake ninja-build pkg-config libcjson-dev libxxhash-dev libpcre2-dev libutf8proc-dev openmpi-bin libopenmpi-dev mpich libmpich-dev slurm-wlm munge iproute2 libsimde-dev clang libclang-rt-14-dev libomp-14-dev ocl-icd-opencl-dev pocl-opencl-icd)
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
