"""Test helper hook imported by training subprocesses (``custom_imports``): slows every training
iteration down by ``delay`` seconds and records progress in ``<work_dir>/progress_rank<r>`` as
``"<finished iterations> <process id>"``, so that a test can signal a run in the middle of training."""
import os
import os.path as osp
import time

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class PacingHook(Hook):
    priority = 'HIGHEST'

    def __init__(self, delay=0.0):
        self.delay = delay

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        path = osp.join(runner.work_dir, f'progress_rank{get_rank()}')
        with open(path + '.tmp', 'w') as f:
            f.write(f'{runner.iter + 1} {os.getpid()}')
        os.replace(path + '.tmp', path)
        time.sleep(self.delay)
