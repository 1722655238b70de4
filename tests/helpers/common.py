"""Functions shared by several test modules."""
import logging
import json
import os
import os.path as osp
import socket
import sys

import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
HELPERS = osp.join(REPO, 'tests', 'helpers')


def free_port() -> int:
    """A TCP port that is free now (for a rendezvous that must not meet another run's)."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def read_bytes(path) -> bytes:
    """The contents of the file at ``path``."""
    with open(path, 'rb') as f:
        return f.read()


def read_losses(work_dir, rank: int = 0) -> dict:
    """Iteration -> loss of ``rank``, as written by ``LossRecorderHook`` (loss_recorder.py)."""
    with open(osp.join(str(work_dir), f'losses_rank{rank}.json')) as f:
        return {int(k): v for k, v in json.load(f).items()}


#: Processes of the multi-process tests (DDP, FSDP2, SLURM tasks).
RANKS = 2


def run_env() -> dict:
    """Environment of a training subprocess: one thread, the repository and these helpers importable
    (``custom_imports``), ``PYTHON`` for the launch scripts, and no XLA device (plain CPU training).
    ``USE_TORCH_XLA=0`` keeps transformers, which mmengine's optimizer registry imports, from importing
    torch_xla (2 s of each process's start on the classic stack); our XLA launch imports it itself.

    With fewer GPUs than the multi-process tests start ranks (one GPU, say), the GPUs are hidden, so
    every training subprocess of the tests runs on the CPU with Gloo, and runs compared with each other
    run on the same device."""
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join([REPO, HELPERS]),
               PYTHON=sys.executable, USE_TORCH_XLA='0')
    env.pop('PJRT_DEVICE', None)
    if torch.cuda.is_available() and torch.cuda.device_count() < RANKS:
        env['CUDA_VISIBLE_DEVICES'] = ''
    return env


class LogLines(logging.Handler):
    """A logging handler that keeps the messages of INFO and above in ``lines``."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())
