"""Optimizer wrappers that drop an update whose loss or gradients are not finite.

The guard is a property of the optimizer wrapper type the config names (docs/configs.md, "Non-finite
steps are skipped"): ``vit_plugin.GuardedOptimWrapper`` for mmengine's ``OptimWrapper``,
``vit_plugin.GuardedAmpOptimWrapper`` for its ``AmpOptimWrapper``, the guarded autocast wrappers of
:mod:`vit_plugin.engine.optimizers.amp`, and ``vit_plugin.XLAOptimWrapper(nonfinite_guard=True)``
(which checks and counts on its device, :class:`DeviceCountedNonFiniteGuard`).
:class:`NonFiniteGuardMixin` holds the check between the backward pass and the optimizer step:

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
the host). ``vit_plugin.NonFiniteGuardHook`` reads the verdicts in batches, logs the skips and stops
a run after too many in a row (:mod:`vit_plugin.engine.hooks.nonfinite_reads`).

Cost on the device: one norm over the gradients (a read of every gradient, much cheaper than the
optimizer's own update) and, under fp16, an explicit unscale of the gradients (which the fused
optimizers would otherwise fold into their update).
"""
import abc
import copy
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from torch.amp.grad_scaler import OptState

from vit_plugin.compat import torch as torch_compat
from vit_plugin.engine.optimizers.grad_norm import global_grad_norm
from vit_plugin.registry import OPTIM_WRAPPERS


def _skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` honours a ``found_inf`` tensor (torch's fused Adam/AdamW/SGD)."""
    return torch_compat.step_supports_amp_scaling(optimizer) and all(
        group.get('fused') for group in optimizer.param_groups)


class NonFiniteGuardMixin:
    """The non-finite check of an optimizer wrapper class (see the module docstring).

    Put it before an mmengine ``OptimWrapper`` class in the bases: it extends ``backward`` (to see
    each loss) and ``step`` (to drop a non-finite update). ``vit_plugin.NonFiniteGuardHook`` reads
    the verdicts (:meth:`take_verdict`) and decides when the run stops.

    Args:
        check_grad_norm (bool): Also check the global gradient norm (without a loss scaler, which
            checks the gradients itself). Defaults to True.
        **kwargs: The wrapper's own arguments (``optimizer``, ``clip_grad``, ...).

    Attributes:
        last_grad_norm (torch.Tensor or None): The global gradient norm of the last update, on the
            device (None: not computed).
    """

    #: The wrapper's loss scaler; AMP wrappers set their own (None: no loss scaling).
    loss_scaler = None

    def __init__(self, *args, check_grad_norm: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.check_grad_norm = check_grad_norm
        self.last_grad_norm: Optional[torch.Tensor] = None
        self._loss_bad: Optional[torch.Tensor] = None
        # Verdict of the last update, on the device: [loss not finite, gradients not finite] as 0/1
        # floats (None: no update since it was taken).
        self._verdict_flags: Optional[torch.Tensor] = None

    @property
    def active_loss_scaler(self):
        """The enabled fp16 loss scaler, or None."""
        scaler = self.loss_scaler
        return scaler if scaler is not None and scaler.is_enabled() else None

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad
        super().backward(loss, **kwargs)

    def step(self, **kwargs) -> None:
        scaler = self.active_loss_scaler
        self._verdict_flags = self._scaled_step(scaler, kwargs) if scaler is not None else self._plain_step(kwargs)

    def take_verdict(self) -> Optional[torch.Tensor]:
        """The device verdict ``[loss not finite, gradients not finite]`` of the last update (None: no
        update happened since the last call)."""
        flags, self._verdict_flags = self._verdict_flags, None
        return flags

    def pop_skipped(self) -> Optional[bool]:
        """Whether the last update was skipped (None: no update since the last call). Reads the verdict
        on the host."""
        flags = self.take_verdict()
        return None if flags is None else bool(flags.max().item())

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

    def _plain_step(self, kwargs: dict) -> torch.Tensor:
        optimizer = self.optimizer
        grads = [p.grad for group in optimizer.param_groups for p in group['params'] if p.grad is not None]
        norm = global_grad_norm(grads) if self.check_grad_norm else None
        device = grads[0].device if grads else torch.device('cpu')
        grads_bad = ~torch.isfinite(norm) if norm is not None else torch.zeros((), dtype=torch.bool, device=device)
        self.last_grad_norm = norm
        flags = self._verdict(grads_bad)
        if _skips_on_device(optimizer):
            # The fused kernels skip parameters, moments and step count when found_inf is set (the
            # attribute is how torch's GradScaler hands them its flag, too).
            optimizer.found_inf = flags.max().to(device)
            try:
                super().step(**kwargs)
            finally:
                del optimizer.found_inf
        elif not flags.max().item():  # the host decides: one read per update
            super().step(**kwargs)
        return flags

    def _scaled_step(self, scaler, kwargs: dict) -> torch.Tensor:
        # The AMP wrappers' step (unscale to clip, clip, scaler.step, scaler.update) with the check
        # between the scaler's unscale_ (which finds inf/NaN gradients) and its step (which skips on
        # what it found): the guard adds its loss check to the scaler's flags.
        optimizer = self.optimizer
        state = torch_compat.grad_scaler_state(scaler, optimizer)
        if state['stage'] is OptState.READY:
            scaler.unscale_(optimizer)  # fills the scaler's per-device inf/NaN flags (on the device)
        found = list(state['found_inf_per_device'].values())
        self.last_grad_norm = None
        if found:
            grads_bad = torch.stack([f.to(found[0].device).reshape(()) for f in found]).max() > 0
            flags = self._verdict(grads_bad)
            bad = flags.max()
            for flag in found:  # the scaler skips, and lowers its scale, on what the guard decided
                flag.copy_(torch.maximum(flag, bad.to(flag.device)))
        else:  # no gradients at all
            self._loss_bad = None
            flags = torch.zeros(2)
        if self.clip_grad_kwargs:
            self._clip_grad()
        scaler.step(optimizer, **kwargs)
        scaler.update(self._scale_update_param)
        return flags


class DeviceCountedNonFiniteGuard(abc.ABC):
    """Interface of an optimizer wrapper that skips non-finite updates and counts them on its device
    (``vit_plugin.XLAOptimWrapper(nonfinite_guard=True)``): ``vit_plugin.NonFiniteGuardHook`` reads the
    counters when they reach the host (:meth:`nonfinite_counts`) instead of one verdict per update.

    Attributes:
        nonfinite_guard (bool): Whether the guard is on.
    """

    nonfinite_guard: bool = False

    @abc.abstractmethod
    def nonfinite_counts(self, message_hub) -> Optional[Tuple[int, int]]:
        """(updates skipped, longest streak) as last logged, or None before they reached the host."""


@OPTIM_WRAPPERS.register_module()
class GuardedOptimWrapper(NonFiniteGuardMixin, OptimWrapper):
    """mmengine's ``OptimWrapper`` that drops an update whose loss or gradients are not finite.

    Args:
        check_grad_norm (bool): Also check the global gradient norm. Defaults to True.
        **kwargs: ``optimizer``, ``accumulative_counts``, ``clip_grad`` as for ``OptimWrapper``.
    """


@OPTIM_WRAPPERS.register_module()
class GuardedAmpOptimWrapper(NonFiniteGuardMixin, AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` that drops an update whose loss or gradients are not finite.

    Args:
        check_grad_norm (bool): Also check the global gradient norm where there is no loss scaler.
            Defaults to True.
        **kwargs: ``loss_scale``, ``dtype``, ``use_fsdp``, ``optimizer``, ... as for ``AmpOptimWrapper``.
    """


#: Each optimizer wrapper type and its guarded counterpart (the XLA wrapper guards with an option).
GUARDED_TYPES: Dict[str, str] = {
    'OptimWrapper': 'vit_plugin.GuardedOptimWrapper',
    'AmpOptimWrapper': 'vit_plugin.GuardedAmpOptimWrapper',
    'AutocastOptimWrapper': 'vit_plugin.GuardedAutocastOptimWrapper',
    'CPUAmpOptimWrapper': 'vit_plugin.GuardedCPUAmpOptimWrapper',
}
#: Each guarded optimizer wrapper type and its unguarded counterpart.
UNGUARDED_TYPES: Dict[str, str] = {
    'GuardedOptimWrapper': 'OptimWrapper',
    'GuardedAmpOptimWrapper': 'AmpOptimWrapper',
    'GuardedAutocastOptimWrapper': 'vit_plugin.AutocastOptimWrapper',
    'GuardedCPUAmpOptimWrapper': 'vit_plugin.CPUAmpOptimWrapper',
}
_XLA = 'XLAOptimWrapper'


def wrapper_type_name(wrapper_type: Any) -> str:
    """The class name an ``optim_wrapper`` config's ``type`` names, without its scope (a missing type is
    mmengine's default, ``OptimWrapper``)."""
    if wrapper_type is None:
        return 'OptimWrapper'
    name = wrapper_type.__name__ if isinstance(wrapper_type, type) else str(wrapper_type)
    return name.split('.')[-1]


def _settings(guard_settings) -> Tuple[bool, Optional[bool]]:
    """(enabled, check_grad_norm or None) of a ``default_hooks.nonfinite_guard`` entry."""
    if isinstance(guard_settings, dict):
        return bool(guard_settings.get('enabled', True)), guard_settings.get('check_grad_norm')
    return bool(guard_settings.enabled), guard_settings.check_grad_norm  # a built NonFiniteGuardHook


def _one_wrapper(cfg: dict, enabled: bool, check_grad_norm: Optional[bool], key: str) -> dict:
    name = wrapper_type_name(cfg.get('type'))
    if name == _XLA:
        cfg['nonfinite_guard'] = enabled
    elif enabled and name in GUARDED_TYPES:
        cfg['type'] = GUARDED_TYPES[name]
    elif not enabled and name in UNGUARDED_TYPES:
        cfg['type'] = UNGUARDED_TYPES[name]
    elif name not in UNGUARDED_TYPES and name not in GUARDED_TYPES:
        return cfg  # no guarded counterpart: NonFiniteGuardHook says so when the run starts
    if not enabled:
        cfg.pop('check_grad_norm', None)
    elif check_grad_norm is not None:
        if cfg.get('check_grad_norm', check_grad_norm) != check_grad_norm:
            raise ValueError(f'{key}.check_grad_norm={cfg["check_grad_norm"]} and default_hooks.nonfinite_guard.'
                             f'check_grad_norm={check_grad_norm} disagree: set one of them.')
        cfg['check_grad_norm'] = check_grad_norm
    return cfg


def guarded_optim_wrapper_cfg(optim_wrapper_cfg: Optional[dict], guard_settings) -> Optional[dict]:
    """The ``optim_wrapper`` config with the non-finite guard as ``default_hooks.nonfinite_guard`` sets it.

    A pure function (the input is not changed). With the hook enabled, each wrapper type becomes its
    guarded counterpart (:data:`GUARDED_TYPES`; ``vit_plugin.XLAOptimWrapper`` gets
    ``nonfinite_guard=True``) and the hook's ``check_grad_norm``, when given, is copied to the wrapper;
    with ``enabled=False`` the guarded types become their unguarded counterparts. Without the hook
    (``guard_settings`` None) the config is returned as it is. Per-module wrappers (mmengine's
    ``MultiOptimWrapperConstructor``) are mapped one by one; other types are left as they are.

    Args:
        optim_wrapper_cfg (dict, optional): The config's ``optim_wrapper``.
        guard_settings (dict or NonFiniteGuardHook, optional): The config's
            ``default_hooks.nonfinite_guard``.

    Returns:
        dict or None: A new ``optim_wrapper`` config.

    Raises:
        ValueError: The wrapper's ``check_grad_norm`` and the hook's disagree.
    """
    cfg = copy.deepcopy(optim_wrapper_cfg)
    if cfg is None or guard_settings is None:
        return cfg
    enabled, check_grad_norm = _settings(guard_settings)
    if 'optimizer' in cfg or 'type' in cfg:
        return _one_wrapper(cfg, enabled, check_grad_norm, 'optim_wrapper')
    for key, value in cfg.items():  # one wrapper per module
        if isinstance(value, dict) and ('optimizer' in value or 'type' in value):
            cfg[key] = _one_wrapper(value, enabled, check_grad_norm, f'optim_wrapper.{key}')
    return cfg
