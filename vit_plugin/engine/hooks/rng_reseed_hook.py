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
    """The seed used for training step ``step`` (an epoch or an iteration) of process ``rank``.

    The processes of one step always get distinct seeds; no two (step, rank) pairs share one while
    there are fewer than 7919 processes.
    """
    return (int(seed) * _MIX + int(step) * 7919 + int(rank)) % (2 ** 32)


@HOOKS.register_module()
class RNGReseedHook(Hook):
    """Reseed Python, NumPy and torch at the start of every epoch (epoch-based loops) or every
    iteration (iteration-based loops) from the run's seed, the step counter and the process's rank.

    mmengine seeds the random generators once when the runner starts and does not store their
    states in checkpoints, so a run resumed with ``--resume`` draws different dropout masks and
    augmentations than the uninterrupted run would have, and its losses diverge. With this hook the
    random streams of a step depend only on (seed, rank, step), so a resumed run repeats the
    uninterrupted run exactly (on the same hardware and software, with deterministic kernels).

    Every data-parallel process draws its own stream: the dropout and drop-path masks, the MPP
    corruption plans and the host-side augmentations of one step differ across processes, as they
    do across the examples of one large batch on a single device. (Equal streams would repeat each
    process's masks on all the others: one global batch would carry only one process's share of
    randomness.) This does not depend on mmengine's ``randomness.diff_rank_seed``, which is best
    left off: it would also give every process its own initial weights (DDP replaces them with rank
    0's, FSDP keeps each process's shard of its own) and make the data sampler use a seed drawn at
    start-up instead of the configured one. Rank 0 draws what a single-process run draws. A strategy
    with a ``seed_device(seed)`` method reseeds its device's own generator too: under
    ``vit_plugin.XLAStrategy`` the XLA device generator (dropout on TPUs).

    Data-loader workers are already reseeded by mmengine each epoch from the seed and their rank;
    persistent workers (``persistent_workers=True``) keep their streams across epochs and are
    therefore only reproduced from the start of a run, not across a resume.

    Args:
        by_epoch (bool, optional): Reseed per epoch (True) or per iteration (False). Defaults to None:
            per iteration for ``IterBasedTrainLoop``, per epoch otherwise.
        per_rank (bool): Give every process its own stream. False repeats rank 0's draws on every
            process (e.g. to compare a multi-process run with a single-process one draw by draw).
            Defaults to True.
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
