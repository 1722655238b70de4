"""``vit_plugin.XLAOptimWrapper``: mmengine's OptimWrapper for XLA devices.

What changes compared with mmengine's ``OptimWrapper`` (everything else -- gradient accumulation,
``optim_context``, state dicts, parameter schedulers -- is inherited unchanged):

* the update is ``xm.optimizer_step``: gradients are all-reduced (averaged) across replicas, then
  the optimizer steps; with gradient clipping the all-reduce comes first so that, as with DDP, the
  norm is that of the averaged gradient;
* the clipped gradient norm stays on the device (mmengine calls ``float()`` on it, a host transfer
  that would cut every step's graph in two); the train loop logs it with the losses;
* ``dtype='bfloat16'`` runs the forward pass under XLA autocast (matmuls and convolutions in bf16,
  reductions and softmax in fp32, weights and optimizer state stay fp32).
"""
from contextlib import contextmanager
from typing import Dict, List, Optional, Union

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper
from torch.optim import Optimizer

from vit_plugin.registry import OPTIM_WRAPPERS

from . import runtime

_DTYPES = {'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16}


@OPTIM_WRAPPERS.register_module()
class XLAOptimWrapper(OptimWrapper):
    """Optimizer wrapper for training on XLA devices (TPU, or XLA:CPU for testing).

    Args:
        optimizer (Optimizer): The optimizer, over parameters that live on the XLA device.
        accumulative_counts (int): Iterations over which gradients are accumulated before an
            update. Defaults to 1.
        clip_grad (dict, optional): ``dict(max_norm=..., norm_type=2)`` (``type='norm'``, the
            default) or ``dict(type='value', clip_value=...)``, as in mmengine. Defaults to None.
        dtype (str or torch.dtype, optional): ``'bfloat16'`` to run forward passes under XLA
            autocast in bf16; None keeps fp32. Defaults to None.
    """

    def __init__(self,
                 optimizer: Optimizer,
                 accumulative_counts: int = 1,
                 clip_grad: Optional[dict] = None,
                 dtype: Union[str, torch.dtype, None] = None):
        super().__init__(optimizer, accumulative_counts=accumulative_counts, clip_grad=clip_grad)
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(f'XLAOptimWrapper: dtype={dtype!r} is not supported; use '
                                 f"'bfloat16' (TPUs compute in bf16) or None for fp32.")
            dtype = _DTYPES[dtype]
        if dtype not in (None, torch.bfloat16):
            raise ValueError(f'XLAOptimWrapper: dtype={dtype} is not supported; use torch.bfloat16 '
                             'or None.')
        self.dtype = dtype
        self._pending_scalars: Dict[str, torch.Tensor] = {}

    def step(self, **kwargs) -> None:
        """All-reduce the gradients across replicas, clip them if configured, and update."""
        xm = runtime.require('torch_xla.core.xla_model')
        if self.clip_grad_kwargs:
            xm.reduce_gradients(self.optimizer)
            self._clip_grad()
            self.optimizer.step(**kwargs)
        else:
            xm.optimizer_step(self.optimizer, optimizer_args=kwargs)

    def _clip_grad(self) -> None:
        params: List[torch.Tensor] = [
            p for group in self.optimizer.param_groups for p in group['params']
            if p.requires_grad and p.grad is not None
        ]
        if params:
            grad = self.clip_func(params, **self.clip_grad_kwargs)
            if grad is not None:  # clip_grad_value_ returns None
                self._pending_scalars[self.grad_name] = grad.detach()

    def pop_scalars(self) -> Dict[str, torch.Tensor]:
        """Device scalars produced by the last update (the gradient norm), for deferred logging."""
        scalars, self._pending_scalars = self._pending_scalars, {}
        return scalars

    @contextmanager
    def optim_context(self, model: nn.Module):
        """Gradient-accumulation context of mmengine plus, with ``dtype``, XLA bf16 autocast."""
        with super().optim_context(model):
            if self.dtype is None:
                yield
            else:
                # torch.autocast('xla') is what torch_xla.amp.autocast enters on TPU; calling it
                # directly also autocasts on XLA:CPU, where the tests run.
                with torch.autocast('xla', dtype=self.dtype):
                    yield

    def __repr__(self):
        return super().__repr__().replace('\noptimizer:', f'\ndtype: {self.dtype}\noptimizer:', 1)
