"""Mixed precision: each device's optimizer wrapper, and ``--amp`` (docs/configs.md#training-and-testing)."""
from contextlib import contextmanager
from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.optim import OptimWrapper
from torch.overrides import TorchFunctionMode

from vit_plugin.registry import OPTIM_WRAPPERS

from .nonfinite_step import GUARDED_TYPES, UNGUARDED_TYPES, NonFiniteGuardMixin, wrapper_type_name

# Numerically sensitive ops that must see fp32 inputs: normalisation statistics, the softmax's
# exponentials/normaliser and the losses' log-sum-exp lose most of their accuracy in bf16's 8 bits.
_FP32_FUNCS = {
    F.softmax, F.log_softmax, F.layer_norm, F.group_norm, F.cross_entropy, F.nll_loss,
    F.binary_cross_entropy_with_logits, F.mse_loss, F.l1_loss, F.smooth_l1_loss,
    torch.Tensor.softmax, torch.Tensor.log_softmax, torch.softmax, torch.log_softmax,
    torch.layer_norm,
}
_LOW = (torch.bfloat16, torch.float16)


def _upcast(value):
    if isinstance(value, torch.Tensor) and value.dtype in _LOW:
        return value.float()
    if isinstance(value, (list, tuple)):
        return type(value)(_upcast(v) for v in value)
    return value


class Fp32Policy(TorchFunctionMode):
    """Under CPU autocast, run softmax, norms and the common losses on fp32 inputs, as CUDA's policy does."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FP32_FUNCS:
            args = _upcast(args)
            kwargs = {k: _upcast(v) for k, v in kwargs.items()}
        elif func is F.scaled_dot_product_attention and _explicit_softmax(args, kwargs):
            # SDPA is on autocast's bf16 list: upcasting alone would be undone.
            with torch.autocast('cpu', enabled=False):
                return func(*_upcast(args), **{k: _upcast(v) for k, v in kwargs.items()})
        return func(*args, **kwargs)


def _explicit_softmax(args, kwargs) -> bool:
    mask = kwargs.get('attn_mask', args[3] if len(args) > 3 else None)
    dropout = kwargs.get('dropout_p', args[4] if len(args) > 4 else 0.)
    return dropout > 0 or (isinstance(mask, torch.Tensor) and mask.requires_grad)


_DTYPES = {'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16, 'float16': torch.float16,
           'fp16': torch.float16, 'half': torch.float16}


def _as_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).replace('torch.', '')
    if name not in _DTYPES:
        raise ValueError(f"mixed precision dtype={dtype!r} is not supported; use 'bfloat16' or 'float16' "
                         f'(optim_wrapper.dtype in the config).')
    return _DTYPES[name]


def cuda_bf16_native(device: Optional[int] = None) -> bool:
    """Whether the GPU computes bf16 natively (compute capability >= 8.0, or any ROCm GPU), not emulated."""
    if not torch.cuda.is_available():
        return False
    if torch.version.hip:
        return True
    index = torch.cuda.current_device() if device is None else device
    return torch.cuda.get_device_capability(index) >= (8, 0)


def _gpu_name(device: Optional[int] = None) -> str:
    index = torch.cuda.current_device() if device is None else device
    major, minor = torch.cuda.get_device_capability(index)
    return f'{torch.cuda.get_device_name(index)} (compute capability {major}.{minor})'


def check_bf16_device(device_type: str) -> None:
    """Refuse bf16 autocast on a GPU without native bf16, naming the GPU and the alternative."""
    if device_type == 'cuda' and torch.cuda.is_available() and not cuda_bf16_native():
        raise ValueError(f'bf16 mixed precision needs a GPU with native bf16 (compute capability 8.0 or '
                         f'newer, e.g. A100, H100, L4); {_gpu_name()} has none and would emulate it '
                         f'slowly. Use fp16 with loss scaling (`--amp fp16`, or `--amp`, which picks it on '
                         f'this GPU), or fp32 (no `--amp`).')


def _param_device_type(optimizer: torch.optim.Optimizer) -> str:
    for group in optimizer.param_groups:
        for p in group['params']:
            return p.device.type
    return 'cpu'


@OPTIM_WRAPPERS.register_module()
class AutocastOptimWrapper(OptimWrapper):
    """mmengine's ``OptimWrapper`` with autocast to bf16 or fp16, and a loss scaler for fp16 only.

    Args:
        dtype (str or torch.dtype): ``'bfloat16'`` or ``'float16'``. Defaults to ``'bfloat16'``.
        loss_scale (str, float or dict, optional): fp16 only: ``'dynamic'`` (default), a fixed scale, or
            ``torch.amp.GradScaler`` keyword arguments, as in ``AmpOptimWrapper``. Defaults to None.
        device_type (str, optional): ``'cuda'`` or ``'cpu'``. Defaults to the parameters' device.
        **kwargs: ``optimizer``, ``accumulative_counts``, ``clip_grad`` as for ``OptimWrapper``.
    """

    def __init__(self, dtype: Union[str, torch.dtype] = 'bfloat16', loss_scale=None,
                 device_type: Optional[str] = None, **kwargs):
        super().__init__(**kwargs)
        self.cast_dtype = _as_dtype(dtype)
        self.device_type = device_type or _param_device_type(self.optimizer)
        if self.device_type not in ('cuda', 'cpu'):
            raise ValueError(f'AutocastOptimWrapper: device_type={self.device_type!r}; it autocasts on '
                             "'cuda' or 'cpu' (XLA: vit_plugin.XLAOptimWrapper).")
        self._scale_update_param = None
        self.loss_scaler = None
        if self.cast_dtype is torch.bfloat16:
            if loss_scale is not None:
                raise ValueError(f'AutocastOptimWrapper: loss_scale={loss_scale!r} with bfloat16; bf16 has '
                                 "fp32's range and trains without loss scaling: drop optim_wrapper.loss_scale.")
            check_bf16_device(self.device_type)
        else:
            loss_scale = 'dynamic' if loss_scale is None else loss_scale
            if loss_scale == 'dynamic':
                self.loss_scaler = torch.amp.GradScaler(self.device_type)
            elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
                self._scale_update_param = float(loss_scale)
                self.loss_scaler = torch.amp.GradScaler(self.device_type, init_scale=float(loss_scale))
            elif isinstance(loss_scale, dict):
                self.loss_scaler = torch.amp.GradScaler(self.device_type, **loss_scale)
            else:
                raise TypeError(f"AutocastOptimWrapper: loss_scale must be 'dynamic', a number or a dict of "
                                f'GradScaler arguments, got {loss_scale!r}.')

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        if self.loss_scaler is not None:
            loss = self.loss_scaler.scale(loss)
        loss.backward(**kwargs)
        self._inner_count += 1

    def step(self, **kwargs) -> None:
        if self.loss_scaler is None:
            super().step(**kwargs)
            return
        if self.clip_grad_kwargs:
            self.loss_scaler.unscale_(self.optimizer)  # clip the true gradients
            self._clip_grad()
        self.loss_scaler.step(self.optimizer, **kwargs)
        self.loss_scaler.update(self._scale_update_param)

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.loss_scaler is not None:
            state['loss_scaler'] = self.loss_scaler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        scaler_state = state_dict.pop('loss_scaler', None)
        if scaler_state is not None and self.loss_scaler is not None:
            self.loss_scaler.load_state_dict(scaler_state)
        super().load_state_dict(state_dict)

    @contextmanager
    def optim_context(self, model: nn.Module):
        with super().optim_context(model), torch.autocast(self.device_type, dtype=self.cast_dtype):
            if self.device_type == 'cpu':
                with Fp32Policy():
                    yield
            else:
                yield

    def __repr__(self):
        scaler = 'dynamic loss scaling' if self.loss_scaler is not None else 'no loss scaling'
        return super().__repr__().replace(
            '\noptimizer:', f'\nautocast: {self.device_type} {self.cast_dtype}, {scaler}\noptimizer:', 1)


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(AutocastOptimWrapper):
    """:class:`AutocastOptimWrapper` on the CPU in bf16 (LayerNorm, softmax, losses in fp32).

    Args:
        dtype (str or torch.dtype): Only ``'bfloat16'``. Defaults to ``'bfloat16'``.
        **kwargs: As for ``OptimWrapper``.
    """

    def __init__(self, dtype: Union[str, torch.dtype] = 'bfloat16', **kwargs):
        kwargs.pop('device_type', None)
        if _DTYPES.get(str(dtype).replace('torch.', ''), dtype) is not torch.bfloat16:
            raise ValueError(f'CPUAmpOptimWrapper: dtype={dtype!r} is not supported; CPU mixed '
                             "precision trains in 'bfloat16' (optim_wrapper.dtype in the config).")
        super().__init__(dtype=dtype, device_type='cpu', **kwargs)


@OPTIM_WRAPPERS.register_module()
class GuardedAutocastOptimWrapper(NonFiniteGuardMixin, AutocastOptimWrapper):
    """:class:`AutocastOptimWrapper` that drops an update whose loss or gradients are not finite.

    Args:
        check_grad_norm (bool): Also check the gradient norm without a loss scaler. Defaults to True.
    """


@OPTIM_WRAPPERS.register_module()
class GuardedCPUAmpOptimWrapper(NonFiniteGuardMixin, CPUAmpOptimWrapper):
    """:class:`CPUAmpOptimWrapper` that drops an update whose loss or gradients are not finite.

    Args:
        check_grad_norm (bool): Also check the global gradient norm. Defaults to True.
    """


def resolve_precision(requested: str, device: str) -> Tuple[str, str]:
    """``('bf16' | 'fp16', log sentence)``: what ``--amp [requested]`` (``'auto'``, ``'bf16'``, ``'fp16'``)
    trains in on ``device``. Raises ValueError for bf16 on a GPU without it, or fp16 off a GPU.
    """
    if requested not in ('auto', 'bf16', 'fp16'):
        raise ValueError(f"mixed precision must be 'auto', 'bf16' or 'fp16', got {requested!r}.")
    if device == 'cuda':
        native = cuda_bf16_native()
        if requested == 'auto':
            if native:
                return 'bf16', f'--amp: bf16 without loss scaling ({_gpu_name()} computes bf16 natively)'
            return 'fp16', (f'--amp: fp16 with dynamic loss scaling ({_gpu_name()} has no native bf16; '
                            f'bf16 needs compute capability 8.0 or newer)')
        if requested == 'bf16':
            check_bf16_device('cuda')
            return 'bf16', '--amp bf16: bf16 without loss scaling'
        return 'fp16', '--amp fp16: fp16 with dynamic loss scaling'
    if requested == 'fp16':
        raise ValueError(f'fp16 mixed precision needs a GPU (dynamic loss scaling); on {device} use bf16 '
                         '(`--amp bf16`).')
    return 'bf16', f'--amp: bf16 autocast on {device}'


def use_mixed_precision(optim_wrapper: dict, precision: str, device: str) -> dict:
    """Rewrite ``optim_wrapper`` in place (and return it) for ``precision`` on ``device``; guarded stays
    guarded. Raises ValueError for an unknown precision, device or wrapper type, or fp16 off a GPU.
    """
    if precision not in ('bf16', 'fp16'):
        raise ValueError(f"mixed precision must be 'bf16' or 'fp16', got {precision!r}.")
    wrapper_type = optim_wrapper.get('type', 'OptimWrapper')
    name = wrapper_type_name(wrapper_type)
    if name not in GUARDED_TYPES and name not in UNGUARDED_TYPES:
        raise ValueError(f'optim_wrapper.type={wrapper_type!r}: mixed precision replaces the optimizer '
                         'wrapper and knows only OptimWrapper / AmpOptimWrapper configs (or their '
                         'vit_plugin.Guarded* variants).')
    if precision == 'fp16' and device != 'cuda':
        raise ValueError(f'fp16 mixed precision needs a GPU (dynamic loss scaling); on {device} use '
                         'bf16 (`--amp bf16`).')
    guarded = 'Guarded' if name in UNGUARDED_TYPES else ''  # the non-finite guard stays as the config chose
    if device == 'cuda':
        optim_wrapper['type'] = f'vit_plugin.{guarded}AutocastOptimWrapper'
        optim_wrapper.pop('use_fsdp', None)  # an mmengine AmpOptimWrapper option
        if precision == 'bf16':
            optim_wrapper['dtype'] = 'bfloat16'
            optim_wrapper.pop('loss_scale', None)  # bf16 has fp32's range: no scaling
        else:
            optim_wrapper['dtype'] = 'float16'
            optim_wrapper.setdefault('loss_scale', 'dynamic')
    elif device == 'xla':
        # vit_plugin.xla.xla_optim_wrapper_cfg turns this into XLAOptimWrapper with XLA autocast.
        optim_wrapper['type'] = 'vit_plugin.GuardedAmpOptimWrapper' if guarded else 'AmpOptimWrapper'
        optim_wrapper['dtype'] = 'bfloat16'
    elif device == 'cpu':
        optim_wrapper['type'] = f'vit_plugin.{guarded}CPUAmpOptimWrapper'
        optim_wrapper['dtype'] = 'bfloat16'
        optim_wrapper.pop('loss_scale', None)
    else:
        raise ValueError(f"device must be 'cuda', 'cpu' or 'xla', got {device!r}.")
    return optim_wrapper
