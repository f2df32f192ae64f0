#!/usr/bin/env python3
"""Repeat `sl_bench_comm --json` launches under mpirun and print per-size medians of suanli (window and
plain) vs OpenMPI busbw and of the per-launch time ratios, with the load average before each launch.

  python3 bench/comm_ratio.py -n 2 --launches 5 -- --colls all_gather --window --min-bytes 64K --max-bytes 64M

Everything after `--` goes to the benchmark. Uses build/tests/comm/sl_bench_comm (--bench to change)."""
import argparse, json, os, statistics, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("-n", type=int, default=2)
ap.add_argument("--launches", type=int, default=5)
ap.add_argument("--bench", default="build/tests/comm/sl_bench_comm")
ap.add_argument("rest", nargs=argparse.REMAINDER)
a = ap.parse_args()
rest = [x for x in a.rest if x != "--"]
cmd = ["mpirun", "--allow-run-as-root"] + (["--oversubscribe"] if a.n > 2 else []) + ["-np", str(a.n), a.bench, "--json"] + rest
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
rows, loads = {}, []
for k in range(a.launches):
    loads.append(os.getloadavg()[0])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900).stdout
    js = json.loads(out[out.index("{"):])
    for res in js["results"]:
        rows.setdefault((res["coll"], res["bytes"]), []).append(res)
print(f"# {' '.join(cmd)}")
print(f"# {time.strftime('%H:%M:%S', time.gmtime())} UTC, {a.launches} launches, load before each: "
      + " ".join(f"{l:.2f}" for l in loads))
print("| coll | bytes | window busbw | plain busbw | OpenMPI busbw | window/MPI median (min) | plain/MPI median (min) | wrong |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
med = statistics.median
def fmt_b(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"
for (coll, b), rs in rows.items():
    wrong = sum(r["wrong"] + r.get("window_wrong", 0) + r.get("mpi_wrong", 0) for r in rs)
    wb = [r["window_busbw"] for r in rs if "window_busbw" in r]
    pb = [r["busbw"] for r in rs]
    mb = [r["mpi_busbw"] for r in rs if "mpi_busbw" in r]
    wr = [r["mpi_time_us"] / r["window_time_us"] for r in rs if "window_time_us" in r and "mpi_time_us" in r]
    pr = [r["mpi_time_us"] / r["time_us"] for r in rs if "mpi_time_us" in r]
    f = lambda v: f"{med(v):.2f}" if v else "-"
    g = lambda v: f"{med(v):.2f}x ({min(v):.2f})" if v else "-"
    print(f"| {coll} | {fmt_b(b)} | {f(wb)} | {f(pb)} | {f(mb)} | {g(wr)} | {g(pr)} | {wrong} |")
