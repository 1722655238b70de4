"""Reproducible resumption: random streams that depend only on (seed, rank, epoch or iteration)."""
import random

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.runner import IterBasedTrainLoop

from vit_plugin.registry import HOOKS

_MIX = 1_000_003  # a prime: (seed, step) pairs map to distinct 32-bit seeds for any realistic run


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """The seed of step ``step`` (epoch or iteration) of process ``rank``; distinct below 7919 ranks."""
    return (int(seed) * _MIX + int(step) * 7919 + int(rank)) % (2 ** 32)


@HOOKS.register_module()
class RNGReseedHook(Hook):
    """Reseed Python, NumPy, torch (and a strategy's ``seed_device``) from (seed, rank, step) at every step.

    A resumed run then draws what the uninterrupted run draws, and each process draws its own stream.
    See docs/configs.md#training-and-testing.

    Args:
        by_epoch (bool, optional): Reseed per epoch (True) or per iteration (False). Defaults to None:
            per iteration for ``IterBasedTrainLoop``, per epoch otherwise.
        per_rank (bool): Give every process its own stream. False repeats rank 0's draws on every
            process. Defaults to True.
    """
    priority = 'VERY_HIGH'  # before anything else of the epoch/iteration draws random numbers

    def __init__(self, by_epoch=None, per_rank: bool = True):
        self.by_epoch = by_epoch
        self.per_rank = per_rank

    def _by_epoch(self, runner) -> bool:
        if self.by_epoch is None:
            return not isinstance(runner.train_loop, IterBasedTrainLoop)
        return self.by_epoch

    def _reseed(self, runner, step: int) -> None:
        seed = step_seed(runner.seed, step, get_rank() if self.per_rank else 0)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # seeds every CUDA device too
        # A strategy whose device keeps its own generator (vit_plugin.XLAStrategy) seeds it as well.
        seed_device = getattr(getattr(runner, 'strategy', None), 'seed_device', None)
        if seed_device is not None:
            seed_device(seed)

    def before_train_epoch(self, runner) -> None:
        if self._by_epoch(runner):
            self._reseed(runner, runner.epoch)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not self._by_epoch(runner):
            self._reseed(runner, runner.iter)
