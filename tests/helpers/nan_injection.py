"""Test helper imported into training subprocesses via ``custom_imports``.

``NaNInjectionHook`` multiplies a loss term by NaN at chosen iterations (and ranks), which makes the
loss and every gradient NaN, as a bad batch or a diverging learning rate would.
``StateProbeHook`` snapshots parameters and optimizer state before chosen iterations and records,
per rank, whether the iteration left them bit-identical (``<work_dir>/probe_rank<r>.json``).
"""
import json
import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _module(model):
    return getattr(model, 'module', model)


@HOOKS.register_module()
class NaNInjectionHook(Hook):
    priority = 'VERY_HIGH'

    def __init__(self, iters, ranks=None, term='loss'):
        self.iters = set(iters)  # 1-based, as in the log
        self.ranks = None if ranks is None else set(ranks)
        self.term = term
        self._orig = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter + 1 not in self.iters or (self.ranks is not None and get_rank() not in self.ranks):
            return
        model = _module(runner.model)
        orig = self._orig = model.parse_losses
        term = self.term

        def parse_losses(losses):
            losses = dict(losses)
            losses[term] = losses[term] * float('nan')
            return orig(losses)

        model.parse_losses = parse_losses

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if self._orig is not None:
            vars(_module(runner.model)).pop('parse_losses', None)  # back to the class method
            self._orig = None


def _snapshot(runner):
    params = {k: v.detach().clone() for k, v in _module(runner.model).named_parameters()}
    state = runner.optim_wrapper.state_dict()
    flat = {}
    for idx, entry in state['state'].items():
        for key, value in entry.items():
            flat[f'{idx}.{key}'] = value.clone() if isinstance(value, torch.Tensor) else value
    return params, flat


def _identical(a, b):
    if set(a) != set(b):
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


@HOOKS.register_module()
class StateProbeHook(Hook):
    priority = 'HIGHEST'

    def __init__(self, iters):
        self.iters = set(iters)
        self.results = {}
        self._before = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter + 1 in self.iters:
            self._before = _snapshot(runner)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if self._before is None:
            return
        params, state = _snapshot(runner)
        self.results[runner.iter + 1] = dict(
            params_identical=_identical(self._before[0], params),
            state_identical=_identical(self._before[1], state),
            state_entries=len(state),
            params_finite=all(bool(torch.isfinite(p).all()) for p in params.values()))
        self._before = None
        with open(osp.join(runner.work_dir, f'probe_rank{get_rank()}.json'), 'w') as f:
            json.dump(self.results, f)
