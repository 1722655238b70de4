"""``vit_plugin.IterBasedTrainLoop``: mmengine's iteration-based loop, resuming without reading the past.

A resumed run must continue at the first batch the interrupted run did not train on. mmengine 0.10.7
(the classic stack) gets there by drawing every finished batch again from the data loader (at iteration
100k of the ImageNet-21k schedule: reading and decoding millions of images), and builds the loader's
iterator when the loop is built, so with workers the first batches are prefetched before it even knows
it resumes. onedl-mmengine 0.10.12 asks the sampler to skip instead (``sampler.skip(iterations x
batch_size)``, the contract of mmengine's ``InfiniteSampler.skip``).

This loop does the same on both stacks: its iterator (:class:`ResumableDataloaderIterator`) is built
at the first batch, after the checkpoint is loaded, and a resume moves the sampler to its position
(:func:`skip_in_sampler`: ``vit_plugin.BlockShuffleSampler`` and mmengine's ``InfiniteSampler``, on
both stacks) so that no skipped batch is loaded, by any worker. A sampler that cannot skip is stepped through batch by batch, with a
warning. A sample that cannot be read or decoded stops the run with the checkpoint of the last completed
iteration and exit status 65 (:mod:`~vit_plugin.engine.data_faults`). Everything else is mmengine's loop.
docs/data.md#resume has the measurements.
"""
import logging
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from mmengine.dist import barrier, get_world_size
from mmengine.logging import print_log
from mmengine.runner.base_loop import BaseLoop
from mmengine.runner.loops import IterBasedTrainLoop as MMEngineIterBasedTrainLoop
from mmengine.runner.utils import calc_dynamic_intervals
from torch.utils.data import BatchSampler, DataLoader

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.registry import LOOPS

from .checkpointing import read_last_checkpoint
from .data_faults import DATA_FAULTS, TrainingDataFault, agree_on_data_fault, data_fault_message
from .preemption import save_iteration_checkpoint


def skip_in_sampler(dataloader, num_samples: int) -> bool:
    """Move the sampler of ``dataloader`` to position ``num_samples`` of this process's stream without
    loading anything; False when it cannot (it has no ``skip``, or hides inside a custom batch sampler).

    A sampler with ``skip(num_samples)`` (``vit_plugin.BlockShuffleSampler``, onedl-mmengine's
    ``InfiniteSampler``) is asked directly, also inside PyTorch's own ``BatchSampler`` (whose batches are
    ``batch_size`` consecutive indices); mmengine 0.10.7's ``InfiniteSampler`` through
    :func:`vit_plugin.compat.mmengine.skip_infinite_sampler`.
    """
    sampler = getattr(dataloader, 'sampler', None)
    batch_sampler = getattr(dataloader, 'batch_sampler', None)
    if type(batch_sampler) is BatchSampler:
        sampler = batch_sampler.sampler
    elif batch_sampler is not None and getattr(dataloader, 'batch_size', None) is None:
        return False  # a custom batch sampler draws its own number of indices per batch
    if callable(getattr(sampler, 'skip', None)):
        sampler.skip(num_samples)
        return True
    return mmengine_compat.skip_infinite_sampler(sampler, num_samples)


def keep_global_random_stream(dataloader) -> None:
    """Consume the global torch generator where the installed mmengine's loop does.

    Making a ``DataLoader`` iterator draws the workers' base seed from the global generator. mmengine
    0.10.7's loop makes it when the loop is built, before the model's weights are initialised (onedl-
    mmengine's at the first batch, as this loop does). So that a config gets the same weights, dropout
    and worker seeds with either loop (and an XLA run matches the eager one), under mmengine 0.10.7 the
    loader gets a generator holding the global state of now, and the global generator moves on by that
    one draw.
    """
    if (mmengine_compat.LOOP_MAKES_ITERATOR_WHEN_BUILT and isinstance(dataloader, DataLoader)
            and dataloader.generator is None):
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        torch.empty((), dtype=torch.int64).random_()
        dataloader.generator = generator


class ResumableDataloaderIterator:
    """Batches of a data loader without end, as an iteration-based loop draws them.

    The loader's iterator is made at the first batch (so a resume can move the sampler before any worker
    prefetches), and made again when an epoch of a finite sampler ends (its ``set_epoch`` is called with
    the next epoch).

    Args:
        dataloader: A ``DataLoader``, or an object with its ``sampler``, ``batch_sampler``,
            ``batch_size`` and ``__iter__`` (the XLA device loader).
    """

    def __init__(self, dataloader: Union[DataLoader, Any]):
        self.dataloader = dataloader
        self.iterator = None
        self.epoch = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.iterator is None:
            self.iterator = iter(self.dataloader)
        try:
            return next(self.iterator)
        except StopIteration:
            self.epoch += 1
            sampler = getattr(self.dataloader, 'sampler', None)
            if callable(getattr(sampler, 'set_epoch', None)):
                sampler.set_epoch(self.epoch)
            self.iterator = iter(self.dataloader)
            return next(self.iterator)

    def skip_iter(self, num_iters: int) -> bool:
        """Continue after ``num_iters`` batches: by moving the sampler (nothing is loaded; True), or, for a
        sampler that cannot skip, by drawing the batches (False, with a warning)."""
        if num_iters <= 0:
            return True
        batch_size = getattr(self.dataloader, 'batch_size', None)
        if batch_size and skip_in_sampler(self.dataloader, num_iters * batch_size):
            self.iterator = None  # made at the next batch, from the new position
            return True
        sampler = type(getattr(self.dataloader, 'sampler', None)).__name__
        print_log(f'Resuming at iteration {num_iters}: the sampler ({sampler}) cannot skip, so {num_iters} '
                  f"batches are loaded and dropped; vit_plugin.BlockShuffleSampler or mmengine's "
                  f'InfiniteSampler resume at once.', logger='current', level=logging.WARNING)
        for _ in range(num_iters):
            next(self)
        return False

    def close(self) -> None:
        """Shut the loader's current iterator down now (its workers exit), not when it is collected."""
        iterator, self.iterator = self.iterator, None
        del iterator  # the last reference: the loader's iterator joins its workers here


@LOOPS.register_module()
class IterBasedTrainLoop(MMEngineIterBasedTrainLoop):
    """mmengine's ``IterBasedTrainLoop`` whose resume skips in the sampler (see the module docstring), and
    which stops on a data fault with the checkpoint of the last completed iteration.

    Args:
        runner, dataloader, max_iters, val_begin, val_interval, dynamic_intervals: As mmengine's.
        fast_forward_on_resume (bool): As onedl-mmengine's: True continues with the sampler where it
            starts (the skipped data is drawn again later, in another order). Defaults to False.
        checkpoint_on_data_fault (bool): A sample that cannot be read or decoded stops the run after
            saving the checkpoint of the last completed iteration, with exit status 65
            (:mod:`~vit_plugin.engine.data_faults`; a multi-process run all-reduces one flag per
            iteration). False: the error propagates as raised. Defaults to True.
    """

    def __init__(self, runner, dataloader: Union[DataLoader, Dict], max_iters: int, val_begin: int = 1,
                 val_interval: int = 1000, dynamic_intervals: Optional[List[Tuple[int, int]]] = None,
                 fast_forward_on_resume: bool = False, checkpoint_on_data_fault: bool = True) -> None:
        # mmengine's own __init__ would make the data iterator now (workers prefetching from the start);
        # the rest of it is repeated here.
        BaseLoop.__init__(self, runner, dataloader)
        self._max_iters = int(max_iters)
        if self._max_iters != max_iters:
            raise ValueError(f'IterBasedTrainLoop: max_iters must be an integer, got {max_iters!r}')
        self._max_epochs = 1
        self._epoch = 0
        self._iter = 0
        self.val_begin = val_begin
        self.val_interval = val_interval
        self.fast_forward_on_resume = fast_forward_on_resume
        self.checkpoint_on_data_fault = checkpoint_on_data_fault
        self.data_fault: Optional[str] = None  # the message of the fault that stopped the run
        self.stop_training = False  # EarlyStoppingHook sets it
        self.runner.visualizer.dataset_meta = getattr(self.dataloader.dataset, 'metainfo', None)
        keep_global_random_stream(self.dataloader)
        self.dataloader_iterator = ResumableDataloaderIterator(self.dataloader)
        self.dynamic_milestones, self.dynamic_intervals = calc_dynamic_intervals(self.val_interval,
                                                                                 dynamic_intervals)

    def run(self):
        """Train from the current iteration (0, or the resumed one) to ``max_iters``."""
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')
        if self._iter > 0 and not self.fast_forward_on_resume:
            if self.dataloader_iterator.skip_iter(self._iter):
                print_log(f'Resuming at iteration {self._iter}: the sampler skips {self._iter} batches '
                          f'(nothing is loaded).', logger='current')
        started_at = self._iter
        while self._iter < self._max_iters and not self.stop_training:
            self.runner.model.train()
            data_batch = self._next_batch(started_at)
            if self.data_fault is not None:
                break
            self.run_iter(data_batch)
            self._decide_current_val_interval()
            if (self.runner.val_loop is not None and self._iter >= self.val_begin
                    and (self._iter % self.val_interval == 0 or self._iter == self._max_iters)):
                self.runner.val_loop.run()
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        if self.data_fault is not None:
            self.dataloader_iterator.close()  # before the barrier: the processes then leave together
            if get_world_size() > 1:
                barrier()  # no process leaves (and has its launcher stop the others) before all are done
            raise TrainingDataFault(self.data_fault)
        return self.runner.model

    def _next_batch(self, started_at: int):
        """The next batch; on a data fault of any process, the checkpoint of the last completed iteration
        is saved and :attr:`data_fault` set (every process, at the same iteration)."""
        if not self.checkpoint_on_data_fault:
            return next(self.dataloader_iterator)
        try:
            data_batch, fault = next(self.dataloader_iterator), None
        except DATA_FAULTS as err:
            data_batch, fault = None, err
        found = agree_on_data_fault(fault)
        if found is None:
            return data_batch
        completed, checkpoint = self._iter, None
        if completed > started_at:
            self._iter = completed - 1  # saved as the checkpoint hook saves at the end of that iteration
            try:
                checkpoint = save_iteration_checkpoint(self.runner)
            finally:
                self._iter = completed
        elif completed:  # nothing trained since the checkpoint this run resumed from
            checkpoint = read_last_checkpoint(self.runner.work_dir)
        self.data_fault = data_fault_message(found[1], found[0], get_world_size(), completed, checkpoint,
                                             self.runner.work_dir)
        self.runner.logger.warning(self.data_fault)
        self.stop_training = True
        return None


__all__ = ['IterBasedTrainLoop', 'ResumableDataloaderIterator', 'keep_global_random_stream', 'skip_in_sampler']
