"""``vit_plugin.IterBasedTrainLoop``: resumes without reading the past, checkpoints on a data fault.

See docs/data.md#resume and docs/data.md#when-data-fails.
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
    """Move ``dataloader``'s sampler ``num_samples`` on without loading anything; False if it cannot skip."""
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
    """Consume the global torch generator where the installed mmengine's loop does (one draw when built,
    under mmengine 0.10.7), so weights, dropout and worker seeds match on both stacks.
    """
    if (mmengine_compat.LOOP_MAKES_ITERATOR_WHEN_BUILT and isinstance(dataloader, DataLoader)
            and dataloader.generator is None):
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        torch.empty((), dtype=torch.int64).random_()
        dataloader.generator = generator


class ResumableDataloaderIterator:
    """Endless batches of a data loader; its iterator is made at the first batch and after each epoch.

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
        """Continue after ``num_iters`` batches; True if the sampler skipped, False if they were drawn (warned)."""
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
    """mmengine's ``IterBasedTrainLoop`` that resumes by skipping in the sampler and checkpoints on a data fault.

    Args:
        runner, dataloader, max_iters, val_begin, val_interval, dynamic_intervals: As mmengine's.
        fast_forward_on_resume (bool): As onedl-mmengine's. Defaults to False.
        checkpoint_on_data_fault (bool): On a sample that cannot be read or decoded, save the last
            completed iteration's checkpoint and exit 65; False re-raises. Defaults to True.
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
        """The next batch, or None after a data fault of any process (checkpoint saved, :attr:`data_fault` set)."""
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
