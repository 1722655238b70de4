"""Test helper hook: every rank records the loss of every iteration (mmengine logs only rank 0's).

Training subprocesses import it through ``custom_imports`` (``loss_recorder``) and read
``<work_dir>/losses_rank<r>.json`` afterwards; in-process runs read :attr:`LossRecorderHook.losses`.
"""
import json
import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class LossRecorderHook(Hook):
    """Keeps ``{iteration: loss}`` (iterations counted from 0) and writes it when training ends."""
    priority = 'LOWEST'

    def __init__(self):
        self.losses = {}

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses[runner.iter] = float(torch.as_tensor(outputs['loss']).detach())  # runner.iter: this iteration, from 0

    def after_train(self, runner):
        with open(osp.join(runner.work_dir, f'losses_rank{get_rank()}.json'), 'w') as f:
            json.dump(self.losses, f)
