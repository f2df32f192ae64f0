#!/usr/bin/env bash
# Packed experts against per-expert buffers (Note [Packed experts], src/ops/moe_ops.c): the same dropless
# Qwen2-MoE training step (`suanli bench moe`) with SUANLI_MOE_PACKED=1 (the default) and =0 (every expert's
# buffers sized for every token), interleaved, on two shapes: the default 8 experts top-2 (width 256) and a
# fine-grained 32 experts top-4 (width 128, T = 256), one process x 2 threads; and the 8-expert shape under
# expert parallelism (2 ranks x 1 thread, ep 2), and the 32-expert shape in bf16 mixed precision (--bf16:
# autocast numerics, whose routed experts are fp32 unless SUANLI_MOE_HALF_EXPERTS=1: Note [Experts under
# autocast] in src/nn/moe.c). Prints one JSON line per run and, per configuration, the
# medians: ms per step, tokens/s, the planned activation arena (MiB) and the peak RSS (MiB).
# Usage: bench/moe_packed.sh [--steps N] [--repeat R]
set -euo pipefail
cd "$(dirname "$0")/.."
me=moe_packed.sh; . bench/lib.sh
steps=4; repeat=2
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) need "$@"; steps="$2"; shift 2;;
        --repeat) need "$@"; repeat="$2"; shift 2;;
        *) echo "usage: $0 [--steps N] [--repeat R]" >&2; exit 2;;
    esac
done
posint --steps "$steps"; posint --repeat "$repeat"
S=./build/suanli
need_bin "$S"
out=$(mktemp /tmp/suanli-bench-moe-packed-XXXXXX)
trap 'rm -f "$out" "$out.err"' EXIT
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
fine="--num-experts 32 --moe-router-topk 4 --moe-ffn-hidden-size 128 --seq-length 256"
run() { # name packed cmd...
    local name="$1" p="$2"
    shift 2
    SUANLI_MOE_PACKED="$p" "$@" --steps "$steps" --warmup 1 --json 2>"$out.err" | sed 's/^\[0\] //' |
        grep '^{' | sed "s/^{/{\"config\": \"$name\", /" | tee -a "$out" ||
        fail_log "$out.err" SUANLI_MOE_PACKED="$p" "$@" --steps "$steps" --warmup 1 --json
}
for _ in $(seq "$repeat"); do
    for p in 1 0; do
        run e8k2 "$p" $S bench moe --threads 2
        # shellcheck disable=SC2086
        run e32k4 "$p" $S bench moe --threads 2 $fine
        run e8k2-ep2 "$p" $S run -n 2 -- $S bench moe --threads 1 --ep 2
        # shellcheck disable=SC2086
        run e32k4-bf16 "$p" $S bench moe --threads 2 $fine --bf16
    done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" <<'PY' >&2
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
print("config      experts     ms/step  tokens/s  activations MiB  peak RSS MiB")
for c in ("e8k2", "e32k4", "e8k2-ep2", "e32k4-bf16"):
    for p in (1, 0):
        sel = [r for r in rs if r["config"] == c and r["packed_experts"] == p]
        if not sel:
            continue
        m = lambda k: statistics.median(r[k] for r in sel)
        print(f"{c:11} {'packed' if p else 'per-expert':10} {m('ms_per_step'):8.1f} {m('tokens_per_s'):9.1f} "
              f"{m('activation_mib'):16.1f} {m('peak_rss_mib'):13.1f}")
PY
