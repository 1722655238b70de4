"""The non-finite check on one optimizer wrapper: an update whose loss or gradients are not finite
changes nothing.

:class:`NonFiniteGuard` sits between the backward pass and the optimizer step of a wrapper
(``vit_plugin.NonFiniteGuardHook`` installs one per wrapper):

* every backward pass records whether its loss is finite; before the update, the global gradient
  norm (all parameters, after the DDP all-reduce) is checked as well -- or, under fp16 loss
  scaling, the scaler's own inf/NaN check of the gradients is used;
* a non-finite update is dropped *before* it changes anything: parameters, optimizer state (AdamW
  moments and step count) and loss scaler are left as they were (the scaler lowers its scale, as it
  does for every overflow), and the gradients are zeroed as after any update;
* under DDP/FSDP the verdict is all-reduced (one two-element tensor per update), so all ranks skip
  the same update and stay in lock-step;
* with gradient accumulation the check covers all micro-batches of the update.

No host synchronisation per update where the optimizer allows it: the verdict stays a device tensor,
and torch's fused Adam/AdamW/SGD (the CUDA default of ``tools/train.py``) take a ``found_inf``
tensor and leave parameters and state untouched when it is set, as they do for the fp16 scaler.
Optimizers without a fused kernel (foreach/for-loop AdamW, LAMB, LARS...) need the verdict on the
host before they step: one device-to-host read per update there (free on a CPU, where the device is
the host). The verdicts are read in batches by the hook (:mod:`vit_plugin.engine.hooks.nonfinite_reads`).

Cost on the device: one norm over the gradients (a read of every gradient, much cheaper than the
optimizer's own update) and, under fp16, an explicit unscale of the gradients (which the fused
optimizers would otherwise fold into their update).
"""
from contextlib import contextmanager
from typing import List, Optional

import torch
import torch.distributed as dist
from mmengine.optim import OptimWrapper

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.compat import torch as torch_compat
from vit_plugin.engine.optimizers.grad_norm import global_grad_norm


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
    # lowers the scale when any is set. (Stable since torch 1.6; the guard's tests run the real
    # GradScaler.)
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
    """The per-update check installed on one optimizer wrapper (see the module docstring).

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
