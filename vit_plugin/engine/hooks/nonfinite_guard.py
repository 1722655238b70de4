"""``vit_plugin.NonFiniteGuardHook``: skip optimizer steps whose loss or gradients are not finite.

Without it, one NaN/inf loss (a bad batch, a learning-rate spike, an fp16 overflow) reaches
``optimizer.step``: AdamW's moments become NaN and every later step and checkpoint is ruined, while
the log keeps printing. The hook puts a check between the backward pass and the optimizer step of
the run's optimizer wrapper(s):

* every backward pass records whether its loss is finite; before the update, the global gradient
  norm (all parameters, after the DDP all-reduce) is checked as well -- or, under fp16 loss
  scaling, the scaler's own inf/NaN check of the gradients is used;
* a non-finite step is dropped *before* it changes anything: parameters, optimizer state (AdamW
  moments and step count) and loss scaler are left as they were (the scaler lowers its scale, as it
  does for every overflow), and the gradients are zeroed as after any update;
* under DDP/FSDP the verdict is all-reduced (one two-element tensor per update), so all ranks skip
  the same step and stay in lock-step;
* with gradient accumulation the check covers all micro-batches of the update;
* every skipped update is counted, whoever skipped it: the guard's own check, or the fp16 scaler's
  (whose overflows the guard sees too). After ``max_consecutive`` skipped updates in a row the run
  stops with :class:`NonFiniteTrainingError`; under fp16 it also stops, with
  :class:`LossScaleCollapseError`, when the loss scale has fallen below ``min_loss_scale``. Every
  checkpoint on disk holds finite weights (one written during a streak holds the last good weights
  unchanged), so ``--resume`` continues from it.

No host synchronisation per iteration. The verdict stays a device tensor and the step is skipped on
the device where the optimizer allows it: torch's fused Adam/AdamW/SGD (the CUDA default of
``tools/train.py``) take a ``found_inf`` tensor and leave parameters and state untouched when it is
set, as they do for the fp16 scaler. The per-update verdicts are collected on the device and read
on the host every ``check_interval`` iterations (one small transfer), where the streak is counted,
the skipped iterations are logged with their non-finite loss terms and the stop is decided. A
streak is therefore stopped up to ``check_interval - 1`` iterations after it reached
``max_consecutive``; those iterations change no weights either. Optimizers without a fused kernel
(foreach/for-loop AdamW, LAMB, LARS...) need the verdict on the host before they step: one
device-to-host read per update there (free on a CPU, where the device is the host).

Cost on the device: one norm over the gradients (a read of every gradient, much cheaper than the
optimizer's own update) and, under fp16, an explicit unscale of the gradients (which the fused
optimizers would otherwise fold into their update). On XLA devices the hook switches on
:class:`vit_plugin.XLAOptimWrapper`'s on-device guard instead and reads its counters when the
logged losses reach the host (once per logging interval).
"""
import logging
import math
from contextlib import contextmanager
from typing import Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper, OptimWrapperDict

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.compat import torch as torch_compat
from vit_plugin.engine.optimizers.grad_norm import global_grad_norm
from vit_plugin.registry import HOOKS


class NonFiniteTrainingError(RuntimeError):
    """Raised when too many consecutive optimizer steps had a non-finite loss or gradient."""


class LossScaleCollapseError(NonFiniteTrainingError):
    """Raised when the fp16 loss scale fell below the guard's ``min_loss_scale``."""


def _grads(wrapper: OptimWrapper) -> List[torch.Tensor]:
    return [p.grad for group in wrapper.optimizer.param_groups for p in group['params']
            if p.grad is not None]


def _skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` honours a ``found_inf`` tensor (torch's fused Adam/AdamW/SGD)."""
    return torch_compat.step_supports_amp_scaling(optimizer) and all(
        group.get('fused') for group in optimizer.param_groups)


def _scaler_state(scaler, optimizer) -> dict:
    # torch.amp.GradScaler keeps, per optimizer, the stage of the iteration (READY -> UNSCALED ->
    # STEPPED) and the per-device inf/NaN flags its unscale_ found; step() skips on them and update()
    # lowers the scale when any is set. (Stable since torch 1.6; tests/test_numerics_guard.py runs
    # the real GradScaler.)
    return torch_compat.grad_scaler_state(scaler, optimizer)


@contextmanager
def _unscale_done(scaler):
    """The gradients are unscaled already: a second ``unscale_`` (the wrapper's, before clipping)
    must not raise."""
    scaler.unscale_ = lambda optimizer: None
    try:
        yield
    finally:
        del scaler.unscale_


class NonFiniteGuard:
    """The per-step check installed on one optimizer wrapper (see the module docstring).

    It wraps the wrapper's ``backward`` (to see each loss) and ``step`` (to veto the update) on the
    instance, so it works with every mmengine wrapper (``OptimWrapper``, ``AmpOptimWrapper``,
    vit_plugin's autocast wrapper) without a subclass per wrapper type.

    Args:
        wrapper (OptimWrapper): The wrapper to guard.
        check_grad_norm (bool): Also check the global gradient norm (without a loss scaler, which
            checks the gradients itself). Defaults to True.
    """

    def __init__(self, wrapper: OptimWrapper, check_grad_norm: bool = True):
        self.wrapper = wrapper
        self.check_grad_norm = check_grad_norm
        self._loss_bad: Optional[torch.Tensor] = None
        # Verdict of the last update, on the device: [loss not finite, gradients not finite] as
        # 0/1 floats (None: no update since it was taken).
        self._last: Optional[torch.Tensor] = None
        self.last_grad_norm: Optional[torch.Tensor] = None
        self._backward, self._step = wrapper.backward, wrapper.step

        def guarded_step(**kwargs):
            return self.step(**kwargs)

        # mmengine's parameter schedulers wrap ``wrapper.step`` in a call counter when they are built
        # (before this hook runs) and warn if the method they find later lacks the mark; the counter
        # still runs inside ``self._step``, so carry the mark over.
        mmengine_compat.copy_scheduler_counter_mark(self._step, guarded_step)
        wrapper.backward, wrapper.step = self.backward, guarded_step
        wrapper._nonfinite_guard = self

    @property
    def loss_scaler(self):
        """The wrapper's enabled fp16 loss scaler, or None."""
        scaler = getattr(self.wrapper, 'loss_scaler', None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad
        self._backward(loss, **kwargs)

    def _verdict(self, grads_bad: torch.Tensor) -> torch.Tensor:
        """[loss bad, gradients bad] of this update, common to all ranks (still on the device)."""
        loss_bad = self._loss_bad if self._loss_bad is not None else torch.zeros((), dtype=torch.bool)
        self._loss_bad = None
        flags = torch.stack([loss_bad.to(grads_bad.device).float().reshape(()), grads_bad.float().reshape(())])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Gradients are already averaged across ranks, but a loss can be inf on one rank only
            # (a term without gradient): the verdict must be common or the ranks would diverge.
            device = torch.device('cuda', torch.cuda.current_device()) \
                if dist.get_backend() == 'nccl' else torch.device('cpu')
            shared = flags.to(device)
            dist.all_reduce(shared, op=dist.ReduceOp.MAX)
            flags = shared.to(flags.device)
        return flags

    def step(self, **kwargs) -> None:
        self._last = self._scaled_step(kwargs) if self.loss_scaler is not None else self._plain_step(kwargs)

    def _plain_step(self, kwargs) -> torch.Tensor:
        optimizer = self.wrapper.optimizer
        grads = _grads(self.wrapper)
        norm = global_grad_norm(grads) if self.check_grad_norm else None
        device = grads[0].device if grads else torch.device('cpu')
        grads_bad = ~torch.isfinite(norm) if norm is not None else torch.zeros((), dtype=torch.bool, device=device)
        self.last_grad_norm = norm
        flags = self._verdict(grads_bad)
        if _skips_on_device(optimizer):
            # The fused kernels skip parameters, moments and step count when found_inf is set.
            optimizer.found_inf = flags.max().to(device)
            try:
                self._step(**kwargs)
            finally:
                del optimizer.found_inf
        elif not flags.max().item():  # the host decides: one read per update
            self._step(**kwargs)
        return flags

    def _scaled_step(self, kwargs) -> torch.Tensor:
        from torch.amp.grad_scaler import OptState

        scaler, optimizer = self.loss_scaler, self.wrapper.optimizer
        state = _scaler_state(scaler, optimizer)
        if state['stage'] is OptState.READY:
            scaler.unscale_(optimizer)  # fills the scaler's per-device inf/NaN flags (on the device)
        found = list(state['found_inf_per_device'].values())
        if not found:  # no gradients at all
            self._loss_bad = None
            self._step(**kwargs)
            return torch.zeros(2)
        grads_bad = torch.stack([f.to(found[0].device).reshape(()) for f in found]).max() > 0
        self.last_grad_norm = None
        flags = self._verdict(grads_bad)
        bad = flags.max()
        for flag in found:  # the scaler skips, and lowers its scale, on what the guard decided
            flag.copy_(torch.maximum(flag, bad.to(flag.device)))
        with _unscale_done(scaler):
            self._step(**kwargs)
        return flags

    def take(self) -> Optional[torch.Tensor]:
        """The device verdict ``[loss bad, gradients bad]`` of the last update (None: no update
        happened since the last call)."""
        flags, self._last = self._last, None
        return flags

    def pop(self) -> Optional[bool]:
        """Whether the update of the last iteration was skipped (None: no update happened). Reads
        the verdict on the host."""
        flags = self.take()
        return None if flags is None else bool(flags.max().item())


def _wrappers(optim_wrapper) -> Iterable[OptimWrapper]:
    if isinstance(optim_wrapper, OptimWrapperDict):
        return list(optim_wrapper.values())
    return [optim_wrapper]


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
        self.consecutive = 0
        self.skipped_total = 0
        self._streak_start: Optional[int] = None
        self._guards: List[NonFiniteGuard] = []
        self._pending: List[Tuple[int, torch.Tensor, dict]] = []
        self._lazy = False

    def before_train(self, runner) -> None:
        self._guards, self._pending = [], []
        if not self.enabled:
            return
        for wrapper in _wrappers(runner.optim_wrapper):
            guard = getattr(wrapper, '_nonfinite_guard', None)
            if guard is None and hasattr(wrapper, 'install_nonfinite_guard'):
                # XLA: the wrapper checks on the device and reports lazily (no host read per step).
                wrapper.install_nonfinite_guard()
                self._lazy = True
                continue
            self._guards.append(guard or NonFiniteGuard(wrapper, self.check_grad_norm))

    def _check_lazy(self, runner) -> None:
        """XLA: read the device counters that arrived with the logged losses (if any)."""
        scalars = runner.message_hub.log_scalars
        if 'train/nonfinite_max_streak' not in scalars:
            return
        skipped = int(scalars['train/nonfinite_skipped'].current())
        worst = int(scalars['train/nonfinite_max_streak'].current())
        if skipped > self.skipped_total:
            print_log(f'NonFiniteGuardHook: {skipped - self.skipped_total} update(s) with a '
                      f'non-finite loss or gradient were skipped on the device before iteration '
                      f'{runner.iter + 1} ({skipped} in this run; longest streak {worst}).',
                      logger='current', level=logging.WARNING)
            self.skipped_total = skipped
        if worst >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f'Training stopped at iteration {runner.iter + 1}: {worst} consecutive updates had a '
                f'non-finite loss or gradient (checked on the device, read at the logging '
                f'interval). None of them changed the weights; every checkpoint in '
                f'{runner.work_dir} holds finite weights. Lower the learning rate or check the '
                f'data, then continue with `--resume`.')

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._lazy:
            self._check_lazy(runner)
        verdicts = [flags for flags in (guard.take() for guard in self._guards) if flags is not None]
        if verdicts:  # an update happened (none at the first micro-batches of an accumulation)
            flags = verdicts[0] if len(verdicts) == 1 else \
                torch.stack([v.to(verdicts[0].device) for v in verdicts]).amax(0)
            self._pending.append((runner.iter + 1, flags, _detached(outputs)))
        if (runner.iter + 1) % self.check_interval == 0 or runner.iter + 1 >= runner.max_iters:
            self._read(runner)

    def after_train(self, runner) -> None:
        self._read(runner, stop=False)  # report the last iterations' skips, if any

    def _scaler(self):
        scalers = [g.loss_scaler for g in self._guards if g.loss_scaler is not None]
        return scalers[0] if scalers else None

    def _read(self, runner, stop: bool = True) -> None:
        """Host side: count, log and decide on the verdicts collected since the last read."""
        pending, self._pending = self._pending, []
        scaler = self._scaler()
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
                self._log_skip(runner, iteration, outputs, bool(loss_bad), bool(grads_bad), scale)
                if stop and self.consecutive >= self.max_consecutive:
                    runner.message_hub.update_scalar('train/skipped_steps', self.skipped_total)
                    self._stop(runner, iteration, outputs, bool(loss_bad))
            runner.message_hub.update_scalar('train/skipped_steps', self.skipped_total)
        if stop and scaler is not None:
            scale = scaler.get_scale()
            if scale < self.min_loss_scale:
                raise LossScaleCollapseError(
                    f'Training stopped at iteration {runner.iter + 1}: the fp16 loss scale fell to '
                    f'{scale:g}, below min_loss_scale={self.min_loss_scale:g}. Gradients overflow fp16 '
                    f'even when barely scaled ({self.skipped_total} updates skipped in this run); the '
                    f'skipped updates changed no weights, so every checkpoint in {runner.work_dir} '
                    f'holds finite weights. Train in bf16 (`--amp bf16`, GPUs of compute capability '
                    f'8.0 or newer) or fp32, or lower the learning rate, then continue with '
                    f'`tools/train.py CONFIG --resume`.')

    def _cause(self, outputs, loss_bad: bool, grads_bad: bool, scale: Optional[float]) -> str:
        terms = _nonfinite_terms(outputs) if loss_bad else []
        if terms:
            return f'non-finite loss terms on this rank: {", ".join(terms)}'
        if loss_bad:
            return 'the loss is not finite on another rank'
        if scale is not None:
            return f'the fp16 loss scaler found inf/NaN gradients; its scale is {scale:g} at the read'
        norms = [g.last_grad_norm for g in self._guards if g.last_grad_norm is not None]
        norm = float(norms[0]) if norms else float('nan')
        return ('the loss is finite, the gradients are not' +
                (f' (gradient norm {norm:g})' if not math.isfinite(norm) else ''))

    def _log_skip(self, runner, iteration, outputs, loss_bad, grads_bad, scale) -> None:
        # fp16 overflows of the gradients alone are routine (the scaler probes for the largest
        # scale that fits): counted, and logged at INFO while the streak is short.
        routine = scale is not None and grads_bad and not loss_bad and 2 * self.consecutive < self.max_consecutive
        print_log(f'NonFiniteGuardHook: skipped the update of iteration {iteration} '
                  f'({self._cause(outputs, loss_bad, grads_bad, scale)}); parameters and optimizer state '
                  f'are unchanged. {self.consecutive} in a row, {self.skipped_total} in this run; the run '
                  f'stops at {self.max_consecutive} in a row.', logger='current',
                  level=logging.INFO if routine else logging.WARNING)

    def _stop(self, runner, iteration, outputs, loss_bad) -> None:
        scaler = self._scaler()
        cause = self._cause(outputs, loss_bad, not loss_bad, scaler.get_scale() if scaler else None)
        read = '' if iteration == runner.iter + 1 else f' (read at iteration {runner.iter + 1})'
        raise NonFiniteTrainingError(
            f'Training stopped at iteration {iteration}{read}: {self.consecutive} consecutive updates '
            f'(iterations {self._streak_start}-{iteration}) had a non-finite loss or gradient ({cause}). '
            f'None of them changed the weights; every checkpoint in {runner.work_dir} holds finite '
            f'weights. Lower the learning rate or check the data of these iterations, then continue '
            f'with `tools/train.py CONFIG --resume` (or raise '
            f'default_hooks.nonfinite_guard.max_consecutive).')
