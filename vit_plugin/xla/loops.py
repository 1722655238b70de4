"""Train / val / test loops for XLA devices: device loading, one ``sync`` per step, deferred logs."""
import logging
import sys
from typing import Sequence

import torch

from mmengine.hooks import RuntimeInfoHook
from mmengine.logging import print_log
from mmengine.runner.loops import EpochBasedTrainLoop, TestLoop, ValLoop

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.engine.loops import IterBasedTrainLoop, ResumableDataloaderIterator
from vit_plugin.registry import LOOPS

from . import runtime
from .hooks import XLARecompileGuardHook, XLARuntimeInfoHook

# MpDeviceLoader cuts the graph itself every `batches_per_execution` batches; the loops cut it right
# after train_step instead (before hooks run), so the loader must never add a second cut.
_LOADER_NEVER_SYNCS = sys.maxsize


class _HostIterable:
    """What torch_xla's loader thread iterates: the host iterator created by :class:`DeviceLoader`."""

    def __init__(self, dataloader):
        self.dataloader = dataloader
        self.next_iterator = None

    def __len__(self):
        return len(self.dataloader)

    def __iter__(self):
        iterator, self.next_iterator = self.next_iterator, None
        return iterator if iterator is not None else iter(self.dataloader)


class DeviceLoader:
    """A DataLoader whose batches arrive on the XLA device (``MpDeviceLoader``); use ``num_workers >= 1``.

    Args:
        dataloader (DataLoader): The host-side loader.
        device (torch.device): The XLA device.
        **kwargs: Passed to torch_xla's ``ParallelLoader``.
    """

    def __init__(self, dataloader, device, **kwargs):
        pl = runtime.require('torch_xla.distributed.parallel_loader')
        self.dataloader = dataloader
        self._host = _HostIterable(dataloader)
        self._device_loader = pl.MpDeviceLoader(self._host, device,
                                                batches_per_execution=_LOADER_NEVER_SYNCS, **kwargs)

    dataset = property(lambda self: self.dataloader.dataset)
    sampler = property(lambda self: self.dataloader.sampler)
    batch_sampler = property(lambda self: self.dataloader.batch_sampler)
    batch_size = property(lambda self: self.dataloader.batch_size)

    def __len__(self):
        return len(self.dataloader)

    def __iter__(self):
        return self.iterate()

    def iterate(self, host_iterator=None):
        """Iterate on the device, over ``host_iterator`` if given, else a new one."""
        self._host.next_iterator = iter(self.dataloader) if host_iterator is None else host_iterator
        return iter(self._device_loader)


def _check_fixed_shapes(dataloader, what: str) -> None:
    """Warn when the last batch of an epoch would be smaller (a new graph every epoch)."""
    batch_size = getattr(dataloader, 'batch_size', None)
    drop_last = getattr(dataloader, 'drop_last', True)
    try:
        n = len(dataloader.sampler)
    except TypeError:  # infinite samplers have no length
        return
    if batch_size and not drop_last and n % batch_size:
        print_log(f'XLA: the {what} dataloader has {n} samples per replica and batch_size '
                  f'{batch_size} without drop_last, so its last batch has {n % batch_size} samples '
                  'and compiles its own graph. Set drop_last=True for fixed shapes.',
                  logger='current', level=logging.WARNING)


class _XLATrainMixin:
    """What both XLA train loops add: device loading, one sync per step, hook set-up."""

    def _setup_xla(self, warmup_iters, loader_kwargs: dict):
        _check_fixed_shapes(self.dataloader, 'train')
        if warmup_iters is None:
            # The first update creates the optimizer state (its own graph); with accumulation each
            # phase (first micro-batch, later micro-batches, update) has a graph, all seen by 2k.
            wrapper = self.runner.optim_wrapper  # still a config when FlexibleRunner builds loops
            counts = (wrapper.get('accumulative_counts', 1) if isinstance(wrapper, dict) else
                      mmengine_compat.accumulative_counts(wrapper))
            warmup_iters = 3 if counts == 1 else 2 * counts + 1
        self.device_loader = DeviceLoader(self.dataloader, runtime.device(), **(loader_kwargs or {}))
        hooks = self.runner.hooks  # the runner's own list, edited in place
        for i, hook in enumerate(hooks):
            if type(hook) is RuntimeInfoHook:  # same priority slot, deferred transfers
                hooks[i] = XLARuntimeInfoHook()
        if not any(isinstance(h, XLARecompileGuardHook) for h in hooks):
            self.runner.register_hook(XLARecompileGuardHook(warmup_iters=warmup_iters))

    def _train_step(self, batch_idx: int, data_batch) -> None:
        runner = self.runner
        runner.call_hook('before_train_iter', batch_idx=batch_idx, data_batch=data_batch)
        outputs = runner.model.train_step(data_batch, optim_wrapper=runner.optim_wrapper)
        runtime.sync()
        runner.call_hook('after_train_iter', batch_idx=batch_idx, data_batch=data_batch,
                         outputs=outputs)
        self._iter += 1


@LOOPS.register_module()
class XLAEpochBasedTrainLoop(_XLATrainMixin, EpochBasedTrainLoop):
    """mmengine's EpochBasedTrainLoop on an XLA device.

    Args:
        runner, dataloader, max_epochs, val_begin, val_interval, dynamic_intervals: As in mmengine.
        warmup_iters (int, optional): Iterations allowed to compile. Defaults to None: 3, or ``2 * k + 1``.
        loader_kwargs (dict, optional): Passed to torch_xla's ``ParallelLoader``.
    """

    def __init__(self, runner, dataloader, max_epochs: int, val_begin: int = 1,
                 val_interval: int = 1, dynamic_intervals=None, warmup_iters=None,
                 loader_kwargs=None):
        super().__init__(runner, dataloader, max_epochs, val_begin, val_interval, dynamic_intervals)
        self._setup_xla(warmup_iters, loader_kwargs)

    def run_epoch(self) -> None:
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        for idx, data_batch in enumerate(self.device_loader):
            self.run_iter(idx, data_batch)
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1

    def run_iter(self, idx, data_batch: Sequence[dict]) -> None:
        self._train_step(idx, data_batch)


@LOOPS.register_module()
class XLAIterBasedTrainLoop(_XLATrainMixin, IterBasedTrainLoop):
    """vit_plugin's IterBasedTrainLoop on an XLA device (arguments as :class:`XLAEpochBasedTrainLoop`)."""

    def __init__(self, runner, dataloader, max_iters: int, val_begin: int = 1,
                 val_interval: int = 1000, dynamic_intervals=None, warmup_iters=None,
                 loader_kwargs=None):
        super().__init__(runner, dataloader, max_iters, val_begin, val_interval, dynamic_intervals)
        self._setup_xla(warmup_iters, loader_kwargs)
        self.dataloader_iterator = ResumableDataloaderIterator(self.device_loader)

    def run_iter(self, data_batch: Sequence[dict]) -> None:
        self._train_step(self._iter, data_batch)


class _XLAEvalMixin:

    @torch.no_grad()
    def run_iter(self, idx, data_batch: Sequence[dict]) -> None:
        stage = self._stage
        self.runner.call_hook(f'before_{stage}_iter', batch_idx=idx, data_batch=data_batch)
        outputs = getattr(self.runner.model, f'{stage}_step')(data_batch)
        # Run the forward graph now, so the metrics' host reads below only transfer results.
        runtime.sync()
        outputs, losses = mmengine_compat.update_losses(outputs, getattr(self, f'{stage}_loss'))
        setattr(self, f'{stage}_loss', losses)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        self.runner.call_hook(f'after_{stage}_iter', batch_idx=idx, data_batch=data_batch,
                              outputs=outputs)


@LOOPS.register_module()
class XLAValLoop(_XLAEvalMixin, ValLoop):
    """mmengine's ValLoop with one graph per batch on the XLA device (arguments as ValLoop)."""

    _stage = 'val'


@LOOPS.register_module()
class XLATestLoop(_XLAEvalMixin, TestLoop):
    """mmengine's TestLoop with one graph per batch on the XLA device (arguments as TestLoop)."""

    _stage = 'test'
