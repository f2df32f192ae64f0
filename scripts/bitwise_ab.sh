#!/usr/bin/env bash
# Final weights of short training runs, two suanli binaries, compared byte for byte: a change that claims to
# keep the arithmetic (a memory plan, a recomputation, a vectorized kernel with the same operation order)
# must give the same model.safetensors. Prints one line per case ("identical" or "DIFFER") and exits 1 if
# any differs.
#   scripts/bitwise_ab.sh OLD_SUANLI NEW_SUANLI
# e.g. git worktree add /tmp/old <commit> && cmake -S /tmp/old -B /tmp/old/build -G Ninja
#      -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/old/build --target suanli, then
#      scripts/bitwise_ab.sh /tmp/old/build/suanli build/suanli
# Cases: GPT-2 fp32, bf16, bf16 with two micro-batches, bf16 DP 2 ZeRO-1 and ZeRO-3; the Llama fixture fp32
# and bf16 (autocast numerics); Qwen2-MoE fp32, bf16, and bf16 with ep 2 x ZeRO-3 (its fixture with the
# Llama fixture's tokenizer). About two minutes on 2 cores.
set -uo pipefail
[[ $# -eq 2 ]] || {
  echo "usage: $0 OLD_SUANLI NEW_SUANLI" >&2
  exit 2
}
for b in "$1" "$2"; do [[ -f $b && -x $b ]] || {
  echo "$0: $b: not an executable" >&2
  exit 2
}; done
old=$(realpath "$1") new=$(realpath "$2")
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/suanli-bitwise-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 2
head -c 200000 "$root/data/tinyshakespeare.txt" >s.txt
prep() { "$new" data prepare --input s.txt "$@" >prep.log 2>&1 || { cat prep.log >&2; echo "$0: $new data prepare $* failed" >&2; exit 2; }; }
prep --output-prefix bytes
prep --output-prefix llama --tokenizer-file "$root/tests/fixtures/hf/llama/tokenizer.json"
cp -r "$root/tests/fixtures/hf/qwen2_moe" qmoe && cp "$root/tests/fixtures/hf/llama/tokenizer.json" qmoe/ || exit 2
bad=0
# case NAME LAUNCH DATA ARGS...: LAUNCH is "" or "run -n 2"
case_() {
  local name=$1 launch=$2 data=$3
  shift 3
  for v in old new; do
    local b=$old
    [[ $v == new ]] && b=$new
    local pre=()
    # shellcheck disable=SC2206 # LAUNCH splits into words
    [[ -n $launch ]] && pre=("$b" $launch --)
    if ! env SUANLI_COMM_ALGO=direct "${pre[@]}" "$b" train --data-path "$data" "$@" --save "$name-$v" \
      >"$name-$v.log" 2>&1; then
      echo "$name: $v run failed: $(tail -n 1 "$name-$v.log")"
      bad=1
      return
    fi
  done
  if cmp -s "$name-old/model.safetensors" "$name-new/model.safetensors"; then
    echo "$name: identical"
  else
    echo "$name: DIFFER"
    bad=1
  fi
}
G="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --train-iters 6 --eval-interval 1000"
case_ gpt2-fp32 "" bytes $G --micro-batch-size 4 --threads 2
case_ gpt2-bf16 "" bytes $G --micro-batch-size 4 --threads 2 --bf16
case_ gpt2-bf16-accum2 "" bytes $G --micro-batch-size 4 --global-batch-size 8 --threads 2 --bf16
case_ gpt2-bf16-dp2-zero1 "run -n 2" bytes $G --micro-batch-size 2 --threads 1 --bf16 --zero-stage 1
case_ gpt2-bf16-dp2-zero3 "run -n 2" bytes $G --micro-batch-size 2 --threads 1 --bf16 --zero-stage 3
L="--seq-length 32 --micro-batch-size 2 --train-iters 4 --eval-interval 1000"
case_ llama-fp32 "" llama --init-from "$root/tests/fixtures/hf/llama" $L --threads 2
case_ llama-bf16 "" llama --init-from "$root/tests/fixtures/hf/llama" $L --threads 2 --bf16
case_ qwen2moe-fp32 "" llama --init-from qmoe $L --threads 2
case_ qwen2moe-bf16 "" llama --init-from qmoe $L --threads 2 --bf16
case_ qwen2moe-bf16-ep2-zero3 "run -n 2" llama --init-from qmoe --seq-length 32 --micro-batch-size 1 \
  --train-iters 3 --eval-interval 1000 --threads 1 --bf16 --zero-stage 3 --expert-model-parallel-size 2
exit $bad
