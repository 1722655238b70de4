"""bf16 mixed precision on every backend: one option, the right optimizer wrapper per device.

* GPU: mmengine's ``AmpOptimWrapper`` with ``dtype='bfloat16'`` and a static loss scale of 1 (bf16
  has fp32's exponent range, so no scaling is needed; the scaler then only skips steps with inf
  gradients). CUDA's autocast policy already keeps LayerNorm, softmax and the losses in fp32.
* CPU: :class:`CPUAmpOptimWrapper` (mmengine's AMP wrapper refuses to build without an
  accelerator): ``torch.autocast('cpu', bfloat16)`` plus :class:`Fp32Policy`, because CPU autocast
  runs softmax and LayerNorm in bf16 when their input is bf16 (the fused attention kernel keeps
  its softmax in fp32 internally; attention that falls back to an explicit softmax -- trainable
  relative position bias, attention dropout -- runs in fp32).
* XLA: ``vit_plugin.XLAOptimWrapper(dtype='bfloat16')`` (XLA autocast), as before.

Weights, gradients and optimizer state stay fp32 in all three.
"""
from contextlib import contextmanager
from typing import Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.optim import OptimWrapper
from torch.overrides import TorchFunctionMode

from vit_plugin.registry import OPTIM_WRAPPERS

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
    """Run softmax, LayerNorm/GroupNorm and the common losses on fp32 inputs under autocast.

    CPU autocast has no fp32 list for these ops; this mode extends its policy to match CUDA's. The
    ops are not in CPU autocast's lower-precision list, so fp32 inputs keep them in fp32.
    """

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
    """Whether CPU SDPA will decompose into an explicit softmax (instead of its fused kernel, which
    accumulates in fp32): with a bias that needs a gradient (relative position tables) or dropout."""
    mask = kwargs.get('attn_mask', args[3] if len(args) > 3 else None)
    dropout = kwargs.get('dropout_p', args[4] if len(args) > 4 else 0.)
    return dropout > 0 or (isinstance(mask, torch.Tensor) and mask.requires_grad)


_DTYPES = {'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16}


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """mmengine's ``OptimWrapper`` with bf16 autocast on CPU (LayerNorm, softmax, loss in fp32).

    Args:
        dtype (str or torch.dtype): Only ``'bfloat16'``: CPU autocast has no fp16 policy worth
            training with, and bf16 needs no loss scaling. Defaults to ``'bfloat16'``.
        **kwargs: ``optimizer``, ``accumulative_counts``, ``clip_grad`` as for ``OptimWrapper``.
    """

    def __init__(self, dtype: Union[str, torch.dtype] = 'bfloat16', **kwargs):
        super().__init__(**kwargs)
        if isinstance(dtype, str):
            dtype = _DTYPES.get(dtype.replace('torch.', ''), dtype)
        if dtype is not torch.bfloat16:
            raise ValueError(f'CPUAmpOptimWrapper: dtype={dtype!r} is not supported; CPU mixed '
                             "precision trains in 'bfloat16' (optim_wrapper.dtype in the config).")
        self.cast_dtype = dtype

    @contextmanager
    def optim_context(self, model: nn.Module):
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype), Fp32Policy():
            yield


def use_mixed_precision(optim_wrapper: dict, precision: str, device: str) -> dict:
    """Rewrite an ``optim_wrapper`` config for mixed precision on ``device``.

    Args:
        optim_wrapper (dict): The config's ``optim_wrapper`` (changed in place).
        precision (str): ``'bf16'`` or ``'fp16'`` (fp16 with dynamic loss scaling, GPU only).
        device (str): ``'cuda'``, ``'cpu'`` or ``'xla'``.

    Returns:
        dict: ``optim_wrapper``.
    """
    if precision not in ('bf16', 'fp16'):
        raise ValueError(f"mixed precision must be 'bf16' or 'fp16', got {precision!r}.")
    wrapper_type = optim_wrapper.get('type', 'OptimWrapper')
    if str(wrapper_type).split('.')[-1] not in ('OptimWrapper', 'AmpOptimWrapper', 'CPUAmpOptimWrapper'):
        raise ValueError(f'optim_wrapper.type={wrapper_type!r}: mixed precision replaces the optimizer '
                         'wrapper and knows only OptimWrapper / AmpOptimWrapper configs.')
    if precision == 'fp16' and device != 'cuda':
        raise ValueError(f'fp16 mixed precision needs a GPU (dynamic loss scaling); on {device} use '
                         'bf16 (`--amp bf16`).')
    if device == 'cuda':
        optim_wrapper['type'] = 'AmpOptimWrapper'
        if precision == 'bf16':
            optim_wrapper['dtype'] = 'bfloat16'
            optim_wrapper['loss_scale'] = 1.0  # bf16 has fp32's range: no scaling
        else:
            optim_wrapper.setdefault('loss_scale', 'dynamic')
    elif device == 'xla':
        # vit_plugin.xla.to_xla_config turns this into XLAOptimWrapper with XLA autocast.
        optim_wrapper['type'] = 'AmpOptimWrapper'
        optim_wrapper['dtype'] = 'bfloat16'
    elif device == 'cpu':
        optim_wrapper['type'] = 'vit_plugin.CPUAmpOptimWrapper'
        optim_wrapper['dtype'] = 'bfloat16'
        optim_wrapper.pop('loss_scale', None)
    else:
        raise ValueError(f"device must be 'cuda', 'cpu' or 'xla', got {device!r}.")
    return optim_wrapper
