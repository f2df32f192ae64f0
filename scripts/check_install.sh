#!/usr/bin/env bash
# The installed library is usable on its own: `cmake --install` into a fresh prefix, then build examples/
# against that prefix only (CMake find_package with the shared and the static library; pkg-config through
# an example's Makefile; pkg-config --static), check the installed headers, and run everything on tiny
# inputs (the HF fixture tests/fixtures/hf/llama; a slice of data/tinyshakespeare.txt).
# usage: scripts/check_install.sh [BUILD_DIR]     (default: build; must be built already)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
tmp=$(mktemp -d /tmp/suanli-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
say() { echo "check_install: $*"; }
fail() { echo "check_install: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
libdir=$(dirname "$(find "$prefix" -name libsuanli.a | head -1)")
for f in "$prefix/bin/suanli" "$libdir/libsuanli.a" "$libdir/libsuanli.so" "$prefix/include/suanli/suanli.h" \
  "$prefix/include/suanli/version.h" "$libdir/pkgconfig/suanli.pc" "$libdir/cmake/suanli/suanliConfig.cmake"; do
  [ -e "$f" ] || fail "not installed: ${f#"$prefix"/}"
done
say "installed into $prefix ($(find "$prefix" -type f | wc -l) files)"

# the installed headers alone (no source tree on the include path)
bash "$root/tests/unit/check_headers.sh" "$prefix/include" || fail "installed headers"

# CMake: the examples against the prefix only (no package registry, no source tree)
cmake_ex() { # name, extra cmake args...
  local dir=$tmp/$1
  shift
  cmake -S "$root/examples" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" "$@" >"$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "configure examples ($*)"; }
  grep -q "^suanli_DIR:PATH=$libdir/cmake/suanli$" "$dir/CMakeCache.txt" || fail "examples found suanli outside $prefix"
  cmake --build "$dir" -j2 >>"$dir.log" 2>&1 || { cat "$dir.log"; fail "build examples ($*)"; }
}
cmake_ex ex-shared
cmake_ex ex-static -DSUANLI_STATIC=ON
# grep without -q: under pipefail, grep -q quitting at the first match can SIGPIPE ldd and fail the pipeline
ldd "$tmp/ex-shared/generate_hf/generate_hf" | grep "libsuanli.so.*$libdir" >/dev/null || fail "generate_hf does not use $libdir/libsuanli.so"
ldd "$tmp/ex-static/generate_hf/generate_hf" | grep libsuanli >/dev/null && fail "the static build links libsuanli.so"
say "examples built with find_package(suanli) (shared and static)"

# pkg-config: an example's Makefile (shared), and one static one-liner
export PKG_CONFIG_PATH=$libdir/pkgconfig
cp -r "$root/examples/generate_hf" "$tmp/mk"
make -s -C "$tmp/mk" CFLAGS="-O2 -Wall -Wextra -Werror" >"$tmp/mk.log" 2>&1 || { cat "$tmp/mk.log"; fail "make (pkg-config)"; }
cc -O2 -Wall -Wextra -Werror "$root/examples/train_tiny/train_tiny.c" -o "$tmp/train_tiny_pc_static" \
  $(pkg-config --cflags suanli) $(pkg-config --static --libs suanli | sed 's/-lsuanli\b/-l:libsuanli.a/') ||
  fail "pkg-config --static one-liner"
say "examples built with pkg-config (Makefile, shared; --static one-liner)"

# run: generate from the HF fixture (random tiny Llama: the text is noise, the counts are not)
fixture=$root/tests/fixtures/hf/llama
for exe in "$tmp/ex-shared/generate_hf/generate_hf" "$tmp/ex-static/generate_hf/generate_hf" "$tmp/mk/generate_hf"; do
  OMP_NUM_THREADS=2 "$exe" "$fixture" "Hello world" 12 >"$tmp/gen.out" 2>"$tmp/gen.err" || { cat "$tmp/gen.err"; fail "$exe exited $?"; }
  grep -q "^Hello world" "$tmp/gen.out" || fail "$exe: the output does not continue the prompt"
  grep -Eq "generated (12 tokens|[0-9]+ tokens .*stopped at eos)" "$tmp/gen.err" || { cat "$tmp/gen.err"; fail "$exe: no generation summary"; }
done
grep -qx "suanli $(pkg-config --modversion suanli)" "$tmp/gen.err" || fail "sl_version() is not the version of suanli.pc"
say "$(tail -1 "$tmp/gen.err")"

# run: train on a slice of tinyshakespeare to step 40 (checkpoints at 20 and 40; the validation loss must
# drop), then again on the same dir to step 60, which must resume from step 40; the CLI reads the saved model
head -c 200000 "$root/data/tinyshakespeare.txt" >"$tmp/text.txt"
for exe in "$tmp/ex-shared/train_tiny/train_tiny" "$tmp/train_tiny_pc_static"; do
  rm -rf "$tmp/run"
  OMP_NUM_THREADS=2 "$exe" "$tmp/text.txt" "$tmp/run" 40 20 >"$tmp/train1.out" 2>&1 || { cat "$tmp/train1.out"; fail "$exe exited"; }
  grep -q "resumed from" "$tmp/train1.out" && { cat "$tmp/train1.out"; fail "$exe: the first run resumed"; }
  line1=$(grep "^train_tiny: val loss" "$tmp/train1.out") || { cat "$tmp/train1.out"; fail "$exe: no val loss line"; }
  awk '{ if (!($6 < $4 && $6 < 4.5)) exit 1 }' <<<"$line1" || { cat "$tmp/train1.out"; fail "$exe: $line1"; }
  [ -s "$tmp/run/model/step-0000040/manifest.json" ] || fail "$exe: no checkpoint step-0000040"
  OMP_NUM_THREADS=2 "$exe" "$tmp/text.txt" "$tmp/run" 60 20 >"$tmp/train2.out" 2>&1 ||
    { cat "$tmp/train2.out"; fail "$exe: the second run exited"; }
  grep -qx "train_tiny: resumed from step 40" "$tmp/train2.out" || { cat "$tmp/train2.out"; fail "$exe: no resume"; }
  grep -Eq "^step +41/60 " "$tmp/train2.out" && ! grep -Eq "^step +([0-9]|[1-3][0-9]|40)/60 " "$tmp/train2.out" ||
    { cat "$tmp/train2.out"; fail "$exe: the resumed run did not start at step 41"; }
  line2=$(grep "^train_tiny: val loss" "$tmp/train2.out") || { cat "$tmp/train2.out"; fail "$exe: no val loss line"; }
  awk -v v1="$(awk '{ print $6 }' <<<"$line1")" '{ if (!($6 < v1)) exit 1 }' <<<"$line2" ||
    { cat "$tmp/train2.out"; fail "$exe: the resumed run's val loss did not fall below $line1: $line2"; }
  [ -s "$tmp/run/model/model.safetensors" ] || fail "$exe: no model.safetensors"
done
say "train_tiny: ${line1#train_tiny: }; resumed from step 40: ${line2#train_tiny: }"
"$prefix/bin/suanli" generate --load "$tmp/run/model" --prompt "ROMEO:" --max-new-tokens 16 --seed 1 \
  >"$tmp/cli.out" 2>&1 || { cat "$tmp/cli.out"; fail "installed suanli generate --load"; }
grep -q "ROMEO:" "$tmp/cli.out" || fail "installed CLI: no sample"
say "OK"
