# A pretend cluster on one machine, sourced by the tests and benchmarks that need several hosts:
# H network namespaces ("hosts"), each with one veth link to a bridge in a switch namespace, its
# own address 10.88.0.(h+1)/24 and host name h<h> (SUANLI_COMM_HOSTNAME, and a UTS namespace for
# programs that read the host name themselves, such as OpenMPI). Nothing is created in the
# caller's namespace, so names and addresses cannot collide with other jobs, and every port inside
# a host is free.
#
# Shaping (nc_setup's RATE, e.g. 2gbit; "none" for none): each host's egress runs through a token
# bucket (tc tbf), so traffic between two hosts crosses exactly one shaped link per direction while
# ranks on one host use shared memory at memory speed. This kernel has no sch_netem (no added delay);
# the latency between hosts is the veth + TCP stack's own (measured by `bench/comm_hosts.sh`).
#
#   . netns_cluster.sh; nc_setup 2 2gbit || exit $?; nc_exec 0 CMD...; nc_cleanup (also on EXIT)
# nc_setup returns 77 where namespaces cannot be made (not root, no iproute2, no veth/bridge).

NC=sl$$
NC_HOSTS=0

nc_cleanup() {
  for h in $(seq 0 $((NC_HOSTS - 1))); do
    # processes still inside a host: end them before the namespace goes (only ours: ip netns pids)
    for p in $(ip netns pids ${NC}h$h 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del ${NC}h$h 2>/dev/null
  done
  ip netns del ${NC}sw 2>/dev/null
  NC_HOSTS=0
}

nc_addr() { echo 10.88.0.$(($1 + 1)); }

nc_setup() {
  n=$1; rate=$2
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1; then
    echo "SKIP: need root, iproute2 and unshare for network namespaces"; return 77
  fi
  ip netns add ${NC}sw 2>/dev/null || { echo "SKIP: cannot create network namespaces here"; return 77; }
  ip -n ${NC}sw link add br0 type bridge 2>/dev/null || { echo "SKIP: no bridge support"; ip netns del ${NC}sw; return 77; }
  ip -n ${NC}sw link set br0 up
  for h in $(seq 0 $((n - 1))); do
    ip netns add ${NC}h$h || return 1
    NC_HOSTS=$((h + 1))
    ip link add eth0 netns ${NC}h$h type veth peer name p$h netns ${NC}sw 2>/dev/null ||
      { echo "SKIP: no veth support"; return 77; }
    ip -n ${NC}sw link set p$h master br0 && ip -n ${NC}sw link set p$h up || return 1
    ip -n ${NC}h$h addr add $(nc_addr $h)/24 dev eth0 && ip -n ${NC}h$h link set eth0 up &&
      ip -n ${NC}h$h link set lo up || return 1
    if [ "$rate" != none ]; then
      # burst: at least one 64 KiB GSO segment plus headroom, else tbf drops what veth hands it
      ip netns exec ${NC}h$h tc qdisc add dev eth0 root tbf rate $rate burst 1mb latency 100ms ||
        { echo "SKIP: tc tbf is not available"; return 77; }
    fi
  done
  return 0
}

# nc_exec H CMD...: run CMD in host H (its network, its host name)
nc_exec() {
  h=$1; shift
  ip netns exec ${NC}h$h unshare --uts sh -c 'hostname "$0"; exec "$@"' h$h env SUANLI_COMM_HOSTNAME=h$h "$@"
}
