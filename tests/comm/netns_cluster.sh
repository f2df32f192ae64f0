# A pretend cluster on one machine, sourced by the tests and benchmarks that need several hosts:
# H network namespaces ("hosts"), each with one veth link to a bridge in a switch namespace, its
# own address 10.88.0.(h+1)/24 and host name h<h> (SUANLI_COMM_HOSTNAME, and a UTS namespace for
# programs that read the host name themselves, such as OpenMPI). Nothing is created in the
# caller's namespace, so names and addresses cannot collide with other jobs, and every port inside
# a host is free.
#
# Shaping (nc_setup's RATE, e.g. 2gbit; "none" for none): each host's egress runs through a token
# bucket (tc tbf), so traffic between two hosts crosses exactly one shaped link per direction while
# ranks on one host use shared memory at memory speed.
#
# Latency (nc_setup's third argument, microseconds one way; NC_DELAYLINE names the sl_delayline binary):
# this kernel has no sch_netem, so instead of the bridge a user-space switch (tests/comm/delayline.c) runs
# in the switch namespace and forwards every frame DELAY us after it arrived. Both suanli's TCP transport
# and OpenMPI's cross it. Without a delay the hosts meet on the kernel bridge, and the latency between
# them is the veth + TCP stack's own (measured by `bench/comm_hosts.sh`).
#
#   . netns_cluster.sh; nc_setup 2 2gbit [DELAY_US] || exit $?; nc_exec 0 CMD...; nc_cleanup (also on EXIT)
# nc_setup returns 77 where namespaces cannot be made (not root, no iproute2, no veth/bridge).

NC=sl$$
NC_HOSTS=0

nc_cleanup() {
  # the delay line first, then the hosts: processes still inside a namespace (only ours: ip netns pids)
  for p in $(ip netns pids ${NC}sw 2>/dev/null); do kill "$p" 2>/dev/null; done
  for _nc_h in $(seq 0 $((NC_HOSTS - 1))); do
    # processes still inside a host: end them before the namespace goes (only ours: ip netns pids)
    for p in $(ip netns pids ${NC}h$_nc_h 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del ${NC}h$_nc_h 2>/dev/null
  done
  ip netns del ${NC}sw 2>/dev/null
  [ -n "${NC_DIR:-}" ] && rm -rf "$NC_DIR"
  NC_HOSTS=0
}

nc_addr() { echo 10.88.0.$(($1 + 1)); }

nc_setup() {
  _nc_n=$1; _nc_rate=$2; _nc_delay=${3:-} # (no `local` in POSIX sh: names the callers will not use)
  if [ -n "$_nc_delay" ] && [ ! -x "${NC_DELAYLINE:-}" ]; then
    echo "nc_setup: a delay needs NC_DELAYLINE, the path of the sl_delayline binary (now '${NC_DELAYLINE:-}')" >&2
    return 2
  fi
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1 ||
     ! command -v nsenter >/dev/null 2>&1; then
    echo "SKIP: need root, iproute2 and util-linux (unshare, nsenter) for network namespaces"; return 77
  fi
  ip netns add ${NC}sw 2>/dev/null || { echo "SKIP: cannot create network namespaces here"; return 77; }
  NC_DIR=$(mktemp -d /tmp/sl-nc.XXXXXX)
  printf '127.0.0.1 localhost\n' > "$NC_DIR/hosts"
  ip -n ${NC}sw link add br0 type bridge 2>/dev/null || { echo "SKIP: no bridge support"; ip netns del ${NC}sw; return 77; }
  ip -n ${NC}sw link set br0 up
  for _nc_h in $(seq 0 $((_nc_n - 1))); do
   
    ip netns add ${NC}h$_nc_h || return 1
    NC_HOSTS=$((_nc_h + 1))
    echo "$(nc_addr $_nc_h) h$_nc_h" >> "$NC_DIR/hosts"
    ip link add eth0 netns ${NC}h$_nc_h type veth peer name p$_nc_h netns ${NC}sw 2>/dev/null ||
      { echo "SKIP: no veth support"; return 77; }
    if [ -z "$_nc_delay" ]; then ip -n ${NC}sw link set p$_nc_h master br0 || return 1; fi
    ip -n ${NC}sw link set p$_nc_h up || return 1
    ip -n ${NC}h$_nc_h addr add $(nc_addr $_nc_h)/24 dev eth0 && ip -n ${NC}h$_nc_h link set eth0 up &&
      ip -n ${NC}h$_nc_h link set lo up || return 1
    if [ "$_nc_rate" != none ]; then
      # burst: at least one 64 KiB GSO segment plus headroom, else tbf drops what veth hands it
      ip netns exec ${NC}h$_nc_h tc qdisc add dev eth0 root tbf rate $_nc_rate burst 1mb latency 100ms ||
        { echo "SKIP: tc tbf is not available"; return 77; }
    fi
  done
  if [ -n "$_nc_delay" ]; then
    _nc_ports=""; for _nc_h in $(seq 0 $((_nc_n - 1))); do _nc_ports="$_nc_ports p$_nc_h"; done
    # started from a subshell, so it is not this shell's child and a caller's bare `wait` returns
    # shellcheck disable=SC2086
    (nsenter --net=/run/netns/${NC}sw "$NC_DELAYLINE" "$_nc_delay" $_nc_ports \
      > "$NC_DIR/delayline.out" 2> "$NC_DIR/delayline.err" < /dev/null &)
    _nc_t=0
    until grep -q ready "$NC_DIR/delayline.out" 2>/dev/null; do
      if [ $_nc_t -ge 50 ] || [ -s "$NC_DIR/delayline.err" ]; then
        echo "nc_setup: the delay line did not start: $(cat "$NC_DIR/delayline.err")" >&2; return 1
      fi
      sleep 0.1; _nc_t=$((_nc_t + 1))
    done
  fi
  return 0
}

# nc_delayline_stats: stop the delay line and print its counts (received, sent, dropped, lateness)
nc_delayline_stats() {
  for p in $(ip netns pids ${NC}sw 2>/dev/null); do kill "$p" 2>/dev/null; done
  _nc_t=0
  while [ -n "$(ip netns pids ${NC}sw 2>/dev/null)" ] && [ $_nc_t -lt 50 ]; do sleep 0.1; _nc_t=$((_nc_t + 1)); done
  cat "$NC_DIR/delayline.err" 2>/dev/null
}

# nc_exec H CMD...: run CMD in host H (its network, its host name, an /etc/hosts naming every host,
# bind-mounted in a private mount namespace). nsenter, not `ip netns exec`: the latter also remounts
# /sys for the namespace, which hides /sys/fs/cgroup (slurmd needs it)
nc_exec() {
  _nc_h=$1; shift
  nsenter --net=/run/netns/${NC}h$_nc_h unshare --uts --mount \
    sh -c 'hostname "$0"; mount --bind "$1" /etc/hosts; shift; exec "$@"' h$_nc_h "$NC_DIR/hosts" \
    env SUANLI_COMM_HOSTNAME=h$_nc_h "$@"
}
