"""``vit_plugin.NonFiniteGuardHook``: report the updates the guarded optimizer wrapper skipped, and stop
the run after too many in a row. See docs/configs.md#training-and-testing ("Non-finite steps are skipped").
"""
import logging
from typing import List

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.optim import OptimWrapperDict

from vit_plugin.engine.optimizers.nonfinite_step import DeviceCountedNonFiniteGuard, NonFiniteGuardMixin
from vit_plugin.registry import HOOKS

from .nonfinite_reads import SkipLedger


@HOOKS.register_module()
class NonFiniteGuardHook(Hook):
    """Report the non-finite updates the guarded optimizer wrappers skipped; stop the run after too many in a row.

    Args:
        max_consecutive (int): Consecutive skipped updates after which training stops with
            :class:`NonFiniteTrainingError`. Defaults to 10.
        check_grad_norm (bool, optional): The wrapper's setting (``optim_wrapper.check_grad_norm``),
            which the run plan copies there when given here. Defaults to None: the wrapper's (True).
        check_interval (int): Iterations between two host reads of the collected verdicts (where
            skips are logged and the stop is decided). Defaults to 10.
        min_loss_scale (float): fp16 only: stop with :class:`LossScaleCollapseError` when the loss
            scale falls below this. Defaults to 1e-4.
        enabled (bool): False switches the guard off (the run plan then builds the unguarded
            wrapper). Defaults to True.
    """

    # Before the checkpoint hook (VERY_LOW): a run that stops saves nothing at that iteration.
    priority = 'ABOVE_NORMAL'

    def __init__(self, max_consecutive: int = 10, check_grad_norm=None, check_interval: int = 10,
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
        self._guards: List[NonFiniteGuardMixin] = []
        self._counted_on_device: List[DeviceCountedNonFiniteGuard] = []

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
        wrappers = runner.optim_wrapper
        unguarded = []
        for wrapper in wrappers.values() if isinstance(wrappers, OptimWrapperDict) else [wrappers]:
            if isinstance(wrapper, NonFiniteGuardMixin):
                self._check_setting(wrapper)
                self._guards.append(wrapper)
            elif isinstance(wrapper, DeviceCountedNonFiniteGuard) and wrapper.nonfinite_guard:
                self._counted_on_device.append(wrapper)
            else:
                unguarded.append(type(wrapper).__name__)
        if unguarded:
            print_log(f'NonFiniteGuardHook: {", ".join(unguarded)} does not skip non-finite updates; name the '
                      f'guarded type in the config (e.g. optim_wrapper.type=\'vit_plugin.GuardedOptimWrapper\') or '
                      f'build the run with vit_plugin\'s runner.',
                      logger='current', level=logging.WARNING)

    def _check_setting(self, wrapper: NonFiniteGuardMixin) -> None:
        if self.check_grad_norm is not None and self.check_grad_norm != wrapper.check_grad_norm:
            raise ValueError(f'default_hooks.nonfinite_guard.check_grad_norm={self.check_grad_norm}, but the optimizer '
                             f'wrapper checks with check_grad_norm={wrapper.check_grad_norm}: set '
                             f'optim_wrapper.check_grad_norm (vit_plugin\'s runner copies the hook\'s).')

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        for wrapper in self._counted_on_device:
            counts = wrapper.nonfinite_counts(runner.message_hub)
            if counts is not None:  # the counters arrive with the logged losses
                self._ledger.read_device_counts(runner, *counts)
        verdicts = [flags for flags in (guard.take_verdict() for guard in self._guards) if flags is not None]
        if verdicts:  # an update happened (none at the first micro-batches of an accumulation)
            self._ledger.add(runner.iter + 1, verdicts, outputs)
        if (runner.iter + 1) % self.check_interval == 0 or runner.iter + 1 >= runner.max_iters:
            self._ledger.read(runner, self._guards)

    def after_train(self, runner) -> None:
        self._ledger.read(runner, self._guards, stop=False)  # report the last iterations' skips, if any
