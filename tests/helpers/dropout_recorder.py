"""Test helper hook imported by training subprocesses (``custom_imports``): records which entries
the model's first active dropout layer zeroed at every training iteration, to
``<work_dir>/dropout_rank<r>.json`` as ``{iteration: [sha1 of the mask, fraction dropped]}``."""
import hashlib
import json
import os.path as osp

import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class DropoutMaskRecorderHook(Hook):
    priority = 'LOWEST'

    def __init__(self):
        self.masks = {}
        self._iter = None

    def before_train(self, runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        dropout = next(m for m in model.modules() if isinstance(m, nn.Dropout) and m.p > 0)
        dropout.register_forward_hook(self._record)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._iter = runner.iter

    def _record(self, module, inputs, output):
        if not module.training or self._iter in self.masks:
            return
        dropped = (output == 0) & (inputs[0] != 0)  # the input is almost surely nonzero everywhere
        digest = hashlib.sha1(dropped.detach().cpu().numpy().tobytes()).hexdigest()
        self.masks[self._iter] = [digest, float(dropped.float().mean())]

    def after_train(self, runner):
        with open(osp.join(runner.work_dir, f'dropout_rank{get_rank()}.json'), 'w') as f:
            json.dump(self.masks, f)
