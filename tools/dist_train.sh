#!/usr/bin/env bash
# Data-parallel training on one machine with torchrun (DDP; add --fsdp to shard the model).
#   bash tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
# On CPU-only hosts the Gloo backend is used automatically.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash $0 CONFIG NUM_PROCS [train.py args...]" >&2
    exit 1
fi
source "$(dirname "$0")/torchrun_env.sh"
config=$1 nprocs=$2
shift 2
run_torchrun "$nprocs" train.py "$config" --launcher pytorch "$@"
