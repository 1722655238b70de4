"""``vit_plugin.XLAOptimWrapper``: mmengine's OptimWrapper for XLA devices (docs/scaling.md#tpus-with-torch_xla)."""
from contextlib import contextmanager
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper
from torch.optim import Optimizer

from vit_plugin.engine.optimizers.grad_norm import global_grad_norm
from vit_plugin.engine.optimizers.nonfinite_step import DeviceCountedNonFiniteGuard
from vit_plugin.registry import OPTIM_WRAPPERS

from . import runtime

_DTYPES = {'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16}

#: Names of the guard's counters among the scalars of :meth:`XLAOptimWrapper.pop_scalars`.
SKIPPED, LONGEST_STREAK = 'nonfinite_skipped', 'nonfinite_max_streak'


def _upload(tensor: torch.Tensor, device) -> torch.Tensor:
    """Copy to the device as device data (a 0-dim ``.to`` would become a graph constant)."""
    xm = runtime.require('torch_xla.core.xla_model')
    return xm.send_cpu_data_to_device([tensor], device)[0]


@OPTIM_WRAPPERS.register_module()
class XLAOptimWrapper(DeviceCountedNonFiniteGuard, OptimWrapper):
    """Optimizer wrapper for training on XLA devices (TPU, or XLA:CPU for testing).

    Args:
        optimizer (Optimizer): The optimizer, over parameters on the XLA device.
        accumulative_counts (int): Iterations accumulated per update. Defaults to 1.
        clip_grad (dict, optional): As in mmengine (``max_norm``/``norm_type`` or ``type='value'``).
        dtype (str or torch.dtype, optional): ``'bfloat16'`` for bf16 autocast; None keeps fp32.
        nonfinite_guard (bool): Drop a non-finite update on the device. Defaults to False.
        check_grad_norm (bool): With the guard, also check the global gradient norm. Defaults to True.
    """

    def __init__(self,
                 optimizer: Optimizer,
                 accumulative_counts: int = 1,
                 clip_grad: Optional[dict] = None,
                 dtype: Union[str, torch.dtype, None] = None,
                 nonfinite_guard: bool = False,
                 check_grad_norm: bool = True):
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
        self.nonfinite_guard = bool(nonfinite_guard)
        self.check_grad_norm = check_grad_norm
        self._guard: Optional[Dict[str, torch.Tensor]] = None
        self._capturable_cfg: List[Optional[bool]] = []
        self._loss_bad: Optional[torch.Tensor] = None
        if self.nonfinite_guard:
            self._start_guard()

    def _start_guard(self) -> None:
        # The stop after too many bad steps happens at the next logging interval, when the counters
        # reach the host, so up to that many further skipped iterations may run first.
        self._capturable_cfg = [group.get('capturable') for group in self.optimizer.param_groups]
        device = self.optimizer.param_groups[0]['params'][0].device
        # Counters uploaded as device data (not created by an op): every step's graph then has
        # the same inputs, including the first after a resume.
        self._guard = {key: _upload(torch.zeros(()), device) for key in ('streak', 'skipped', 'worst')}
        self._make_capturable()

    def _make_capturable(self) -> None:
        # Adam(W) then keeps its step count on the device, where the select can reach it; a state
        # loaded from a checkpoint has its step counts on the host.
        for group in self.optimizer.param_groups:
            if 'capturable' not in group:
                continue
            group['capturable'] = True
            for p in group['params']:
                step = self.optimizer.state.get(p, {}).get('step')
                if isinstance(step, torch.Tensor) and step.device != p.device:
                    self.optimizer.state[p]['step'] = _upload(step, p.device)

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self._guard is not None:
            # Checkpoints keep the configured flag: they may be resumed on a CPU or GPU.
            for group, flag in zip(state['param_groups'], self._capturable_cfg):
                if flag is not None:
                    group['capturable'] = flag
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        if self._guard is not None:
            self._make_capturable()

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        if self._guard is not None:
            bad = ~torch.isfinite(loss.detach()).all()
            self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad
        super().backward(loss, **kwargs)

    def step(self, **kwargs) -> None:
        """All-reduce the gradients across replicas, clip them if configured, and update."""
        xm = runtime.require('torch_xla.core.xla_model')
        if self._guard is not None:
            self._guarded_step(xm, kwargs)
        elif self.clip_grad_kwargs:
            xm.reduce_gradients(self.optimizer)
            self._clip_grad()
            self.optimizer.step(**kwargs)
        else:
            xm.optimizer_step(self.optimizer, optimizer_args=kwargs)

    def _guarded_step(self, xm, kwargs: dict) -> None:
        xm.reduce_gradients(self.optimizer)
        params = [p for group in self.optimizer.param_groups for p in group['params']]
        norm = global_grad_norm([p.grad for p in params if p.grad is not None]) if self.check_grad_norm else None
        ok = torch.ones((), dtype=torch.bool, device=params[0].device)
        if norm is not None:
            ok = ok & torch.isfinite(norm)
        if self._loss_bad is not None:
            ok = ok & ~self._loss_bad
        self._loss_bad = None
        old_params = [p.detach().clone() for p in params]
        old_state = {id(p): {k: v.detach().clone() for k, v in self.optimizer.state[p].items()
                             if isinstance(v, torch.Tensor) and v.device == p.device}
                     for p in params if p in self.optimizer.state}
        if self.clip_grad_kwargs:
            self._clip_grad()
        self.optimizer.step(**kwargs)
        with torch.no_grad():
            for p, old in zip(params, old_params):
                p.copy_(torch.where(ok, p, old))
                state = self.optimizer.state.get(p, {})
                before = old_state.get(id(p), {})
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.device == p.device:
                        # State created by this very step (the first update) falls back to zeros,
                        # what the optimizer initialises it with.
                        value.copy_(torch.where(ok, value, before.get(key, torch.zeros_like(value))))
        bad = (~ok).to(torch.float32)
        streak = (self._guard['streak'] + 1) * bad
        self._guard['streak'] = streak
        self._guard['skipped'] = self._guard['skipped'] + bad
        self._guard['worst'] = torch.maximum(self._guard['worst'], streak)
        # Logged with the losses; the hook reads them on the host when they arrive.
        self._pending_scalars.update({SKIPPED: self._guard['skipped'], LONGEST_STREAK: self._guard['worst']})

    def nonfinite_counts(self, message_hub) -> Optional[Tuple[int, int]]:
        """(updates skipped, longest streak) as last logged, or None before the first log."""
        scalars = message_hub.log_scalars
        if f'train/{LONGEST_STREAK}' not in scalars:
            return None
        return int(scalars[f'train/{SKIPPED}'].current()), int(scalars[f'train/{LONGEST_STREAK}'].current())

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
