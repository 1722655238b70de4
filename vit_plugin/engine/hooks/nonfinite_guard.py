"""``vit_plugin.NonFiniteGuardHook``: skip optimizer steps whose loss or gradients are not finite.

Without it, one NaN/inf loss (a bad batch, a learning-rate spike, an fp16 overflow) reaches
``optimizer.step``: AdamW's moments become NaN and every later step and checkpoint is ruined, while
the log keeps printing. The hook puts a check between the backward pass and the optimizer step of
the run's optimizer wrapper(s) and stops the run after too many skipped updates in a row:

* the check on the device, which drops a non-finite update before it changes parameters, optimizer
  state or loss scaler, is :class:`~vit_plugin.engine.optimizers.nonfinite_step.NonFiniteGuard`;
* the verdicts are read on the host in batches, every ``check_interval`` iterations, where skips are
  counted and logged and the stop is decided (:mod:`vit_plugin.engine.hooks.nonfinite_reads`);
* a wrapper that checks on the device itself (``vit_plugin.XLAOptimWrapper``, whose
  ``install_nonfinite_guard`` the hook calls) reports its counters when the logged losses reach the
  host (once per logging interval), through its ``nonfinite_counts(message_hub)``.

After ``max_consecutive`` skipped updates in a row the run stops with :class:`~.nonfinite_reads.NonFiniteTrainingError`;
under fp16 it also stops, with :class:`~.nonfinite_reads.LossScaleCollapseError`, when the loss scale has fallen below
``min_loss_scale``. Every checkpoint on disk holds finite weights (one written during a streak holds
the last good weights unchanged), so ``--resume`` continues from it.
"""
from typing import Iterable, List

from mmengine.hooks import Hook
from mmengine.optim import OptimWrapper, OptimWrapperDict

from vit_plugin.engine.optimizers.nonfinite_step import NonFiniteGuard
from vit_plugin.registry import HOOKS

from .nonfinite_reads import SkipLedger


def _wrappers(optim_wrapper) -> Iterable[OptimWrapper]:
    if isinstance(optim_wrapper, OptimWrapperDict):
        return list(optim_wrapper.values())
    return [optim_wrapper]


@HOOKS.register_module()
class NonFiniteGuardHook(Hook):
    """Skip non-finite optimizer steps; stop the run after too many in a row.

    See :mod:`vit_plugin.engine.hooks.nonfinite_guard` for what is checked and what it costs.

    Args:
        max_consecutive (int): Consecutive skipped updates after which training stops with
            :class:`NonFiniteTrainingError`. A learning rate that diverges produces a streak; one
            bad batch produces one. Defaults to 10.
        check_grad_norm (bool): Check the global gradient norm as well as the loss.
            Defaults to True.
        check_interval (int): Iterations between two host reads of the collected verdicts (where
            skips are logged and the stop is decided). 1 reads after every iteration, as a device
            synchronisation. Defaults to 10.
        min_loss_scale (float): fp16 only: stop with :class:`LossScaleCollapseError` when the loss
            scale falls below this (gradients overflow fp16 even when barely scaled). Defaults to
            1e-4.
        enabled (bool): False switches the guard off (mmengine does not let configs drop a
            default hook by setting it to None): ``--cfg-options
            default_hooks.nonfinite_guard.enabled=False``. Defaults to True.
    """

    # Before the checkpoint hook (VERY_LOW): a run that stops saves nothing at that iteration.
    priority = 'ABOVE_NORMAL'

    def __init__(self, max_consecutive: int = 10, check_grad_norm: bool = True, check_interval: int = 10,
                 min_loss_scale: float = 1e-4, enabled: bool = True):
        for name, value in (('max_consecutive', max_consecutive), ('check_interval', check_interval)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f'NonFiniteGuardHook: {name} must be an integer >= 1, got {value!r} '
                                 f'(default_hooks.nonfinite_guard in the config).')
        if not min_loss_scale >= 0:
            raise ValueError(f'NonFiniteGuardHook: min_loss_scale must be >= 0, got {min_loss_scale!r} '
                             f'(default_hooks.nonfinite_guard in the config).')
        self.max_consecutive = max_consecutive
        self.check_grad_norm = check_grad_norm
        self.check_interval = check_interval
        self.min_loss_scale = float(min_loss_scale)
        self.enabled = enabled
        self._ledger = SkipLedger(max_consecutive, self.min_loss_scale)
        self._guards: List[NonFiniteGuard] = []
        self._counted_on_device: List[OptimWrapper] = []

    @property
    def consecutive(self) -> int:
        """Skipped updates in a row, as of the last read."""
        return self._ledger.consecutive

    @property
    def skipped_total(self) -> int:
        """Skipped updates in this run, as of the last read."""
        return self._ledger.skipped_total

    def before_train(self, runner) -> None:
        self._guards, self._counted_on_device = [], []
        self._ledger.clear_pending()
        if not self.enabled:
            return
        for wrapper in _wrappers(runner.optim_wrapper):
            guard = getattr(wrapper, '_nonfinite_guard', None)
            if guard is None and hasattr(wrapper, 'install_nonfinite_guard'):
                # The wrapper checks on the device and reports lazily (no host read per step).
                wrapper.install_nonfinite_guard()
                self._counted_on_device.append(wrapper)
                continue
            self._guards.append(guard or NonFiniteGuard(wrapper, self.check_grad_norm))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        for wrapper in self._counted_on_device:
            counts = wrapper.nonfinite_counts(runner.message_hub)
            if counts is not None:  # the counters arrive with the logged losses
                self._ledger.read_device_counts(runner, *counts)
        verdicts = [flags for flags in (guard.take() for guard in self._guards) if flags is not None]
        if verdicts:  # an update happened (none at the first micro-batches of an accumulation)
            self._ledger.add(runner.iter + 1, verdicts, outputs)
        if (runner.iter + 1) % self.check_interval == 0 or runner.iter + 1 >= runner.max_iters:
            self._ledger.read(runner, self._guards)

    def after_train(self, runner) -> None:
        self._ledger.read(runner, self._guards, stop=False)  # report the last iterations' skips, if any
