"""Test helper hook: what a training run did, as rank 0 saw it, for comparing entry points.

Training subprocesses import it through ``custom_imports`` (``run_recorder``) and write
``<work_dir>/run_record.json`` when training ends: the runner's class, its hooks (class names, in the
order they run), the optimizer wrapper's accumulation, the optimizer's kernel choice (``fused``), the
loop's ``max_iters``, and for every iteration (from 0) its loss and the learning rate it trained with.
"""
import json
import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class RunRecorderHook(Hook):
    priority = 'LOWEST'

    def __init__(self):
        self.record = dict(losses={}, lrs={})

    def before_train(self, runner):
        self.record.update(runner=type(runner).__name__, hooks=[type(hook).__name__ for hook in runner.hooks],
                           accumulative_counts=runner.optim_wrapper._accumulative_counts,
                           fused=bool(runner.optim_wrapper.optimizer.defaults.get('fused')),
                           max_iters=runner.max_iters)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.record['lrs'][runner.iter] = runner.optim_wrapper.get_lr()['lr'][0]

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.record['losses'][runner.iter] = float(torch.as_tensor(outputs['loss']).detach())

    def after_train(self, runner):
        if get_rank() == 0:
            with open(osp.join(runner.work_dir, 'run_record.json'), 'w') as f:
                json.dump(self.record, f)


def read_record(work_dir) -> dict:
    """What :class:`RunRecorderHook` wrote, with iteration keys as ints."""
    with open(osp.join(str(work_dir), 'run_record.json')) as f:
        record = json.load(f)
    for key in ('losses', 'lrs'):
        record[key] = {int(k): v for k, v in record[key].items()}
    return record
