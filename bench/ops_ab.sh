#!/usr/bin/env bash
# A/B of two suanli builds on the MATMUL shapes of `bench ops --device D --quick`, alternated in one loop:
#   bench/ops_ab.sh [--rounds R] [--threads T] [--device D] BIN_A BIN_B
# Prints, per shape, the median over R rounds of each build's device GFLOP/s and its ratio to the CPU
# backend of the same run, then the geometric means; the last line is one JSON record. With --threads 1
# PoCL is held to one thread too (POCL_MAX_PTHREAD_COUNT). docs/BENCHMARKS.md "OpenCL step on the quiet
# Intel host".
set -euo pipefail
me=ops_ab.sh
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
rounds=3 threads=2 device=opencl:0
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) need "$@"; posint "$1" "$2"; rounds=$2; shift 2 ;;
    --threads) need "$@"; posint "$1" "$2"; threads=$2; shift 2 ;;
    --device) need "$@"; device=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown flag $1" ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || die "give two suanli binaries: BIN_A BIN_B"
need_bin "$1"
need_bin "$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
  for i in 1 2; do
    bin=${!i}
    if ! POCL_MAX_PTHREAD_COUNT=$threads "$bin" bench ops --device "$device" --quick --reps 3 --threads "$threads" \
         --json > "$tmp/$i.$r.json" 2> "$tmp/err"; then
      fail_log "$tmp/err" "$bin" bench ops --device "$device"
    fi
  done
done
python3 - "$tmp" "$rounds" "$1" "$2" "$threads" "$device" <<'PY'
import json, statistics as st, sys
tmp, R, a, b, threads, device = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
res = {}
for i in (1, 2):
    for r in range(1, R + 1):
        lines = [l for l in open(f"{tmp}/{i}.{r}.json") if l.startswith("{")]
        for row in json.loads(lines[-1])["rows"]:
            k = (row["pass"], row["trans"], row["M"], row["N"], row["K"])
            res.setdefault(k, {}).setdefault(i, []).append((row["device_gflops"], row["vs_cpu"]))
print(f"{'shape':<26}{'A GFLOP/s':>11}{'A/cpu':>7}{'B GFLOP/s':>11}{'B/cpu':>7}")
gm = {1: [1.0, 1.0], 2: [1.0, 1.0]}
for k, d in res.items():
    line = f"{' '.join(map(str, k)):<26}"
    for i in (1, 2):
        g, v = st.median(x[0] for x in d[i]), st.median(x[1] for x in d[i])
        gm[i][0] *= g
        gm[i][1] *= v
        line += f"{g:11.1f}{v:7.2f}"
    print(line)
n = len(res)
g = {i: (gm[i][0] ** (1 / n), gm[i][1] ** (1 / n)) for i in (1, 2)}
print(f"{'geomean':<26}{g[1][0]:11.1f}{g[1][1]:7.2f}{g[2][0]:11.1f}{g[2][1]:7.2f}")
print(json.dumps({"bench": "ops_ab", "device": device, "threads": int(threads), "rounds": R, "a": a, "b": b,
                  "a_geomean_gflops": round(g[1][0], 1), "a_vs_cpu": round(g[1][1], 3),
                  "b_geomean_gflops": round(g[2][0], 1), "b_vs_cpu": round(g[2][1], 3)}))
PY
