#!/bin/sh
# TCP between two network namespaces joined by a veth pair: a 2-node job (2 ranks per node) started
# by `suanli run --nnodes 2`, one launcher per namespace. Skipped (exit 77) where namespaces cannot
# be created (not root, no CAP_SYS_ADMIN, no iproute2).
# usage: netns_tcp.sh SUANLI_CLI TEST_PROGRAM
CLI=$1; PROG=$2
A=slA$$; B=slB$$
if ! command -v ip >/dev/null 2>&1 || ! ip netns add $A 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (need root and iproute2)"; exit 77
fi
cleanup() { ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; }
trap cleanup EXIT
ip netns add $B || exit 1
ip link add vA$$ type veth peer name vB$$ || { echo "SKIP: no veth support"; exit 77; }
ip link set vA$$ netns $A && ip link set vB$$ netns $B || exit 1
ip -n $A addr add 10.77.0.1/24 dev vA$$ && ip -n $B addr add 10.77.0.2/24 dev vB$$ || exit 1
ip -n $A link set vA$$ up && ip -n $B link set vB$$ up && ip -n $A link set lo up && ip -n $B link set lo up || exit 1
PORT=$((20000 + $$ % 20000))
export SUANLI_COMM_TRANSPORT=tcp SUANLI_COMM_TIMEOUT=60
ip netns exec $A "$CLI" run -n 2 --nnodes 2 --node-rank 0 --master 10.77.0.1:$PORT -- "$PROG" env > netns_node0.log 2>&1 &
P0=$!
ip netns exec $B "$CLI" run -n 2 --nnodes 2 --node-rank 1 --master 10.77.0.1:$PORT -- "$PROG" env > netns_node1.log 2>&1
R1=$?
wait $P0; R0=$?
cat netns_node0.log netns_node1.log
[ $R0 = 0 ] && [ $R1 = 0 ] || { echo "FAIL: node0 rc=$R0 node1 rc=$R1"; exit 1; }
for r in 0 1 2 3; do grep -q "\[$r\] rank $r/4 transport tcp: ok" netns_node0.log netns_node1.log || { echo "FAIL: rank $r"; exit 1; }; done
echo "netns tcp: ok"
