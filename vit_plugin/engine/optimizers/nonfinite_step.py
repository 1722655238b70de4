"""Optimizer wrappers that drop a non-finite update unapplied (docs/configs.md#training-and-testing)."""
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
    """The non-finite check of an optimizer wrapper; put it before the ``OptimWrapper`` class in the bases.

    Args:
        check_grad_norm (bool): Also check the global gradient norm (a loss scaler checks the
            gradients itself). Defaults to True.
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
        """The device verdict ``[loss not finite, gradients not finite]`` of the last update, or None."""
        flags, self._verdict_flags = self._verdict_flags, None
        return flags

    def pop_skipped(self) -> Optional[bool]:
        """Whether the last update was skipped (None: no update since the last call); a host read."""
        flags = self.take_verdict()
        return None if flags is None else bool(flags.max().item())

    def _verdict(self, grads_bad: torch.Tensor) -> torch.Tensor:
        """[loss bad, gradients bad] of this update, common to all ranks (on the device)."""
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
    """Interface of a wrapper that skips non-finite updates and counts them on its device (XLA)."""

    nonfinite_guard: bool = False

    @abc.abstractmethod
    def nonfinite_counts(self, message_hub) -> Optional[Tuple[int, int]]:
        """(updates skipped, longest streak) as last logged, or None before they reached the host."""


@OPTIM_WRAPPERS.register_module()
class GuardedOptimWrapper(NonFiniteGuardMixin, OptimWrapper):
    """mmengine's ``OptimWrapper`` that drops an update whose loss or gradients are not finite.

    Args:
        check_grad_norm (bool): Also check the global gradient norm. Defaults to True.
    """


@OPTIM_WRAPPERS.register_module()
class GuardedAmpOptimWrapper(NonFiniteGuardMixin, AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` that drops an update whose loss or gradients are not finite.

    Args:
        check_grad_norm (bool): Also check the gradient norm without a loss scaler. Defaults to True.
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
    """The unscoped class name an ``optim_wrapper`` config's ``type`` names (None: ``'OptimWrapper'``)."""
    if wrapper_type is None:
        return 'OptimWrapper'
    name = wrapper_type.__name__ if isinstance(wrapper_type, type) else str(wrapper_type)
    return name.split('.')[-1]


def _settings(guard_settings) -> Tuple[bool, Optional[bool]]:
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
    """A copy of ``optim_wrapper_cfg`` guarded as ``guard_settings`` (``default_hooks.nonfinite_guard``) says.

    Each type becomes its guarded counterpart (:data:`GUARDED_TYPES`), or with ``enabled=False`` its
    unguarded one; unknown types and a None hook leave it unchanged. Raises ValueError when the wrapper's
    ``check_grad_norm`` and the hook's disagree.
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
