"""Training runs that start from imports already made instead of a fresh interpreter each (3-8 s of
imports per process): ``tools/train.py``'s code (:mod:`vit_plugin.cli.train`) in the test process, and
several ranks of a tool (``--launcher pytorch``, or the variables another launcher sets) as forked
processes, each the whole work of its process as in the script (``run_as_script``). For runs whose
launch is not what a test checks (an uninterrupted reference, a resume to the end); what a launcher does
on a signal or a failure is tested through ``tools/train.py`` / ``tools/dist_train.sh`` subprocesses.

The ranks fork from a server process that imports the stack once and never trains (:func:`serve`, one
per test process), never from the test process itself: once a process has run backward passes, its
autograd engine may hold threads that a forked child cannot use (a GPU's or an XLA device's, and on the
CPU too after some earlier tests), and the child then fails at its first backward pass. Every run has
one intra-op thread, as the training subprocesses have (``OMP_NUM_THREADS=1``), so that its losses are
comparable to the last bit with those of subprocess runs of the same config. The hooks a config names
through ``custom_imports`` are imported as ``helpers.<module>`` here: :func:`warm_config` makes such a
config of a config for subprocesses."""
import atexit
import importlib
import json
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
from helpers.in_process import Outcome, helper_modules, train_in_process
from helpers.subprocess_like import one_thread
from vit_plugin.cli.launch import run_as_script
from vit_plugin.cli.train import main as train_main

_SERVER = None


def warm_config(cfg, name, imports=('loss_recorder', 'pacing')) -> str:
    """A config next to ``cfg`` (a config for training subprocesses), named ``name``.py, that imports
    ``imports`` (hook modules of tests/helpers) as ``helpers.<module>``; a config of its own name per run
    (the run's logger is named after it)."""
    path = osp.join(osp.dirname(str(cfg)), f'{name}.py')
    modules = helper_modules(imports, in_process=True)
    with open(path, 'w') as f:
        f.write(f'_base_ = [{str(cfg)!r}]\n'
                f'custom_imports = dict(imports={modules!r}, allow_failed_imports=False)\n')
    return path


def train_here(cfg, work_dir, *extra) -> Outcome:
    """``tools/train.py cfg --work-dir work_dir *extra`` in this process, on one thread; a subprocess
    where torch sees a GPU (the test process would train on it, the training subprocesses on what
    ``run_env`` leaves them: runs compared with each other share a device)."""
    if torch.cuda.is_available():
        proc = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'train.py'), str(cfg), '--work-dir',
                               str(work_dir), *extra], env=_server_env(), capture_output=True, text=True,
                              timeout=300, cwd=REPO)
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


def _fork_tasks(main: Callable, argv: List[str], envs: List[dict], logs: List[str], timeout: float) -> int:
    """Fork one task per environment, wait for all (a failing task ends the others after 5 s); the highest
    exit status."""
    pids = []
    for env, log in zip(envs, logs):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _task(main, argv, env, log)
        pids.append(pid)
    codes, kill_at = {}, None
    deadline = time.time() + timeout
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        now = time.time()
        if kill_at is None and (any(codes.values()) or now > deadline):
            kill_at = now if now > deadline else now + 5  # after a failure, the others' own exit first
        if kill_at is not None and now >= kill_at:
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)  # not reaped yet: still this process's child
            kill_at = float('inf')  # once
        time.sleep(0.05)
    return max(codes.values())


def _server_env() -> dict:
    """The training subprocesses' environment, ``helpers.<module>`` importable (tests/ on the path)."""
    env = run_env()
    return dict(env, PYTHONPATH=os.pathsep.join([osp.join(REPO, 'tests'), env['PYTHONPATH']]))


def serve(answers_fd: int) -> None:
    """The fork server: per line of stdin a JSON request ``[module, argv, envs, logs, timeout]``, answered
    on ``answers_fd`` with a line of the highest exit status of ``module.main`` forked once per
    environment."""
    answers = os.fdopen(answers_fd, 'w', buffering=1)
    for line in sys.stdin:
        module, argv, envs, logs, timeout = json.loads(line)
        answers.write(f'{_fork_tasks(importlib.import_module(module).main, argv, envs, logs, timeout)}\n')


def _server() -> subprocess.Popen:
    """This process's fork server, started on first use; it ends with this process (its stdin closes)."""
    global _SERVER
    if _SERVER is None or _SERVER.poll() is not None:
        # the answers on the stdout the server is given, whatever else it prints (imports too) on stderr
        start = 'import os; fd = os.dup(1); os.dup2(2, 1); from helpers.warm_runs import serve; serve(fd)'
        _SERVER = subprocess.Popen([sys.executable, '-c', start],
                                   env=_server_env(), cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
        atexit.register(_stop_server, _SERVER)
    return _SERVER


def _stop_server(server: subprocess.Popen) -> None:
    """End the fork server: its stdin closes, it leaves its loop and is reaped here."""
    server.stdin.close()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def run_forks(main, argv, envs, logs, timeout=300) -> Outcome:
    """A tool's ``main`` (``vit_plugin.cli.<tool>.main``) on the command line ``argv`` as one forked process
    per environment of ``envs`` (the whole environment of that task), each writing to its file of ``logs``.
    Waits for all (a failing task ends the others after 5 s, as torchrun and ``srun --kill-on-bad-exit``
    do); returns the highest exit status and every task's output, in the order of ``envs``."""
    argv, logs = [str(a) for a in argv], [str(log) for log in logs]
    server = _server()
    server.stdin.write(json.dumps([main.__module__, argv, envs, logs, timeout]) + '\n')
    server.stdin.flush()
    answer = server.stdout.readline()
    assert answer, 'the fork server ended'
    code = int(answer)
    output = ''
    for log in logs:
        with open(log) as f:
            output += f.read()
    return Outcome(code, None, output)


def train_ranks(cfg, work_dir, *extra, procs=2, timeout=300) -> Outcome:
    """``tools/train.py cfg --work-dir work_dir --launcher pytorch *extra`` as ``procs`` forked ranks with
    the variables torchrun sets (their output in ``work_dir/rank<r>.out``)."""
    os.makedirs(str(work_dir), exist_ok=True)
    port = str(free_port())
    envs = [dict(run_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(procs),
                 LOCAL_WORLD_SIZE=str(procs), GROUP_RANK='0', MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
            for rank in range(procs)]
    logs = [osp.join(str(work_dir), f'rank{rank}.out') for rank in range(procs)]
    return run_forks(train_main, [cfg, '--work-dir', work_dir, '--launcher', 'pytorch', *extra], envs, logs, timeout)
