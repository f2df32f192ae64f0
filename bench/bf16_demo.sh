#!/usr/bin/env bash
# bf16 mixed precision against fp32 on the demo (issue 3): the demo model and corpus (configs/demo.json,
# byte-level tinyshakespeare), the same seed and data order, N optimizer steps (default 200) in fp32 and with
# --bf16. Prints each run's tokens/s and final val loss, and how far the bf16 train loss is from fp32's:
# the worst single step, the worst 10-step window mean, and the final val loss.
# Usage: bench/bf16_demo.sh [--json] [--steps N] [--threads T]
set -euo pipefail
cd "$(dirname "$0")/.."
me=bf16_demo.sh; . bench/lib.sh
json=0; steps=200; threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1;;
    --steps) need "$@"; steps=$2; shift;;
    --threads) need "$@"; threads=$2; shift;;
    *) echo "usage: $0 [--json] [--steps N] [--threads T]" >&2; exit 2;;
  esac
  shift
done
posint --steps "$steps"; posint --threads "$threads"
S=./build/suanli
need_bin "$S"
work=$(mktemp -d /tmp/suanli-bench-bf16-XXXXXX)
trap 'rm -rf "$work"' EXIT
$S data prepare --input data/tinyshakespeare.txt --output-prefix "$work/data" --tokenizer-type byte >/dev/null
warm=$(( steps / 4 < 50 ? steps / 4 : 50 ))  # the demo's 50 warmup steps, fewer for a short smoke run
common="--config configs/demo.json --data-path $work/data --train-iters $steps --lr-warmup-iters $warm --exit-duration-in-mins 0
  --eval-interval $steps --log-interval 1 --sample-tokens 0 --threads $threads"
for mode in fp32 bf16; do
  flag=""; [ "$mode" = bf16 ] && flag="--bf16"
  # shellcheck disable=SC2086
  $S train $common $flag >"$work/$mode.log" 2>&1 || { echo "bf16_demo.sh: the $mode run failed:" >&2; tail -3 "$work/$mode.log" >&2; exit 1; }
  grep -o '^step [0-9]*/[0-9]* | loss [0-9.]*' "$work/$mode.log" | awk '{print $5}' >"$work/$mode.loss"
done
median_tps() { grep -o '[0-9.]* tokens/s' "$1" | awk '{print $1}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
val() { grep -o 'final val loss [0-9.]*' "$1" | awk '{print $4}'; }
stats=$(paste "$work/fp32.loss" "$work/bf16.loss" | awk '
  { f[NR]=$1; b[NR]=$2; d=($2-$1)/$1; if (d<0) d=-d; if (d>worst) {worst=d; at=NR} }
  END {
    for (i=10; i<=NR; i++) { sf=0; sb=0; for (j=i-9; j<=i; j++) {sf+=f[j]; sb+=b[j]}; d=(sb-sf)/sf; if (d<0) d=-d; if (d>ww) {ww=d; wat=i} }
    printf "%d %.5f %d %.5f %d", NR, worst, at, ww, wat }')
read -r n worst worst_at win win_at <<<"$stats"
tf=$(median_tps "$work/fp32.log"); tb=$(median_tps "$work/bf16.log"); vf=$(val "$work/fp32.log"); vb=$(val "$work/bf16.log")
vd=$(awk -v a="$vf" -v b="$vb" 'BEGIN {d=(b-a)/a; if (d<0) d=-d; printf "%.5f", d}')
speed=$(awk -v a="$tf" -v b="$tb" 'BEGIN {printf "%.3f", b/a}')
if [ "$json" = 1 ]; then
  printf '{"bench": "bf16_demo", "steps": %s, "threads": %s, "fp32_tokens_per_s": %s, "bf16_tokens_per_s": %s, "bf16_speedup": %s, "fp32_val_loss": %s, "bf16_val_loss": %s, "val_rel_diff": %s, "worst_step_rel_diff": %s, "worst_step": %s, "worst_10step_window_rel_diff": %s, "worst_window_end": %s}\n' \
    "$n" "$threads" "$tf" "$tb" "$speed" "$vf" "$vb" "$vd" "$worst" "$worst_at" "$win" "$win_at"
else
  echo "demo model, $n steps, $threads threads"
  echo "  fp32: $tf tokens/s (median), final val loss $vf"
  echo "  bf16: $tb tokens/s (median), final val loss $vb  -> speed ${speed}x fp32"
  echo "  bf16 vs fp32 train loss: worst step $worst (step $worst_at), worst 10-step mean $win (ending at step $win_at); val $vd"
fi
