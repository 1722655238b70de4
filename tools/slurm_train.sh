#!/usr/bin/env bash
# Train on a SLURM cluster: one task per GPU, started by srun (mmpretrain's / mmdet's interface).
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#       bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]
# e.g. GPUS=16 bash tools/slurm_train.sh gpu vit-l16 configs/vit_l16_in21k.py work_dirs/vit_l16 --amp --resume
#
# - --kill-on-bad-exit=1: when one task fails, srun ends the others instead of leaving them waiting in
#   a collective.
# - --signal=USR1@120 (SIGNAL_AT=120; empty switches it off): SLURM sends SIGUSR1 to every task 120 s
#   before the time limit. The run then saves a checkpoint and exits with status 75, like on
#   pre-emption or scancel (SIGTERM); the data-loader workers ignore both signals.
# - Requeue: pass --resume (it starts from scratch when the work dir has no checkpoint yet) and
#   resubmit or requeue the job when srun exits with 75, e.g. in an sbatch script with #SBATCH --requeue:
#       bash tools/slurm_train.sh ... --resume || { [ $? -eq 75 ] && scontrol requeue "$SLURM_JOB_ID"; }
#   (docs/scaling.md has the whole script.)
# Python: the project's virtualenv when there is one, else `python` (override with PYTHON=...).
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: [GPUS=8] bash $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]" >&2
    exit 1
fi
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(( GPUS < 8 ? GPUS : 8 ))}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SIGNAL_AT=${SIGNAL_AT-120}
read -r -a SRUN_EXTRA <<< "${SRUN_ARGS:-}"
default_python=python
if [ -x "$TOOLS_DIR/../.venv/bin/python" ]; then default_python="$TOOLS_DIR/../.venv/bin/python"; fi

PYTHONPATH="$TOOLS_DIR/..${PYTHONPATH:+:$PYTHONPATH}" \
exec srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    ${SIGNAL_AT:+--signal=USR1@"$SIGNAL_AT"} \
    ${SRUN_EXTRA[@]+"${SRUN_EXTRA[@]}"} \
    "${PYTHON:-$default_python}" -u "$TOOLS_DIR/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "$@"
