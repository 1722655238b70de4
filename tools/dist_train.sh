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
CONFIG=$1
NPROCS=$2
shift 2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
HERE="$(cd "$(dirname "$0")" && pwd)"
# The project's virtualenv when there is one, else whatever `python` is (override with PYTHON=...).
if [ -x "$HERE/../.venv/bin/python" ]; then DEFAULT_PYTHON="$HERE/../.venv/bin/python"; else DEFAULT_PYTHON=python; fi
PYTHON=${PYTHON:-$DEFAULT_PYTHON}

PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROCS" --master_port="$PORT" \
    "$HERE/train.py" "$CONFIG" --launcher pytorch "$@"
