"""Training runs that start from the test process's imports instead of a fresh interpreter (3-8 s of
imports per process): ``tools/train.py``'s code (:mod:`vit_plugin.cli.train`) in the test process, and
several ranks of it (``--launcher pytorch``) as forks of the test process (Gloo on the CPU, the variables
torchrun sets), each the whole work of its process as in the script (``run_as_script``). For runs whose
launch is not what a test checks (an uninterrupted reference, a resume to the end); what a launcher does
on a signal or a failure is tested through ``tools/train.py`` / ``tools/dist_train.sh`` subprocesses.

Both run with one intra-op thread, as the training subprocesses do (``OMP_NUM_THREADS=1``), so that
their losses are comparable to the last bit with those of subprocess runs of the same config. The hooks
a config names through ``custom_imports`` are imported as ``helpers.<module>`` here: use
:func:`warm_config` for a config written for subprocesses. Where torch sees a GPU, every run is a
``tools/<tool>.py`` subprocess instead (:data:`FRESH_PROCESSES`)."""
import contextlib
import os
import os.path as osp
import signal
import subprocess
import sys
import time
import traceback
from typing import Callable, List

import torch

from helpers.common import REPO, free_port, run_env
from helpers.in_process import Outcome, train_in_process
from vit_plugin.cli.launch import run_as_script
from vit_plugin.cli.train import main as train_main


#: Runs start fresh interpreters (``tools/<tool>.py`` subprocesses): a fork cannot use the GPU of a test
#: process that has, and the test process would train on a GPU that ``run_env`` hides from the training
#: subprocesses where there are fewer GPUs than ranks; runs compared with each other share a device.
FRESH_PROCESSES = torch.cuda.is_available()


def _script(main: Callable) -> str:
    """``tools/<tool>.py`` of ``vit_plugin.cli.<tool>.main``."""
    return osp.join(REPO, 'tools', main.__module__.rsplit('.', 1)[-1] + '.py')


def _fresh_env(env: dict) -> dict:
    """``env`` for a fresh interpreter that imports ``helpers.<module>`` (tests/ on its path)."""
    return dict(env, PYTHONPATH=os.pathsep.join([osp.join(REPO, 'tests'), env.get('PYTHONPATH', '')]))


def warm_config(cfg, name, imports=('loss_recorder', 'pacing')) -> str:
    """A config next to ``cfg`` (a config for training subprocesses), named ``name``.py, that imports
    ``imports`` (hook modules of tests/helpers) as ``helpers.<module>``; a config of its own name per run
    (the run's logger is named after it)."""
    path = osp.join(osp.dirname(str(cfg)), f'{name}.py')
    modules = ['vit_plugin'] + [f'helpers.{m}' for m in imports]
    with open(path, 'w') as f:
        f.write(f'_base_ = [{str(cfg)!r}]\n'
                f'custom_imports = dict(imports={modules!r}, allow_failed_imports=False)\n')
    return path


@contextlib.contextmanager
def one_thread():
    """One intra-op thread for the duration, as ``OMP_NUM_THREADS=1`` gives a subprocess."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_here(cfg, work_dir, *extra) -> Outcome:
    """``tools/train.py cfg --work-dir work_dir *extra`` in this process, on one thread."""
    if FRESH_PROCESSES:
        proc = subprocess.run([sys.executable, _script(train_main), str(cfg), '--work-dir', str(work_dir), *extra],
                              env=_fresh_env(run_env()), capture_output=True, text=True, timeout=300, cwd=REPO)
        return Outcome(proc.returncode, None, proc.stdout + proc.stderr)
    with one_thread():
        return train_in_process(cfg, work_dir, *extra)


def _task(main: Callable, argv: List[str], env: dict, log: str) -> None:
    """A forked task: its output to ``log``, the environment ``env``, the tool's ``main`` on ``argv`` as
    the whole work of the process; exits."""
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = open(1, 'w', buffering=1, closefd=False)
        sys.stderr = open(2, 'w', buffering=1, closefd=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        torch.set_num_threads(1)
        sys.argv = [main.__module__, *argv]
        try:
            run_as_script(main)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: B902 - whatever ends the task is reported in its log
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_forks(main, argv, envs, logs, timeout=300) -> Outcome:
    """A tool's ``main`` (``vit_plugin.cli.<tool>.main``) on the command line ``argv`` as one fork of this
    process per environment of ``envs`` (the whole environment of that task), each writing to its file of
    ``logs``. Waits for all (a failing task ends the others after 5 s, as torchrun and ``srun
    --kill-on-bad-exit`` do); returns the highest exit status and every task's output, in the order of
    ``envs``. With :data:`FRESH_PROCESSES`, each task is a ``tools/<tool>.py`` subprocess instead."""
    pids, argv = [], [str(a) for a in argv]
    for env, log in zip(envs, logs):
        if FRESH_PROCESSES:
            with open(log, 'w') as out:
                proc = subprocess.Popen([sys.executable, _script(main), *argv], env=_fresh_env(env), cwd=REPO,
                                        stdout=out, stderr=subprocess.STDOUT)
            proc.returncode = 0  # reaped below, not by Popen
            pids.append(proc.pid)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _task(main, argv, env, str(log))
        pids.append(pid)
    codes, killed = {}, False
    deadline = time.time() + timeout
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if not killed and len(codes) < len(pids) and (any(codes.values()) or time.time() > deadline):
            if time.time() < deadline:
                time.sleep(5)  # the others' own exit first
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)  # not reaped yet: still this process's child
            killed = True
        time.sleep(0.05)
    output = ''
    for log in logs:
        with open(log) as f:
            output += f.read()
    return Outcome(max(codes.values()), None, output)


def train_ranks(cfg, work_dir, *extra, procs=2, timeout=300) -> Outcome:
    """``tools/train.py cfg --work-dir work_dir --launcher pytorch *extra`` as ``procs`` forks of this
    process with the variables torchrun sets (their output in ``work_dir/rank<r>.out``)."""
    os.makedirs(str(work_dir), exist_ok=True)
    port = str(free_port())
    envs = []
    for rank in range(procs):
        env = dict(run_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(procs),
                   LOCAL_WORLD_SIZE=str(procs), GROUP_RANK='0', MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
        envs.append(env)
    logs = [osp.join(str(work_dir), f'rank{rank}.out') for rank in range(procs)]
    return run_forks(train_main, [cfg, '--work-dir', work_dir, '--launcher', 'pytorch', *extra], envs, logs, timeout)
