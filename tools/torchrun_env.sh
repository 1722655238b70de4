# Shared by dist_train.sh and dist_test.sh (sourced, not run): the torchrun invocation for one node of
# a (multi-node) job. Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
# Python: the project's virtualenv when there is one, else `python` (override with PYTHON=...).
# Usage after sourcing: run_torchrun NUM_PROCS SCRIPT [script args...]
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

run_torchrun() {
    local nprocs=$1 script=$2 default_python=python
    shift 2
    if [ -x "$TOOLS_DIR/../.venv/bin/python" ]; then default_python="$TOOLS_DIR/../.venv/bin/python"; fi
    PYTHONPATH="$TOOLS_DIR/..${PYTHONPATH:+:$PYTHONPATH}" \
    exec "${PYTHON:-$default_python}" -m torch.distributed.run \
        --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
        --nproc_per_node="$nprocs" --master_port="${PORT:-29500}" \
        "$TOOLS_DIR/$script" "$@"
}
