#!/usr/bin/env bash
# Data-parallel evaluation on one machine with torchrun.
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py args...]
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash $0 CONFIG CHECKPOINT NUM_PROCS [test.py args...]" >&2
    exit 1
fi
CONFIG=$1
CHECKPOINT=$2
NPROCS=$3
shift 3
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
    "$HERE/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
