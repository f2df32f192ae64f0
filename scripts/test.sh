#!/usr/bin/env bash
# The whole test suite: release build (-Werror) and an ASan+UBSan build, each running every ctest label.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/check_layers.sh  # includes point down the layers (DESIGN.md section 1)
jobs=$(nproc)
supp="$(pwd)/scripts/lsan.supp" # LeakSanitizer: third-party suppressions only
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSL_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs" -E '^check_install$')
# the installed library on its own: cmake --install into a temp prefix, build and run examples/ against it
bash scripts/check_install.sh build
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSL_WERROR=ON -DSL_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 LSAN_OPTIONS=suppressions=$supp UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs")
# libFuzzer targets (tests/fuzz, ASan + UBSan), briefly (clang); scripts/fuzz.sh --long for the long run
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSL_BUILD_TESTS=OFF -DSL_FUZZ=ON -DSL_WERROR=OFF >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_safetensors fuzz_manifest fuzz_tokenizer fuzz_sp_model fuzz_shard \
  fuzz_hf_config fuzz_config_flags fuzz_prompt fuzz_comm_wire
(cd build-fuzz && ctest --output-on-failure -L fuzz)
