#!/bin/sh
# Open MPI's remote-shell agent for the two-host test: "hosts" are network namespaces
# named after their address (dcpserve-10.231.7.2 for 10.231.7.2); the command runs in
# that namespace instead of over ssh. mpirun passes: HOST COMMAND...
host="$1"
shift
exec ip netns exec "dcpserve-$host" /bin/sh -c "$*"
