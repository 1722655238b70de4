"""A stand-in for SLURM's ``srun`` on one machine, for testing ``tools/slurm_train.sh`` without SLURM.

It reads the options ``slurm_train.sh`` passes and writes them, the command and the environment as JSON
to ``$SRUN_STUB_LOG``. The test installs it as an executable named ``srun`` on ``PATH``, then starts the
command once per task (``--ntasks``), on this host, with the variables :func:`task_env` gives each task
as SLURM does (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODELIST``, ``SLURM_JOB_ID``...).
"""
import json
import os
import sys

# srun options that take their value as the next argument (the rest are --key=value or flags)
WITH_VALUE = {'-p', '--partition', '-J', '--job-name', '-n', '--ntasks', '-c', '--cpus-per-task'}


def parse(argv):
    options, i = {}, 0
    while i < len(argv) and argv[i].startswith('-'):
        arg = argv[i]
        if '=' in arg:
            key, value = arg.split('=', 1)
        elif arg in WITH_VALUE:
            key, value = arg, argv[i + 1]
            i += 1
        else:
            key, value = arg, True
        options[key] = value
        i += 1
    return options, argv[i:]


def ntasks(options):
    """The number of tasks the srun ``options`` ask for."""
    return int(options.get('--ntasks', options.get('-n', 1)))


def task_env(options, rank):
    """The variables SLURM gives task ``rank`` of a job step started with the srun ``options``."""
    tasks = ntasks(options)
    per_node = int(options.get('--ntasks-per-node', tasks))
    return dict(SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node), SLURM_NTASKS=str(tasks),
                SLURM_NTASKS_PER_NODE=str(per_node), SLURM_NODEID=str(rank // per_node), SLURM_NNODES='1',
                SLURM_NODELIST='localhost', SLURM_JOB_ID='4242', SLURM_STEP_ID='0',
                SLURM_JOB_NAME=str(options.get('--job-name', options.get('-J', 'job'))),
                SLURM_CPUS_PER_TASK=str(options.get('--cpus-per-task', 1)))


def main():
    options, command = parse(sys.argv[1:])
    with open(os.environ['SRUN_STUB_LOG'], 'w') as f:
        json.dump(dict(options=options, command=command, env=dict(os.environ)), f)


if __name__ == '__main__':
    main()
