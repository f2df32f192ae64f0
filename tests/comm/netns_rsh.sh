#!/bin/sh
# OpenMPI's rsh agent for the namespace cluster of netns_cluster.sh (--mca plm_rsh_agent): instead of
# ssh HOST CMD, run CMD (one shell string, as ssh would) inside host HOST's namespace with its host
# name (UTS namespace, and SUANLI_COMM_HOSTNAME: the agent inherits mpirun's environment, whose
# value names mpirun's host). NC and NC_DIR (the cluster's prefix and folder) come from the environment of mpirun.
while [ "${1#-}" != "$1" ]; do shift; done # ssh-style options
h=$1; shift
SUANLI_COMM_HOSTNAME=$h exec nsenter --net="/run/netns/${NC}$h" unshare --uts --mount \
  sh -c "hostname $h; mount --bind $NC_DIR/hosts /etc/hosts; $*"
