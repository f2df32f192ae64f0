#!/usr/bin/env bash
# Loss curves of `suanli train` on an accelerator against the CPU backend, per step, for the paths the
# conformance suite checks only op by op: dropout drawn on the device (masks must be the CPU's bit for bit),
# --bf16 and --fp16 autocast (the eager half attention, f16 storage and GEMMs) and tensor parallelism with
# sequence parallelism (the vocabulary-parallel ops, staged collectives). A small GPT-2 (L2 C64 H4, T 32,
# B 8) on the first 200 kB of data/tinyshakespeare.txt, byte-level, 20 steps each with attention and hidden
# dropout 0.1; bars as Note [OpenCL loss-curve bar] (tests/backend/test_opencl_train.c): 1e-4 relative per
# step in fp32, 1e-3 in bf16 / fp16. One JSON line per pair; exit 1 if any pair fails or does not run.
#
# Usage: scripts/device_train_check.sh CLI DEVICE [WORKDIR]
#   CLI: the suanli binary; DEVICE: cuda, opencl:0, ... (cpu against cpu checks the script itself)
#   SL_DTC_TIMEOUT seconds per train run (default 120), SL_DTC_STEPS steps per run (default 20)
# scripts/gpu_check.sh runs it with --device cuda.
set -uo pipefail
cd "$(dirname "$0")/.."
cli=${1:?usage: device_train_check.sh CLI DEVICE [WORKDIR]}
dev=${2:?usage: device_train_check.sh CLI DEVICE [WORKDIR]}
work=${3:-$(mktemp -d "${TMPDIR:-/tmp}/sl_dtc.XXXXXX")}
steps=${SL_DTC_STEPS:-20}
tmo=${SL_DTC_TIMEOUT:-120}
mkdir -p "$work"
head -c 200000 data/tinyshakespeare.txt >"$work/small.txt"
"$cli" data prepare --input "$work/small.txt" --output-prefix "$work/data" --tokenizer-type byte >/dev/null ||
  { echo "device_train_check: FAIL: data prepare" >&2; exit 1; }
model="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 8 --lr 1e-3
 --lr-warmup-iters 5 --threads 2 --eval-interval 0 --eval-iters 1 --log-interval 1 --train-iters $steps
 --attention-dropout 0.1 --hidden-dropout 0.1"
failed=()

# pair NAME BAR RANKS EXTRA: the same run on cpu and on $dev (RANKS > 1: under `suanli run -n RANKS`)
pair() {
  local name=$1 bar=$2 ranks=$3 extra=$4 d rc
  for d in cpu "$dev"; do
    local out="$work/${name}_${d%%:*}" launch=()
    [ "$ranks" -gt 1 ] && launch=("$cli" run -n "$ranks" --)
    rm -rf "$out"
    # shellcheck disable=SC2086
    timeout "$tmo" "${launch[@]}" "$cli" train --device "$d" --data-path "$work/data" $model $extra \
      --save "$out" >"$out.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "device_train_check: FAIL: $name on $d (exit $rc):" >&2
      tail -5 "$out.log" >&2
      failed+=("$name on $d")
      return 0
    fi
  done
  python3 - "$name" "$bar" "$steps" "$dev" "$work/${name}_cpu/metrics.jsonl" \
    "$work/${name}_${dev%%:*}/metrics.jsonl" <<'EOF' || failed+=("$name (curves)")
import json, sys
name, bar, steps, dev, fa, fb = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
def losses(path):
    out = []
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            if "step" in r and "loss" in r:
                out.append(r["loss"])
    return out
a, b = losses(fa), losses(fb)
worst, at = 0.0, 0
for s, (x, y) in enumerate(zip(a, b)):
    r = abs(y - x) / abs(x) if x else abs(y - x)
    if r > worst:
        worst, at = r, s + 1
ok = len(a) == steps and len(b) == steps and worst <= bar
print(json.dumps({"check": "device_train_curve", "pair": name, "device": dev, "steps": [len(a), len(b)],
                  "worst_rel": worst, "at_step": at, "bar": bar, "ok": ok}))
sys.exit(0 if ok else 1)
EOF
}

pair fp32_dropout 1e-4 1 ""
pair bf16_dropout 1e-3 1 "--bf16"
pair fp16_dropout 1e-3 1 "--fp16"
pair tp2_sp_dropout 1e-4 2 "--tp 2 --sequence-parallel"
if [ ${#failed[@]} -ne 0 ]; then
  echo "device_train_check: FAIL: ${failed[*]}" >&2
  exit 1
fi
echo "device_train_check: all pairs within their bars on $dev"
