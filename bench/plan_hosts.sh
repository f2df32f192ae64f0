#!/usr/bin/env bash
# The planner's DP all-reduce across hosts (Note [Planner DP across hosts], src/plan/model.c) against real
# `suanli train` runs on the namespace cluster (tests/comm/netns_cluster.sh): 2 hosts x 2 ranks, DP = 4,
# ZeRO-0 (ZERO=1..3 for another stage: then only suanli's default run, against the planner), each host's
# link shaped to RATE (tc tbf), DELAY us one way added by the delay line if set.
# GPT-2 L4 C256 T64 (3.2M parameters, 12.97 MB of gradients) in ONE bucket (--ddp-bucket-size 2^30), so
# the all-reduce starts when the backward ends and the step waits for all of it: metrics.jsonl's
# comm_wait_ms is the whole all-reduce. Two runs: suanli's default (hierarchical across hosts) and the flat
# algorithm (SUANLI_COMM_HIER=0). Predicted: `suanli plan --json`'s t_dp_comm on a cluster file made from
# the links measured first in the same run (bench/comm_hosts.sh's link rows: the 2-rank shm all-reduce at
# 16 MiB and the 1-rank-per-host tcp one at 16 MiB and 8 B), and for the flat run the ring formula
# 2(g-1)/g N / beta_inter + 2(g-1) alpha_inter (one bucket; a flat ring crosses each host boundary with one flow).
# The whole step is predicted too (the planner's compute + optimizer, a device being half of a core as
# `suanli plan --probe --threads 1` measures it: 4 ranks on 2 cores; for the flat run with the ring formula
# in place of the planner's DP term).
# usage: [DELAY=US] bench/plan_hosts.sh SUANLI_CLI [RATE [STEPS]]   (root)
set -u
usage() { echo "plan_hosts.sh: $*; usage: [DELAY=US] [ZERO=0..3] bash bench/plan_hosts.sh SUANLI_CLI [RATE [STEPS]]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 3 ] || usage "wrong number of arguments"
[ -f "$1" ] && [ -x "$1" ] || usage "SUANLI_CLI '$1' is not an executable"
CLI=$(readlink -f "$1"); RATE=${2:-1gbit}; STEPS=${3:-8}; DELAY=${DELAY:-}; ZERO=${ZERO:-0}
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || usage "STEPS '$STEPS' is not a positive integer"
[[ $ZERO =~ ^[0-3]$ ]] || usage "ZERO '$ZERO' is not 0, 1, 2 or 3"
HERE=$(cd "$(dirname "$0")" && pwd)
export NC_DELAYLINE=${NC_DELAYLINE:-$(dirname "$CLI")/tests/comm/sl_delayline}
. "$HERE/../tests/comm/netns_cluster.sh"
T=$(mktemp -d /tmp/sl-planhosts.XXXXXX)
trap 'nc_cleanup; rm -rf "$T"' EXIT
trap 'exit 1' INT TERM
nc_setup 2 "$RATE" $DELAY || exit $?
M=$(nc_addr 0)
"$CLI" data prepare --input "$HERE/../data/tinyshakespeare.txt" --output-prefix "$T/tok" > /dev/null || exit 1
echo "# $(date -u +%FT%TZ) rate=$RATE delay_us=${DELAY:-0} cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
# the links, as in bench/comm_hosts.sh
nc_exec 0 "$CLI" run -n 2 -- "$CLI" bench comm --colls all_reduce --json --reps 3 --max-bytes 16M 2>"$T/shm.err" |
  grep '"bytes":16777216' > "$T/shm" || { tail -n 10 "$T/shm.err" >&2; echo "plan_hosts.sh: FAIL: the shm link run" >&2; exit 1; }
nc_exec 1 "$CLI" run -n 1 --nnodes 2 --node-rank 1 --master $M:29500 -- "$CLI" bench comm --colls all_reduce --json --reps 3 --max-bytes 16M > "$T/tcp1.log" 2>&1 &
p1=$!
nc_exec 0 "$CLI" run -n 1 --nnodes 2 --node-rank 0 --master $M:29500 -- "$CLI" bench comm --colls all_reduce --json --reps 3 --max-bytes 16M 2>"$T/tcp.err" |
  grep -E '"bytes":(8|16777216),' > "$T/tcp" || { tail -n 10 "$T/tcp.err" >&2; echo "plan_hosts.sh: FAIL: the tcp link run" >&2; exit 1; }
wait $p1 || { tail -n 10 "$T/tcp1.log" >&2; echo "plan_hosts.sh: FAIL: the tcp link run on h1" >&2; exit 1; }
train=(train --data-path "$T/tok" --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 64
       --micro-batch-size 4 --global-batch-size 16 --threads 1 --eval-iters 1 --eval-interval 0 --log-interval 1
       --ddp-bucket-size 1073741824 --train-iters $((STEPS + 1)) --zero-stage $ZERO)
run_job() { # NAME [ENV=VALUE...]
  local name=$1; shift
  nc_exec 1 env "$@" timeout 300 "$CLI" run -n 2 --nnodes 2 --node-rank 1 --master $M:29510 -- "$CLI" "${train[@]}" --save "$T/$name" > "$T/$name.h1.log" 2>&1 &
  local p=$!
  nc_exec 0 env "$@" timeout 300 "$CLI" run -n 2 --nnodes 2 --node-rank 0 --master $M:29510 -- "$CLI" "${train[@]}" --save "$T/$name" > "$T/$name.log" 2>&1 ||
    { tail -n 20 "$T/$name.log"; echo "FAIL: $name"; exit 1; }
  wait $p || { tail -n 20 "$T/$name.h1.log"; echo "FAIL: $name on h1"; exit 1; }
}
run_job hier SUANLI_COMM_HIER=1
[ "$ZERO" = 0 ] && run_job flat SUANLI_COMM_HIER=0
python3 - "$T" "$CLI" "$HERE/../configs/cluster/this-host.json" "$ZERO" <<'PY'
import json, re, statistics, subprocess, sys
T, cli, thishost, zero = sys.argv[1:]
def run(args): # the CLI's stdout; a failure exits with its stderr
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"plan_hosts.sh: FAIL (exit {r.returncode}): {' '.join(args)}\n{r.stderr.strip()}")
    return r.stdout
shm = json.loads(re.search(r'\{"coll".*\}', open(T + "/shm").read()).group(0))
tcp = {}
for l in open(T + "/tcp"):
    d = json.loads(re.search(r'\{"coll".*\}', l).group(0)); tcp[d["bytes"]] = d
n16 = 16777216
beta_intra = n16 / (shm["time_us"] * 1e-6)               # 2 ranks: busbw = algbw = N / t
alpha_inter = tcp[8]["time_us"] * 1e-6                  # one exchange of 8 B
beta_inter = n16 / (tcp[n16]["time_us"] * 1e-6 - alpha_inter)
probe = run([cli, "plan", "--model", "gpt2-124m", "--cluster", thishost, "--devices", "1",
             "--global-batch", "1", "--seq-len", "64", "--probe", "--threads", "1", "--top", "1"])
m = re.search(r"probe: GEMM ([0-9.]+) GFLOP/s.*copy ([0-9.]+) GB/s", probe)
gf, bw = float(m.group(1)), float(m.group(2))
cluster = {"name": "namespace 2 x 2", "hosts": 2, "devices_per_host": 2,
           # 4 ranks on this machine's 2 cores: a device is half a core, as `suanli plan --probe --threads 1`
           # measures one (GEMM rate, copy bandwidth)
           "device": {"peak_TFLOPs": gf / 2 / 1e3, "memory_GiB": 12, "mem_bw_GBps": bw / 2, "gemm_efficiency": 1.0},
           "links": {"intra_host": {"alpha_us": 0.5, "beta_GBps": beta_intra / 1e9},
                     "inter_host": {"alpha_us": alpha_inter * 1e6, "beta_GBps": beta_inter / 1e9, "nics_per_host": 1}},
           "reliability": {"host_mtbf_hours": 8760, "ckpt_write_GBps": 0.25, "ckpt_read_GBps": 0.4}, "launcher": "run"}
json.dump(cluster, open(T + "/ns.json", "w"))
open(T + "/m.json", "w").write('{"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 256, "seq_length": 64}')
out = run([cli, "plan", "--model", T + "/m.json", "--cluster", T + "/ns.json", "--dp", "4", "--micro-batch", "4",
           "--global-batch", "16", "--seq-len", "64", "--recompute", "none", "--zero", zero,
           "--bucket-elems", "1073741824", "--json", "--top", "1"])
p = json.loads(out.splitlines()[0])
N = p["mem_grads"]
ring = 2 * 3 / 4 * N / beta_inter + 6 * alpha_inter
def mem(name): # rank 0's allocation sizes from the banner, as bench/plan_validate.sh reads them
    log = open(f"{T}/{name}.log").read()
    act = float(re.search(r"activation memory: planned ([0-9.]+) MiB", log).group(1))
    m = re.search(r"per rank: params ([0-9.]+) MiB, grads ([0-9.]+) MiB \(\+ ([0-9.]+) MiB reduced shard\), optimizer state ([0-9.]+) MiB(?:, slots ([0-9.]+) MiB)?", log)
    return sum(float(x) for x in m.groups() if x) + act
def meas(name):
    rows = [json.loads(l) for l in open(f"{T}/{name}/metrics.jsonl")][1:]
    return statistics.median(r["comm_wait_ms"] for r in rows), statistics.median(r["ms_per_step"] for r in rows), len(rows)
print(f"# probe (1 thread): GEMM {gf:.1f} GFLOP/s, copy {bw:.1f} GB/s; a device is half of it")
print(f"# links: shm {beta_intra/1e9:.2f} GB/s (16 MiB); tcp {alpha_inter*1e6:.1f} us (8 B), {beta_inter/1e9:.4f} GB/s (16 MiB); gradients {N/1e6:.2f} MB in one bucket")
print("| run | measured DP wait ms (median) | step ms | predicted DP ms | error | predicted step ms (planner) | error | MiB per rank | predicted | error |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
runs = [("hier", p["t_dp_comm"] * 1e3, f"planner ({p['dp_allreduce']}, {p['dp_per_host']} per host, ZeRO-{zero})")]
if zero == "0": runs.append(("flat", ring * 1e3, "ring formula"))
for name, pred, what in runs:
    w, s, k = meas(name)
    step = (p["step_sec"] - p["t_dp_comm"]) * 1e3 + pred
    print(f"| {name} (SUANLI_COMM_HIER={'1' if name == 'hier' else '0'}), {k} steps | {w:.1f} | {s:.1f} | {pred:.1f} ({what}) | {100 * (pred / w - 1):+.1f}% | {step:.1f} | {100 * (step / s - 1):+.1f}% | {mem(name):.1f} | {p['mem_total'] / 1048576:.1f} | {100 * (p['mem_total'] / 1048576 / mem(name) - 1):+.2f}% |")
PY
[ -n "$DELAY" ] && echo "# $(nc_delayline_stats)"
echo "# end $(date -u +%FT%TZ) load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
