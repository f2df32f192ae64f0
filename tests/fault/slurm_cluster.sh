#!/usr/bin/env bash
# A multi-node Slurm cluster on one machine (sourced): munged, slurmctld in namespace host h0, one
# slurmd per namespace host h1..hN (netns_cluster.sh: each its own address, host name, network),
# all sharing this machine's file system (the "parallel file system" checkpoints go to).
#   . slurm_cluster.sh; sc_start N || exit $?; ...; sc_stop (also on EXIT via nc_cleanup)
# Inside the namespaces every port is free, so the standard Slurm ports cannot collide with other
# jobs; the first job id is random (suanli's Slurm rendezvous port derives from it). Returns 77 when
# slurm-wlm/munge or namespaces are missing.
. "$(dirname "${BASH_SOURCE[0]}")/../comm/netns_cluster.sh"

sc_skip() { echo "SKIP: $*"; return 77; }

sc_start() {
  local n=$1 h
  for p in munged slurmctld slurmd sbatch scontrol squeue; do
    command -v "$p" >/dev/null || { sc_skip "$p not found (apt-get install slurm-wlm munge)"; return 77; }
  done
  SC=$(mktemp -d /tmp/sl-slc.XXXXXX); chmod 700 "$SC"
  nc_setup $((n + 1)) none || return $?
  dd if=/dev/urandom of="$SC/munge.key" bs=1024 count=1 status=none; chmod 400 "$SC/munge.key"
  munged -F -f --key-file="$SC/munge.key" --socket="$SC/munge.sock" --pid-file="$SC/munged.pid" \
    --log-file="$SC/munged.log" --seed-file="$SC/munged.seed" >"$SC/munged.out" 2>&1 &
  SC_MUNGE=$!
  for _ in $(seq 50); do [ -S "$SC/munge.sock" ] && break; sleep 0.1; done
  [ -S "$SC/munge.sock" ] || { echo "FAIL: munged did not start"; return 1; }
  export SLURM_CONF=$SC/slurm.conf
  local nodes="" 
  for h in $(seq 1 "$n"); do nodes="$nodes${nodes:+,}h$h"; done
  cat > "$SLURM_CONF" <<EOC
ClusterName=slc
SlurmctldHost=h0($(nc_addr 0))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SC/munge.sock,cred_expire=5
CredType=cred/munge
StateSaveLocation=$SC/state
SlurmdSpoolDir=$SC/spool-%n
SlurmctldPidFile=$SC/slurmctld.pid
SlurmdPidFile=$SC/slurmd-%n.pid
SlurmctldLogFile=$SC/slurmctld.log
SlurmdLogFile=$SC/slurmd-%n.log
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
# short timeouts: a dead slurmd is declared down (and its jobs requeued) within seconds, and a requeued
# job may start again cred_expire seconds after its requeue (default 120)
SlurmdTimeout=8
SlurmctldTimeout=10
MessageTimeout=5
KillWait=2
InactiveLimit=0
MinJobAge=300
SchedulerParameters=bf_interval=2
FirstJobId=$((1000 + RANDOM * 16))
MailProg=/bin/true
EOC
  for h in $(seq 1 "$n"); do
    echo "NodeName=h$h NodeAddr=$(nc_addr "$h") CPUs=2 State=UNKNOWN" >> "$SLURM_CONF"
  done
  echo "PartitionName=sl Nodes=$nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >> "$SLURM_CONF"
  mkdir -p "$SC/state"
  nc_exec 0 slurmctld -D -c -i -f "$SLURM_CONF" >"$SC/slurmctld.out" 2>&1 &
  for h in $(seq 1 "$n"); do sc_slurmd_start "$h"; done
  local up=0
  for _ in $(seq 150); do
    up=$(sc sinfo -h -o "%t %N" -N 2>/dev/null | grep -c "^idle")
    [ "$up" -ge "$n" ] && break
    sleep 0.2
  done
  [ "$up" -ge "$n" ] || { echo "FAIL: $up of $n nodes idle"; sc sinfo -N 2>&1; tail -n 20 "$SC"/*.log; return 1; }
  return 0
}

# sc_wait_idle N: until N nodes are idle (a finished job's nodes are "completing" for a moment)
sc_wait_idle() {
  for _ in $(seq 150); do
    [ "$(sc sinfo -h -N -o %t 2>/dev/null | grep -c '^idle$')" -ge "$1" ] && return 0
    sleep 0.2
  done
  return 1
}

# sc CMD...: a Slurm client command (sbatch, squeue, scontrol...) run on the controller's host, the
# only place its address is reachable from
sc() { nc_exec 0 "$@"; }

# Each slurmd reads its own copy of slurm.conf, beside an mpi.conf of its own: the pretend hosts share one
# /tmp, where Slurm's PMIx plugin makes the same per-step client directory on every node (the second
# node's slurmstepd fails with "File exists" and srun --mpi=pmix never starts), so each host's goes to
# a directory of its own (PMIxCliTmpDirBase), as a real node's /tmp would be.
sc_slurmd_start() {
  local c=$SC/conf-h$1
  mkdir -p "$SC/spool-h$1" "$c" "$SC/tmp-h$1"
  cp "$SLURM_CONF" "$c/slurm.conf"
  echo "PMIxCliTmpDirBase=$SC/tmp-h$1" > "$c/mpi.conf"
  nc_exec "$1" env SLURM_CONF="$c/slurm.conf" slurmd -D -N "h$1" -f "$c/slurm.conf" >"$SC/slurmd-h$1.out" 2>&1 &
}

# every process in host H's namespace (its slurmd and the job's ranks there): SIGKILL
sc_kill_host() { for p in $(ip netns pids "${NC}h$1"); do kill -9 "$p" 2>/dev/null; done; }

sc_stop() {
  for h in $(seq 0 $((NC_HOSTS - 1))); do sc_kill_host "$h"; done
  [ -n "${SC_MUNGE:-}" ] && kill "$SC_MUNGE" 2>/dev/null
  nc_cleanup
  [ -n "${SC:-}" ] && rm -rf "$SC"
}
