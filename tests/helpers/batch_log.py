"""Test helper hook imported by training subprocesses (``custom_imports``): every rank records the
``img_path`` of each sample of each trained batch, and the loss, in ``<work_dir>/batches_rank<r>.json``
when training ends (also when a data fault ends it)."""
import json
import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class RankBatchRecorderHook(Hook):
    priority = 'LOWEST'

    def __init__(self):
        self.batches = {}

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        paths = [sample.img_path for sample in data_batch['data_samples']]
        self.batches[runner.iter] = dict(paths=paths, loss=float(torch.as_tensor(outputs['loss']).detach()))

    def after_train(self, runner):
        with open(osp.join(runner.work_dir, f'batches_rank{get_rank()}.json'), 'w') as f:
            json.dump(self.batches, f)


def read_rank_batches(work_dir, rank: int = 0) -> dict:
    """Iteration -> ``{'paths': [...], 'loss': float}`` of ``rank``."""
    with open(osp.join(str(work_dir), f'batches_rank{rank}.json')) as f:
        return {int(k): v for k, v in json.load(f).items()}
