#!/usr/bin/env bash
# A private one-node Slurm (munged + slurmctld + slurmd started by hand in a temporary folder, no
# systemd, no /etc edits), then the comm matrix, a `suanli bench comm` check and a data-parallel
# `suanli train` (weights equal to the same job under `suanli run`) launched by srun:
#   slurm_local.sh SUANLI_CLI MATRIX_BIN [MPICH_MATRIX_BIN]
# srun -n2 / -n4 (bootstrap from SLURM_PROCID/SLURM_NTASKS/SLURM_STEP_NODELIST, shm and tcp), the
# MPI transport under srun --mpi=pmix (OpenMPI) and, given MPICH_MATRIX_BIN, --mpi=pmi2 (MPICH).
# Exits 77 (ctest: skipped) with a message when slurm/munge are missing or we are not root; stops
# the daemons it started (by pid) on every exit.
set -uo pipefail
cli=$1 matrix=$2 mpich_matrix=${3:-}
skip() { echo "skipped: $*"; exit 77; }
for p in munged slurmctld slurmd srun sinfo; do
  command -v "$p" >/dev/null || skip "$p not found (apt-get install slurm-wlm munge)"
done
[ "$(id -u)" = 0 ] || skip "needs root (slurmd launches tasks as the submitting user via root)"

d=$(mktemp -d /tmp/sl-slurm.XXXXXX)
chmod 700 "$d"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  rm -rf "$d"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$d"/*.log; do echo "--- $f"; tail -n 20 "$f"; done
  exit 1
}

host=$(hostname -s)
cpus=$(nproc); [ "$cpus" -lt 4 ] && cpus=4   # declared CPUs (config_overrides): -n4 runs on 2 cores too
# random ports and first job id: concurrent runs of this script must not meet (suanli's Slurm
# rendezvous port and token derive from the job id). A port pair in use (other tests listen too) is
# skipped when `ss` sees it, and a daemon that still cannot bind makes us retry with another pair.
free_port() { ! command -v ss >/dev/null || [ -z "$(ss -Htln "sport = :$1" 2>/dev/null)" ]; }
dd if=/dev/urandom of="$d/munge.key" bs=1024 count=1 status=none
chmod 400 "$d/munge.key"
munged -F -f --key-file="$d/munge.key" --socket="$d/munge.sock" --pid-file="$d/munged.pid" \
  --log-file="$d/munged.log" --seed-file="$d/munged.seed" >"$d/munged.out.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$d/munge.sock" ] && break; sleep 0.1; done
[ -S "$d/munge.sock" ] || fail "munged did not start"
export SLURM_CONF=$d/slurm.conf
state=""
for attempt in 1 2 3 4; do
  port=$((30000 + RANDOM % 20000))
  free_port "$port" && free_port $((port + 1)) || continue
  rm -rf "$d/state" "$d/spool" "$d"/slurm*.log
  mkdir -p "$d/state" "$d/spool"
  cat > "$d/slurm.conf" <<EOF
ClusterName=sltest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge.sock
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
FirstJobId=$((1000 + RANDOM * 16))
MailProg=/bin/true
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=sl Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  slurmctld -D -c -i -f "$SLURM_CONF" >"$d/slurmctld.out.log" 2>&1 &
  ctld=$!
  slurmd -D -N "$host" -f "$SLURM_CONF" >"$d/slurmd.out.log" 2>&1 &
  sd=$!
  pids+=("$ctld" "$sd")
  state=""
  for _ in $(seq 150); do
    state=$(sinfo -h -n "$host" -o %t 2>/dev/null)
    [ "$state" = idle ] && break
    grep -qs "Address already in use" "$d"/slurm*.log && break
    sleep 0.2
  done
  [ "$state" = idle ] && break
  echo "attempt $attempt: ports $port/$((port + 1)) not usable (state '$state'); retrying"
  kill "$ctld" "$sd" 2>/dev/null
  wait "$ctld" "$sd" 2>/dev/null
done
[ "$state" = idle ] || fail "node $host not idle after 4 attempts (state '$state')"
echo "slurm up: $host, ctld port $port, $(srun --version)"

nfail=0
# check NAME N REGEX SRUN-ARGS...: srun -N1 -nN ...; every rank must print one line matching REGEX
check() {
  local name=$1 n=$2 want=$3; shift 3
  local out rc got
  out=$(SUANLI_COMM_TIMEOUT=60 timeout 180 srun -N1 -n"$n" "$@" 2>&1)
  rc=$?
  got=$(grep -c -E "$want" <<<"$out")
  if [ $rc -ne 0 ] || [ "$got" -ne "$n" ]; then
    echo "FAIL $name (rc $rc, $got of $n ranks matched /$want/):"
    tail -n 30 <<<"$out"
    nfail=$((nfail + 1))
  else
    echo "ok   $name"
  fi
}
check "srun -n2 matrix (shm)" 2 "^rank [0-9]/2 transport shm: ok" "$matrix" env shm slurm
check "srun -n4 matrix (shm)" 4 "^rank [0-9]/4 transport shm: ok" "$matrix" env shm slurm
SUANLI_COMM_TRANSPORT=tcp check "srun -n2 matrix (tcp)" 2 "^rank [0-9]/2 transport tcp: ok" "$matrix" env tcp slurm
SUANLI_COMM_TRANSPORT=tcp check "srun -n4 matrix (tcp)" 4 "^rank [0-9]/4 transport tcp: ok" "$matrix" env tcp slurm
# suanli bench comm under srun: every size of every collective, checked against the analytic result
out=$(timeout 120 srun -N1 -n2 "$cli" bench comm --max-bytes 64K --iters 2 --json 2>&1)
if [ $? -ne 0 ] || ! grep -q '"coll":"all_to_all"' <<<"$out" || grep -q '"wrong":[1-9]' <<<"$out"; then
  echo "FAIL srun -n2 suanli bench comm:"; tail -n 20 <<<"$out"; nfail=$((nfail + 1))
else
  echo "ok   srun -n2 suanli bench comm ($(grep -c '"coll"' <<<"$out") results, none wrong)"
fi
# MPI transport: OpenMPI through PMIx, MPICH through PMI-2 (when the plugin and the build exist)
if srun --mpi=list 2>&1 | grep -q pmix; then
  SUANLI_COMM_TRANSPORT=mpi check "srun --mpi=pmix -n2 matrix (mpi, OpenMPI)" 2 "^rank [0-9]/2 transport mpi: ok" \
    --mpi=pmix "$matrix" env mpi slurm
fi
if [ -n "$mpich_matrix" ]; then
  SUANLI_COMM_TRANSPORT=mpi check "srun --mpi=pmi2 -n2 matrix (mpi, MPICH)" 2 "^rank [0-9]/2 transport mpi: ok" \
    --mpi=pmi2 "$mpich_matrix" env mpi pmi
  SUANLI_COMM_TRANSPORT=mpi check "srun --mpi=pmi2 -n4 matrix (mpi, MPICH)" 4 "^rank [0-9]/4 transport mpi: ok" \
    --mpi=pmi2 "$mpich_matrix" env mpi pmi
fi
# data-parallel training under srun (issue 5): the same weights as the same job under `suanli run`
src=$(cd "$(dirname "$0")/../.." && pwd)
head -c 20000 "$src/data/tinyshakespeare.txt" > "$d/s.txt"
if "$cli" data prepare --input "$d/s.txt" --output-prefix "$d/data" >/dev/null 2>&1; then
  targs="train --data-path $d/data --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16
         --micro-batch-size 2 --global-batch-size 4 --train-iters 6 --eval-interval 0 --eval-iters 1 --threads 1"
  # shellcheck disable=SC2086
  out1=$(SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 timeout 120 "$cli" run -n 2 -- "$cli" $targs --zero-stage 1 --save "$d/run" 2>&1)
  rc1=$?
  # shellcheck disable=SC2086
  out2=$(SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 timeout 120 srun -N1 -n2 "$cli" $targs --zero-stage 1 --save "$d/srun" 2>&1)
  rc2=$?
  if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ] || ! grep -q "data parallel: 2 ranks" <<<"$out2" ||
     ! cmp -s "$d/run/model.safetensors" "$d/srun/model.safetensors"; then
    echo "FAIL srun -n2 suanli train (DP=2, ZeRO-1) vs suanli run (rc $rc1/$rc2):"; tail -n 20 <<<"$out2"
    nfail=$((nfail + 1))
  else
    echo "ok   srun -n2 suanli train: DP=2 ZeRO-1 weights equal to suanli run -n 2, bitwise"
  fi
else
  echo "FAIL data prepare for the srun training check"; nfail=$((nfail + 1))
fi
[ $nfail -eq 0 ] || fail "$nfail srun check(s) failed"
echo "slurm_local: all srun checks passed"
