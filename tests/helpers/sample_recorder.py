"""Test helpers of the data path: which samples each process loaded, and which samples each iteration
trained on.

Training subprocesses import this module through ``custom_imports`` (``sample_recorder``):

* ``RecordLoads`` (a transform, first in the pipeline) appends the ``img_path`` of every sample that
  reaches the pipeline, i.e. every sample read and about to be decoded, to
  ``<out_dir>/loads_<pid>.txt`` (data-loader workers included);
* ``BatchRecorderHook`` writes ``{iteration: [img_path, ...]}`` of the trained batches, and the loss, to
  ``<work_dir>/batches.json`` when training ends (also when a data fault ends it); with ``per_rank=True``
  every rank writes its own, ``batches_rank<r>.json``.
"""
import glob
import json
import os
import os.path as osp

import torch
from mmcv.transforms import BaseTransform
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, TRANSFORMS


@TRANSFORMS.register_module()
class RecordLoads(BaseTransform):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def transform(self, results):
        with open(osp.join(self.out_dir, f'loads_{os.getpid()}.txt'), 'a') as f:
            f.write(results['img_path'] + '\n')
        return results


def read_loads(out_dir: str) -> list:
    """Every ``img_path`` that ``RecordLoads`` saw in ``out_dir``, over all processes."""
    loads = []
    for path in glob.glob(osp.join(out_dir, 'loads_*.txt')):
        with open(path) as f:
            loads += f.read().split()
    return loads


@HOOKS.register_module()
class BatchRecorderHook(Hook):
    priority = 'LOWEST'

    def __init__(self, per_rank: bool = False):
        self.batches = {}
        self.per_rank = per_rank

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        paths = [sample.img_path for sample in data_batch['data_samples']]
        self.batches[runner.iter] = dict(paths=paths, loss=float(torch.as_tensor(outputs['loss']).detach()))

    def after_train(self, runner):
        with open(osp.join(runner.work_dir, batches_file(get_rank() if self.per_rank else None)), 'w') as f:
            json.dump(self.batches, f)


def batches_file(rank=None) -> str:
    return 'batches.json' if rank is None else f'batches_rank{rank}.json'


def read_batches(work_dir: str, rank=None) -> dict:
    """Iteration -> ``{'paths': [...], 'loss': float}``; ``rank``: that rank's (``per_rank=True``)."""
    with open(osp.join(str(work_dir), batches_file(rank))) as f:
        return {int(k): v for k, v in json.load(f).items()}
