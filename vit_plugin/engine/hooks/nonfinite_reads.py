"""The host side of ``vit_plugin.NonFiniteGuardHook``: verdicts read in batches, skips logged, the run stopped."""
import logging
import math
from typing import List, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log

from vit_plugin.engine.optimizers.nonfinite_step import NonFiniteGuardMixin


class NonFiniteTrainingError(RuntimeError):
    """Raised when too many consecutive optimizer steps had a non-finite loss or gradient."""


class LossScaleCollapseError(NonFiniteTrainingError):
    """Raised when the fp16 loss scale fell below the guard's ``min_loss_scale``."""


def _nonfinite_terms(outputs) -> List[str]:
    terms = []
    for key, value in (outputs or {}).items():
        value = value.detach().float() if isinstance(value, torch.Tensor) else value
        try:
            finite = bool(torch.isfinite(torch.as_tensor(value)).all())
        except (TypeError, ValueError, RuntimeError):
            continue
        if not finite:
            terms.append(f'{key}={float(torch.as_tensor(value).float().mean()):g}')
    return terms


def _detached(outputs) -> dict:
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in (outputs or {}).items()}


def _scaler(guards: Sequence[NonFiniteGuardMixin]):
    scalers = [g.active_loss_scaler for g in guards if g.active_loss_scaler is not None]
    return scalers[0] if scalers else None


class SkipLedger:
    """Skipped updates of a run: collected on the device, counted and reported on the host.

    Args:
        max_consecutive (int): Consecutive skipped updates after which :meth:`read` stops the run.
        min_loss_scale (float): fp16: :meth:`read` stops the run when the loss scale is below it.
    """

    def __init__(self, max_consecutive: int, min_loss_scale: float):
        self.max_consecutive = max_consecutive
        self.min_loss_scale = min_loss_scale
        self.consecutive = 0
        self.skipped_total = 0
        self._streak_start: Optional[int] = None
        self._pending: List[Tuple[int, torch.Tensor, dict]] = []

    def clear_pending(self) -> None:
        """Forget the verdicts not read yet (a new ``train()``)."""
        self._pending = []

    def add(self, iteration: int, verdicts: Sequence[torch.Tensor], outputs) -> None:
        """Keep the device verdicts of one iteration's update(s), merged, with its (detached) losses."""
        flags = verdicts[0] if len(verdicts) == 1 else \
            torch.stack([v.to(verdicts[0].device) for v in verdicts]).amax(0)
        self._pending.append((iteration, flags, _detached(outputs)))

    def read(self, runner, guards: Sequence[NonFiniteGuardMixin], stop: bool = True) -> None:
        """Host side: count, log and decide on the verdicts collected since the last read."""
        pending, self._pending = self._pending, []
        scaler = _scaler(guards)
        if pending:
            values = torch.stack([flags.to(pending[0][1].device) for _, flags, _ in pending]).tolist()
            scale = scaler.get_scale() if scaler is not None else None
            for (iteration, _, outputs), (loss_bad, grads_bad) in zip(pending, values):
                if not (loss_bad or grads_bad):
                    self.consecutive, self._streak_start = 0, None
                    continue
                self.consecutive += 1
                self.skipped_total += 1
                if self._streak_start is None:
                    self._streak_start = iteration
                self._log_skip(guards, iteration, outputs, bool(loss_bad), bool(grads_bad), scale)
                if stop and self.consecutive >= self.max_consecutive:
                    runner.message_hub.update_scalar('train/skipped_steps', self.skipped_total)
                    self._stop(runner, guards, iteration, outputs, bool(loss_bad))
            runner.message_hub.update_scalar('train/skipped_steps', self.skipped_total)
        if stop and scaler is not None:
            scale = scaler.get_scale()
            if scale < self.min_loss_scale:
                raise LossScaleCollapseError(
                    f'Training stopped at iteration {runner.iter + 1}: the fp16 loss scale fell to {scale:g}, below '
                    f'min_loss_scale={self.min_loss_scale:g} ({self.skipped_total} updates skipped). Train with '
                    f'`--amp bf16` (compute capability 8.0+) or fp32, or lower the learning rate, then `--resume`.')

    def read_device_counts(self, runner, skipped: int, longest_streak: int) -> None:
        """Log the updates a device-counting wrapper skipped since the last call; stop at ``max_consecutive``."""
        if skipped > self.skipped_total:
            print_log(f'NonFiniteGuardHook: {skipped - self.skipped_total} update(s) with a '
                      f'non-finite loss or gradient were skipped on the device before iteration '
                      f'{runner.iter + 1} ({skipped} in this run; longest streak {longest_streak}).',
                      logger='current', level=logging.WARNING)
            self.skipped_total = skipped
        if longest_streak >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f'Training stopped at iteration {runner.iter + 1}: {longest_streak} consecutive updates had a '
                f'non-finite loss or gradient (counted on the device). Lower the learning rate or check the data, '
                f'then `--resume`: the checkpoints in {runner.work_dir} hold finite weights.')

    def _cause(self, guards, outputs, loss_bad: bool, scale: Optional[float]) -> str:
        terms = _nonfinite_terms(outputs) if loss_bad else []
        if terms:
            return f'non-finite loss terms on this rank: {", ".join(terms)}'
        if loss_bad:
            return 'the loss is not finite on another rank'
        if scale is not None:
            return f'the fp16 loss scaler found inf/NaN gradients; its scale is {scale:g} at the read'
        norms = [g.last_grad_norm for g in guards if g.last_grad_norm is not None]
        norm = float(norms[0]) if norms else float('nan')
        return ('the loss is finite, the gradients are not' +
                (f' (gradient norm {norm:g})' if not math.isfinite(norm) else ''))

    def _log_skip(self, guards, iteration, outputs, loss_bad, grads_bad, scale) -> None:
        # fp16 overflows of the gradients alone are routine (the scaler probes for the largest
        # scale that fits): counted, and logged at INFO while the streak is short.
        routine = scale is not None and grads_bad and not loss_bad and 2 * self.consecutive < self.max_consecutive
        print_log(f'NonFiniteGuardHook: skipped the update of iteration {iteration} '
                  f'({self._cause(guards, outputs, loss_bad, scale)}); parameters and optimizer state '
                  f'are unchanged. {self.consecutive} in a row, {self.skipped_total} in this run; the run '
                  f'stops at {self.max_consecutive} in a row.', logger='current',
                  level=logging.INFO if routine else logging.WARNING)

    def _stop(self, runner, guards, iteration, outputs, loss_bad) -> None:
        scaler = _scaler(guards)
        cause = self._cause(guards, outputs, loss_bad, scaler.get_scale() if scaler else None)
        read = '' if iteration == runner.iter + 1 else f' (read at iteration {runner.iter + 1})'
        raise NonFiniteTrainingError(
            f'Training stopped at iteration {iteration}{read}: {self.consecutive} consecutive updates (iterations '
            f'{self._streak_start}-{iteration}) had a non-finite loss or gradient ({cause}). Lower the learning '
            f'rate or check the data, then `--resume`: the checkpoints in {runner.work_dir} hold finite weights.')
