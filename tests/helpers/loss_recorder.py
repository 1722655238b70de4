"""Test helper imported into training subprocesses via ``custom_imports``: every rank records the
loss of every iteration (mmengine logs only rank 0's) to ``<work_dir>/losses_rank<r>.json``."""
import json
import os.path as osp

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class LossRecorderHook(Hook):
    priority = 'LOWEST'

    def __init__(self):
        self.losses = {}

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses[runner.iter] = float(outputs['loss'])  # runner.iter: this iteration, from 0

    def after_train(self, runner):
        with open(osp.join(runner.work_dir, f'losses_rank{get_rank()}.json'), 'w') as f:
            json.dump(self.losses, f)
