#!/usr/bin/env bash
# Data-parallel evaluation on one machine with torchrun.
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py args...]
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash $0 CONFIG CHECKPOINT NUM_PROCS [test.py args...]" >&2
    exit 1
fi
source "$(dirname "$0")/torchrun_env.sh"
config=$1 checkpoint=$2 nprocs=$3
shift 3
run_torchrun "$nprocs" test.py "$config" "$checkpoint" --launcher pytorch "$@"
