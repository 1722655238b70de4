"""Private names of torch that vit_plugin needs; checked against torch 2.9.0 and torch 2.15.0."""
import sys
from typing import Callable, Dict, List, Optional, Set

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

__all__ = ['pytree', 'BatchNormBase', 'InstanceNormBase', 'global_grad_norm', 'version_counter',
           'inductor_freezing', 'grad_scaler_state', 'step_supports_amp_scaling', 'non_persistent_buffers',
           'dataloader_worker_pids', 'wrap_worker_signal_handlers', 'INHERITED']

# pytree: flattening nested containers of tensors. torch has no public pytree module (only
# ``torch.utils._pytree`` and ``torch.utils._cxx_pytree``); torch_xla and torch.distributed use it too.

# The base classes of every batch and instance norm (1d/2d/3d, lazy, SyncBatchNorm, and mmcv's
# ``_BatchNormXd``): a tuple of the public classes would miss subclasses defined elsewhere.
BatchNormBase = nn.modules.batchnorm._BatchNorm
InstanceNormBase = nn.modules.instancenorm._InstanceNorm


def global_grad_norm(grads: List[torch.Tensor]) -> Optional[torch.Tensor]:
    """The float32 2-norm of all gradients (None without): ``get_total_norm``, or for low-precision gradients
    ``torch._foreach_norm`` combined in float32 (the public path reduces in their dtype)."""
    if not grads:
        return None
    if all(g.dtype == torch.float32 for g in grads):
        return torch.nn.utils.get_total_norm(grads, 2.0)
    norms = torch._foreach_norm(grads)  # one fused kernel per device/dtype group
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def version_counter(tensor: torch.Tensor) -> int:
    """The tensor's version counter, bumped by every in-place write (``Tensor._version`` only)."""
    return tensor._version


def inductor_freezing():
    """Context manager: Inductor compiles with weight freezing (only ``torch._inductor.config`` switches it)."""
    from torch._inductor import config  # Inductor's modules load only where something compiles
    return config.patch(freezing=True)


def grad_scaler_state(scaler, optimizer) -> dict:
    """``GradScaler``'s per-optimizer ``'stage'`` and ``'found_inf_per_device'`` (``_per_optimizer_states``)."""
    return scaler._per_optimizer_states[id(optimizer)]


def step_supports_amp_scaling(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's ``step`` takes GradScaler's ``found_inf`` itself (``_step_supports_amp_scaling``)."""
    return bool(getattr(optimizer, '_step_supports_amp_scaling', False))


def non_persistent_buffers(module: nn.Module) -> Set[str]:
    """Names of the module's own ``persistent=False`` buffers (``_non_persistent_buffers_set`` only)."""
    return set(module._non_persistent_buffers_set)


def dataloader_worker_pids(iterator) -> List[int]:
    """The process ids of a multi-process DataLoader iterator's live workers (``_workers``)."""
    return [w.pid for w in iterator._workers]


_SIGNAL_HANDLING = 'torch.utils.data._utils.signal_handling'


def wrap_worker_signal_handlers(after: Callable[[], None]) -> bool:
    """Run ``after`` in each DataLoader worker after torch's signal handlers, by replacing the private
    ``_set_worker_signal_handlers`` here (False without torch's data loading); for ``vit_plugin.runtime``."""
    handling = sys.modules.get(_SIGNAL_HANDLING)
    if handling is None:
        return False
    install = handling._set_worker_signal_handlers

    def install_then(*args, **kwargs):
        install(*args, **kwargs)
        after()

    handling._set_worker_signal_handlers = install_then
    return True


#: Private members of torch classes that our subclasses override or read (none).
INHERITED: Dict[str, object] = {}
