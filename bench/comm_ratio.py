#!/usr/bin/env python3
"""Repeat `sl_bench_comm --json` launches under mpirun and print per-size medians of suanli (window and
plain) vs OpenMPI busbw and of the per-launch time ratios (MPI time / suanli time, same processes),
with the load average before each launch. Several binaries (label=path) are launched in turn, so an
A/B (before/after) shares the machine's slow and fast spells.

  python3 bench/comm_ratio.py -n 2 --launches 5 [--bench before=OLD/sl_bench_comm --bench after=build/...] \\
      -- --colls all_gather,all_to_allv --window --min-bytes 64K --max-bytes 64M

Everything after `--` goes to the benchmark (default binary: build/tests/comm/sl_bench_comm of this tree)."""
import argparse, json, os, shutil, statistics, subprocess, time

ap = argparse.ArgumentParser()
ap.add_argument("-n", type=int, default=2)
ap.add_argument("--launches", type=int, default=5)
ap.add_argument("--bench", action="append")
ap.add_argument("--raw", help="append every launch's JSON to this file")
ap.add_argument("--colls-for", action="append", default=[],
                help="label=LIST: --colls for that binary (e.g. an older one without all_to_allv)")
ap.add_argument("rest", nargs=argparse.REMAINDER)
a = ap.parse_args()
if a.n < 1 or a.launches < 1:
    ap.error("-n and --launches must be at least 1")
if not shutil.which("mpirun"):
    ap.error("no mpirun on PATH (OpenMPI)")
rest = [x for x in a.rest if x != "--"]
default = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build/tests/comm/sl_bench_comm"))
benches = ([b.split("=", 1) if "=" in b else [b, b] for b in a.bench] if a.bench
           else [["build/tests/comm/sl_bench_comm", default]])
for lab, path in benches:
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        ap.error(f"--bench {lab}: {path}: no such executable")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
rows = {lab: {} for lab, _ in benches}
used = {}
loads = {lab: [] for lab, _ in benches}
t0 = time.strftime("%H:%M:%S", time.gmtime())
cfor = dict(x.split("=", 1) for x in a.colls_for)
for k in range(a.launches):
    for lab, path in benches:
        args = list(rest)
        if lab in cfor:
            args = [x for i, x in enumerate(args) if x != "--colls" and (i == 0 or args[i - 1] != "--colls")]
            args += ["--colls", cfor[lab]]
        cmd = ["mpirun", "--allow-run-as-root"] + (["--oversubscribe"] if a.n > 2 else []) + \
              ["-np", str(a.n), path, "--json"] + args
        loads[lab].append(os.getloadavg()[0])
        used[lab] = " ".join(cmd)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if "{" not in p.stdout:
            raise SystemExit(f"{' '.join(cmd)}: no JSON\n{p.stderr[-2000:]}")
        js = json.loads(p.stdout[p.stdout.index("{"):])
        if a.raw:
            with open(a.raw, "a") as f:
                f.write(json.dumps({"label": lab, "launch": k, "load": loads[lab][-1], "bench": js}) + "\n")
        for res in js["results"]:
            rows[lab].setdefault((res["coll"], res["bytes"]), []).append(res)
med = statistics.median
def fmt_b(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"
for lab, path in benches:
    print(f"\n# {lab}: {used[lab]}")
    print(f"# {t0}-{time.strftime('%H:%M:%S', time.gmtime())} UTC, {a.launches} launches, load before each: "
          + " ".join(f"{l:.2f}" for l in loads[lab]))
    print("| coll | bytes | window busbw | plain busbw | OpenMPI busbw | window/MPI median (min) "
          "| plain/MPI median (min) | wrong |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (coll, b), rs in rows[lab].items():
        wrong = sum(r["wrong"] + r.get("window_wrong", 0) + r.get("mpi_wrong", 0) for r in rs)
        wb = [r["window_busbw"] for r in rs if "window_busbw" in r]
        pb = [r["busbw"] for r in rs]
        mb = [r["mpi_busbw"] for r in rs if "mpi_busbw" in r]
        wr = [r["mpi_time_us"] / r["window_time_us"] for r in rs if "window_time_us" in r and "mpi_time_us" in r]
        pr = [r["mpi_time_us"] / r["time_us"] for r in rs if "mpi_time_us" in r]
        f = lambda v: f"{med(v):.2f}" if v else "-"
        g = lambda v: f"{med(v):.2f}x ({min(v):.2f})" if v else "-"
        print(f"| {coll} | {fmt_b(b)} | {f(wb)} | {f(pb)} | {f(mb)} | {g(wr)} | {g(pr)} | {wrong} |")
