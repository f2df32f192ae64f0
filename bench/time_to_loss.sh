#!/usr/bin/env bash
# Time to loss (issue 20, item 3): nanoGPT's CPU "baby GPT" recipe (configs/baby.json: 4 layers, 4 heads,
# 128 wide, T=64, B=12, 2,000 iterations, dropout 0.2, AdamW lr 1e-3 -> 1e-4 cosine, beta2 0.99) on
# tinyshakespeare bytes (90/10 split), at 2 threads and at 1 thread: wall seconds, CPU seconds (user+sys,
# robust to a shared machine's load), final val loss (nats/byte, 20 val batches as nanoGPT's
# --eval_iters=20), tokens/s, and the load average before and after each run.
# Anchor: nanoGPT on PyTorch reaches val 1.886 in 152 s on the issue's host (2 threads), quoted from issue 20;
# with --torch PY it also runs bench/tools/nanogpt_baby.py (the same recipe in PyTorch, nanoGPT's model with
# its dropout places) in the same session with the interpreter PY (needs torch and numpy).
# Targets: val <= 1.89 in <= 50 s wall at 2 threads; 2 threads >= 1.7x 1 thread.
# --dropout P: both dropouts at P instead of the config's 0.2 (nanoGPT's README CPU command, whose val 1.88 is
# the issue's anchor, passes --dropout=0.0).
# --iters N below the config's 100 warmup steps (a smoke run) keeps the schedule's shape: the decay length
# stays at least the warmup (--lr-decay-iters max(N, 100)), so the run is all warmup, as in nanogpt_baby.py.
# --bf16: suanli trains in bf16 mixed precision (`suanli train --bf16`: autocast's rounding points, fp32 master
# weights); the PyTorch anchor stays fp32 (nanoGPT's CPU recipe runs without autocast).
# --lanes L (default 2; 1: one graph): every run with --micro-batch-lanes L (Note [Micro-batch lanes]: the micro-batch's rows over L
# graphs side by side, one thread each; at 1 thread they run one after the other, with the same bits).
# Each run prints the core-to-core round trip before and after it (`suanli bench c2c`): on the 2-core VM
# the host places the vCPUs under one L3 (~60 ns) or apart (~350 ns), and the threaded step follows it.
# Usage: bench/time_to_loss.sh [--json] [--threads "2 1"] [--iters N] [--torch PY] [--dropout P] [--bf16]
#                              [--lanes L]
#   SUANLI=PATH: the suanli binary (default build/suanli)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: $0 [--json] [--threads \"2 1\"] [--iters N] [--torch PY] [--dropout P] [--bf16] [--lanes L]" >&2; exit 2; }
die() { echo "time_to_loss.sh: $*" >&2; exit 2; }
json=0; threads="2 1"; iters=2000; torch_py=""; drop=""; prec=fp32; lanes=2
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1;;
    --bf16) prec=bf16;;
    --threads|--iters|--torch|--dropout|--lanes) [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in --threads) threads="$2";; --iters) iters="$2";; --torch) torch_py="$2";; --dropout) drop="$2";;
        --lanes) lanes="$2";; esac
      shift;;
    *) echo "time_to_loss.sh: unknown argument '$1'" >&2; usage;;
  esac
  shift
done
[[ $iters =~ ^[1-9][0-9]*$ ]] || die "--iters '$iters' is not a positive integer"
[[ $lanes =~ ^[1-9][0-9]*$ ]] || die "--lanes '$lanes' is not a positive integer"
[[ $threads =~ ^\ *[1-9][0-9]*(\ +[1-9][0-9]*)*\ *$ ]] || die "--threads '$threads' is not a list of positive integers"
[ -z "$drop" ] || [[ $drop =~ ^(0|1|0?\.[0-9]+|1\.0*)$ ]] || die "--dropout '$drop' is not a probability in [0, 1]"
if [ -n "$torch_py" ]; then py=$(command -v "$torch_py") || die "--torch '$torch_py': no such interpreter"; torch_py=$py; fi
S=$(realpath -m -- "${SUANLI:-$root/build/suanli}")  # before the cd: SUANLI may be relative to the caller's cwd
cd "$root"
[ -x "$S" ] || die "$S: not an executable (build first: cmake -S . -B build && cmake --build build; or set SUANLI)"
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (Debian: apt-get install time)"
warm=$(grep -o '"lr_warmup_iters": *[0-9]*' configs/baby.json | grep -o '[0-9]*$') || die "configs/baby.json: no lr_warmup_iters"
decay=$(( iters > warm ? iters : warm ))
work=$(mktemp -d /tmp/suanli-bench-ttl-XXXXXX)
trap 'rm -rf "$work"' EXIT
# run LOG CMD...: CMD under /usr/bin/time (into $work/time), its output into LOG; on failure the log's tail
# goes to stderr before the work dir is removed
run() {
  local log=$1; shift
  /usr/bin/time -f "%e %U %S" -o "$work/time" "$@" >"$log" 2>&1 && return
  local rc=$?
  echo "time_to_loss.sh: failed (exit $rc): $*" >&2
  tail -n 20 "$log" >&2
  exit 1
}
"$S" data prepare --input data/tinyshakespeare.txt --output-prefix "$work/data" --tokenizer-type byte >"$work/prep.log" 2>&1 ||
  { cat "$work/prep.log" >&2; die "suanli data prepare failed"; }
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
load() { cut -d' ' -f1 /proc/loadavg; }
# the core-to-core round trip in ns (null where the process has one CPU)
c2c() { "$S" bench c2c --json --iters 100000 2>/dev/null | grep -o '"round_trip_ns": [0-9.]*' | awk '{print $2}' | grep . || echo null; }
out="$work/results"
: >"$out"
for n in $threads; do
  l0=$(load); c0=$(c2c)
  run "$work/log" "$S" train --config configs/baby.json --data-path "$work/data" \
    --threads "$n" --train-iters "$iters" --lr-decay-iters "$decay" --micro-batch-lanes "$lanes" \
    ${drop:+--attention-dropout "$drop" --hidden-dropout "$drop"} $([ "$prec" = bf16 ] && echo --bf16)
  l1=$(load); c1=$(c2c)
  read -r wall usr sys <"$work/time"
  val=$(grep -o 'final val loss [0-9.]*' "$work/log" | awk '{print $4}')
  cpu_s=$(awk -v u="$usr" -v s="$sys" 'BEGIN {printf "%.2f", u + s}')
  tps=$(awk -v w="$wall" -v i="$iters" 'BEGIN {printf "%.0f", i * 12 * 64 / w}')
  echo "suanli $n $wall $cpu_s $val $tps $l0 $l1 $prec $lanes $c0 $c1" >>"$out"
done
if [ -n "$torch_py" ]; then
  l0=$(load)
  run "$work/tlog" "$torch_py" bench/tools/nanogpt_baby.py --data data/tinyshakespeare.txt \
    --iters "$iters" --threads 2 ${drop:+--dropout "$drop"}
  l1=$(load)
  read -r wall usr sys <"$work/time"
  val=$(grep -o 'final val loss [0-9.]*' "$work/tlog" | awk '{print $4}')
  cpu_s=$(awk -v u="$usr" -v s="$sys" 'BEGIN {printf "%.2f", u + s}')
  tps=$(awk -v w="$wall" -v i="$iters" 'BEGIN {printf "%.0f", i * 12 * 64 / w}')
  echo "pytorch 2 $wall $cpu_s $val $tps $l0 $l1 fp32 1 null null" >>"$out"
fi
w2=$(awk '$1 == "suanli" && $2 == 2 {print $3}' "$out"); w1=$(awk '$1 == "suanli" && $2 == 1 {print $3}' "$out")
speedup=$(awk -v a="${w1:-0}" -v b="${w2:-0}" 'BEGIN {printf "%.3f", (a > 0 && b > 0) ? a / b : 0}')
if [ "$json" = 1 ]; then
  while read -r who n wall cpu_s val tps l0 l1 pr ln c0 c1; do
    printf '{"bench": "time_to_loss", "impl": "%s", "precision": "%s", "recipe": "nanogpt-baby", "dropout": %s, "iters": %s, "threads": %s, "lanes": %s, "wall_s": %s, "cpu_s": %s, "val_loss": %s, "tokens_per_s": %s, "load_before": %s, "load_after": %s, "c2c_ns_before": %s, "c2c_ns_after": %s, "cpu": "%s", "target_val": 1.89, "target_wall_s": 50, "anchor": "nanoGPT PyTorch, issue 20", "anchor_val": 1.886, "anchor_wall_s": 152}\n' \
      "$who" "$pr" "${drop:-0.2}" "$iters" "$n" "$ln" "$wall" "$cpu_s" "${val:-null}" "$tps" "$l0" "$l1" "$c0" "$c1" "$cpu"
  done <"$out"
  # the ratio only when both thread counts ran (a 0 would read as a measurement)
  [ "$speedup" = 0.000 ] ||
    printf '{"bench": "time_to_loss_scaling", "wall_1_thread_over_2_threads": %s, "target": 1.7}\n' "$speedup"
else
  echo "time to loss, nanoGPT baby recipe ($iters iterations), $cpu"
  while read -r who n wall cpu_s val tps l0 l1 pr ln c0 c1; do
    echo "  $who ($pr), $n threads, $ln lanes: val $val in $wall s wall ($cpu_s s CPU, $tps tokens/s), load $l0 -> $l1, core-to-core $c0 -> $c1 ns"
  done <"$out"
  [ "$speedup" = 0.000 ] || echo "  1-thread wall / 2-thread wall: $speedup (target >= 1.7)"
  echo "  anchor: nanoGPT/PyTorch val 1.886 in 152 s (issue 20)"
fi
