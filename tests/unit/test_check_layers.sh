#!/usr/bin/env bash
# scripts/check_layers.sh passes on the tree and catches injected upward, sideways, relative and
# unmapped-folder includes in a copy of it. Usage: test_check_layers.sh SOURCE_DIR
set -uo pipefail
src="${1:?usage: test_check_layers.sh SOURCE_DIR}"
check="$src/scripts/check_layers.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

out=$(bash "$check" "$src" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    echo "FAIL: check_layers on the tree exited $rc:"
    echo "$out"
    fail=1
fi

# expect NAME FILE LINE PATTERN: inject LINE at the end of FILE in a fresh copy, expect exit 1 and PATTERN
expect() {
    local name=$1 file=$2 line=$3 pattern=$4
    rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cp -r "$src/src" "$src/include" "$tmp/tree/"
    mkdir -p "$(dirname "$tmp/tree/$file")"
    printf '%s\n' "$line" >>"$tmp/tree/$file"
    local o r
    o=$(bash "$check" "$tmp/tree" 2>&1)
    r=$?
    if [ $r -ne 1 ] || ! grep -qF -- "$pattern" <<<"$o"; then
        echo "FAIL ($name): exit $r, expected 1 and a line containing: $pattern"
        echo "$o"
        fail=1
    else
        echo "ok ($name): $(grep -F -- "$pattern" <<<"$o" | head -1)"
    fi
}

expect upward src/formats/safetensors.c '#include "suanli/nn.h"' \
    'LAYER VIOLATION src/formats/safetensors.c:'
expect upward-message src/formats/safetensors.c '#include "suanli/nn.h"' \
    'includes suanli/nn.h (layer nn) from layer formats: upward'
expect sideways src/data/loader.c '#include "suanli/safetensors.h"' \
    'includes suanli/safetensors.h (layer formats) from layer data: sideways'
expect private-header src/parallel/dp.c '#include "ckpt/ckpt_internal.h"' \
    'includes ckpt/ckpt_internal.h (layer ckpt) from layer parallel: upward'
expect relative src/nn/llama.c '#include "../parallel/dp_internal.h"' \
    'includes src/parallel/dp_internal.h (layer parallel) from layer nn: upward'
expect public-header include/suanli/hf.h '#include "suanli/nn.h"' \
    'include/suanli/hf.h:'
expect unmapped-folder src/newlayer/x.c '#include "suanli/base.h"' \
    'src/newlayer: folder has no layer'
expect unmapped-header include/suanli/newthing.h '/* new */' \
    'public header suanli/newthing.h has no layer'
exit $fail
