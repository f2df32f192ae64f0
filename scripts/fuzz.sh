#!/usr/bin/env bash
# libFuzzer targets (tests/fuzz) built with clang, ASan and UBSan, run one at a time from their committed
# seed corpora and dictionaries.
#   scripts/fuzz.sh                 each target for SL_FUZZ_SECONDS (20) seconds: the CI run (ctest -L fuzz)
#   scripts/fuzz.sh --long [N]      each target for N executions (default 1000000), nice -n 10; prints one
#                                   line per target (executions, seconds, exec/s, corpus size, crashes)
#   scripts/fuzz.sh --long N T...   only the named targets
# Crashes are kept in build-fuzz/fuzz-artifacts/TARGET/ (libFuzzer's crash-*/leak-*/timeout-* files); the
# fix commits the input into tests/fuzz/corpus/NAME/ as a regression seed. Results: docs/FUZZING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(fuzz_safetensors fuzz_manifest fuzz_tokenizer fuzz_sp_model fuzz_shard fuzz_hf_config fuzz_config_flags
         fuzz_prompt fuzz_comm_wire)
corpus_of() { local t=${1#fuzz_}; echo "$t"; }
long=0 runs=1000000
if [[ ${1:-} == --long ]]; then
  long=1
  shift
  if [[ ${1:-} =~ ^[0-9]+$ ]]; then runs=$1; shift; fi
  if [[ $# -gt 0 ]]; then targets=("$@"); fi
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--long [N] [TARGET...]]" >&2
  exit 2
fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSL_BUILD_TESTS=OFF \
  -DSL_BUILD_BENCH=OFF -DSL_FUZZ=ON -DSL_WERROR=OFF ${CMAKE_C_COMPILER_LAUNCHER:+-DCMAKE_C_COMPILER_LAUNCHER=$CMAKE_C_COMPILER_LAUNCHER} >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"
if [[ $long == 0 ]]; then
  (cd build-fuzz && ctest --output-on-failure -L fuzz)
  exit
fi
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
printf '%-18s %10s %8s %8s %7s %s\n' target executions seconds exec/s corpus crashes
fail=0
for t in "${targets[@]}"; do
  c=$(corpus_of "$t")
  work=build-fuzz/fuzz-long-$c art=build-fuzz/fuzz-artifacts/$t
  mkdir -p "$work" "$art"
  cp -n tests/fuzz/corpus/"$c"/* "$work"/ 2>/dev/null || true
  dict=()
  [[ -f tests/fuzz/dict/$c.dict ]] && dict=(-dict=tests/fuzz/dict/$c.dict)
  log=build-fuzz/fuzz-long-$t.log
  t0=$(date +%s.%N)
  rc=0
  nice -n 10 build-fuzz/tests/fuzz/"$t" -runs="$runs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$art"/ "${dict[@]}" "$work" >"$log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", b-a}')
  ncorp=$(find "$work" -type f | wc -l)
  crashes=$(find "$art" -type f | wc -l)
  printf '%-18s %10s %8s %8s %7s %s\n' "$t" "${execs:-?}" "$secs" \
    "$(awk -v e="${execs:-0}" -v s="$secs" 'BEGIN{printf "%.0f", (s > 0 ? e / s : 0)}')" "$ncorp" \
    "$crashes$([[ $rc != 0 ]] && echo " (exit $rc: $log)")"
  [[ $rc != 0 ]] && fail=1
done
exit $fail
