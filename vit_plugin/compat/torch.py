"""Private names of torch that vit_plugin needs.

Checked against torch 2.9.0 and torch 2.15.0 (the same code at every access below).
"""
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
    """The 2-norm of all gradients together, in float32, or None without gradients.

    float32 gradients go through the public ``torch.nn.utils.get_total_norm``: one fused
    ``_foreach_norm`` per device and dtype where the device supports it, the per-tensor norms of
    ``DTensor`` shards staying partial ``DTensor`` (their ``full_tensor()`` combines the processes).
    It reduces the per-tensor norms in the gradients' dtype, which for bfloat16/float16 gradients loses
    precision and returns a low-precision norm, so those use ``torch._foreach_norm`` directly and
    combine the per-tensor norms in float32.
    """
    if not grads:
        return None
    if all(g.dtype == torch.float32 for g in grads):
        return torch.nn.utils.get_total_norm(grads, 2.0)
    norms = torch._foreach_norm(grads)  # one fused kernel per device/dtype group
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def version_counter(tensor: torch.Tensor) -> int:
    """The tensor's version counter, which every in-place write (``copy_``, an optimizer step) bumps.

    torch exposes it as ``Tensor._version`` only; autograd uses it to detect the same writes.
    """
    return tensor._version


def inductor_freezing():
    """A context manager under which Inductor compiles with weight freezing.

    Freezing is read from Inductor's global config (``torch._inductor.config``) while a graph
    compiles; ``torch.compile(options={'freezing': True})`` compiles without it (no pre-packed GEMMs
    in the profile), so the config is the only switch that works.
    """
    from torch._inductor import config  # Inductor's modules load only where something compiles
    return config.patch(freezing=True)


def grad_scaler_state(scaler, optimizer) -> dict:
    """``torch.amp.GradScaler``'s per-optimizer state: the stage of the iteration (READY, UNSCALED,
    STEPPED) under ``'stage'`` and the per-device inf/NaN flags ``unscale_`` found under
    ``'found_inf_per_device'``.

    ``step`` skips and ``update`` lowers the scale on those flags; the scaler keeps them in
    ``_per_optimizer_states`` and offers no accessor.
    """
    return scaler._per_optimizer_states[id(optimizer)]


def step_supports_amp_scaling(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's ``step`` takes GradScaler's ``found_inf``/``grad_scale`` itself (torch's
    fused Adam/AdamW/SGD set ``_step_supports_amp_scaling``; GradScaler reads the same attribute)."""
    return bool(getattr(optimizer, '_step_supports_amp_scaling', False))


def non_persistent_buffers(module: nn.Module) -> Set[str]:
    """Names of the module's own buffers registered with ``persistent=False``.

    ``nn.Module`` records them in ``_non_persistent_buffers_set`` only; reading them off
    ``state_dict`` instead would build a state dict per module (for FSDP2, through its hooks).
    """
    return set(module._non_persistent_buffers_set)


def dataloader_worker_pids(iterator) -> List[int]:
    """The process ids of a multi-process DataLoader iterator's live workers (``_workers``)."""
    return [w.pid for w in iterator._workers]


_SIGNAL_HANDLING = 'torch.utils.data._utils.signal_handling'


def wrap_worker_signal_handlers(after: Callable[[], None]) -> bool:
    """Run ``after`` in each DataLoader worker right after torch installed its signal handlers.

    torch's worker loop calls ``torch.utils.data._utils.signal_handling._set_worker_signal_handlers``
    first thing; replacing that function in the current process (a forked child of the training
    process) is the only way to act after it. Returns False when torch's data loading is not
    imported (nothing to wrap). Called only from ``vit_plugin.runtime``, in a forked child.
    """
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
