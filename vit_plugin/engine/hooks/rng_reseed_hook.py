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
    """The seed used for training step ``step`` (an epoch or an iteration) of ``rank``."""
    return (int(seed) * _MIX + int(step) * 7919 + int(rank)) % (2 ** 32)


@HOOKS.register_module()
class RNGReseedHook(Hook):
    """Reseed Python, NumPy and torch at the start of every epoch (epoch-based loops) or every
    iteration (iteration-based loops) from the run's seed and the step counter.

    mmengine seeds the random generators once when the runner starts and does not store their
    states in checkpoints, so a run resumed with ``--resume`` draws different dropout masks and
    augmentations than the uninterrupted run would have, and its losses diverge. With this hook the
    random streams of a step depend only on (seed, rank, step), so a resumed run repeats the
    uninterrupted run exactly (on the same hardware and software, with deterministic kernels).
    Data-loader workers are already reseeded by mmengine each epoch from the same seed; persistent
    workers (``persistent_workers=True``) keep their streams across epochs and are therefore only
    reproduced from the start of a run, not across a resume.

    Args:
        by_epoch (bool, optional): Reseed per epoch (True) or per iteration (False). Defaults to None:
            per iteration for ``IterBasedTrainLoop``, per epoch otherwise.
    """
    priority = 'VERY_HIGH'  # before anything else of the epoch/iteration draws random numbers

    def __init__(self, by_epoch=None):
        self.by_epoch = by_epoch

    def _by_epoch(self, runner) -> bool:
        if self.by_epoch is None:
            return not isinstance(runner.train_loop, IterBasedTrainLoop)
        return self.by_epoch

    def _reseed(self, runner, step: int) -> None:
        diff_rank = runner._randomness_cfg.get('diff_rank_seed', False)  # mmengine keeps it private
        seed = step_seed(runner.seed, step, get_rank() if diff_rank else 0)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # seeds every CUDA device too

    def before_train_epoch(self, runner) -> None:
        if self._by_epoch(runner):
            self._reseed(runner, runner.epoch)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not self._by_epoch(runner):
            self._reseed(runner, runner.iter)
