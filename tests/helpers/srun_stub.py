"""A stand-in for SLURM's ``srun`` on one machine, for testing ``tools/slurm_train.sh`` without SLURM.

It reads the options ``slurm_train.sh`` passes, writes them as JSON to ``$SRUN_STUB_LOG``, and runs the
command once per task (``--ntasks``) with the variables SLURM gives a task (``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODELIST``, ``SLURM_JOB_ID``...), all on this host. With
``--kill-on-bad-exit=1`` a failing task ends the others, as srun does; the exit status is the highest
of the tasks'. The test installs it as an executable named ``srun`` on ``PATH``.
"""
import json
import os
import subprocess
import sys
import time

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


def main():
    options, command = parse(sys.argv[1:])
    if os.environ.get('SRUN_STUB_LOG'):
        with open(os.environ['SRUN_STUB_LOG'], 'w') as f:
            json.dump(dict(options=options, command=command), f)
    ntasks = int(options.get('--ntasks', options.get('-n', 1)))
    per_node = int(options.get('--ntasks-per-node', ntasks))
    procs = []
    for rank in range(ntasks):
        env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node), SLURM_NTASKS=str(ntasks),
                   SLURM_NTASKS_PER_NODE=str(per_node), SLURM_NODEID=str(rank // per_node), SLURM_NNODES='1',
                   SLURM_NODELIST='localhost', SLURM_JOB_ID='4242', SLURM_STEP_ID='0',
                   SLURM_JOB_NAME=str(options.get('--job-name', options.get('-J', 'job'))),
                   SLURM_CPUS_PER_TASK=str(options.get('--cpus-per-task', 1)))
        procs.append(subprocess.Popen(command, env=env))
    kill_on_bad_exit = str(options.get('--kill-on-bad-exit', '0')) == '1'
    while any(p.poll() is None for p in procs):
        if kill_on_bad_exit and any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.1)
    sys.exit(max(p.returncode for p in procs))


if __name__ == '__main__':
    main()
